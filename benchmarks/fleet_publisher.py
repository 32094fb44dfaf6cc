"""Publish a simulated fleet to the input topic as a collector would: in real time, event time =
wall time. A process of its own, started by ``benchmarks/detection.py`` (no Spark imported here:
a Python that imports PySpark's modules in a spawned child can exit before running anything).

Usage: ``python benchmarks/fleet_publisher.py TARGET.json JOBS MINUTES [AGED_MINUTES CATCH_UP_S]``
(TARGET: the broker, its client options and the topic, as :func:`target` writes them): simulates
the fleet, moves it to start a few seconds from now (``ts`` and ``trigger_ts`` are the input
contract's only instants), prints ``ready <first event time> <events> <backlog events>`` and
publishes it paced by the wall clock.

With ``AGED_MINUTES``, the jobs have already run that long when the real-time part starts: their
history is published first, at once, as a backlog that ends now (:func:`aged_split`), and the
real-time part starts ``CATCH_UP_S`` later, for the job under test to catch up in between (every
Flink job is silent for that long). So what is measured in real time is a fleet of aged jobs,
their windows full, not one whose every job starts at age zero.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines import simulator  # noqa: E402
from pipelines.contracts import input_event_key  # noqa: E402
from pipelines.io import kafka_clients  # noqa: E402

MINUTE = 60_000


def encoded(events) -> list[tuple[int, bytes, bytes]]:
    """Events as records (event time, key, value), in event-time order."""
    records = [(e["ts"], input_event_key(e), json.dumps(e, separators=(",", ":")).encode()) for e in events]
    records.sort(key=lambda r: r[0])
    return records


def target(cfg) -> dict:
    """Where :func:`publish` sends ``cfg``'s input."""
    return {"servers": cfg.kafka.bootstrap_servers, "client": cfg.kafka.client_kwargs(), "topic": cfg.topics.input}


# Paced publishing sends what is due every this many seconds, in one request, as a collector sends a
# poll's events together. A send and flush per event time (a millisecond apart) would take the
# publisher's and the broker's CPU from the two cores the job under test runs on.
PACE_S = 0.1


def publish(to: dict, records, pace: bool = False) -> int:
    """Send ``records`` to the :func:`target` ``to``; paced, each when the wall clock reaches its
    event time (or up to :data:`PACE_S` later, with the others due by then)."""
    producer = kafka_clients.make_producer(to["servers"], to["client"], linger_ms=20, batch_size=256 * 1024)
    sent = 0
    for ts, key, value in records:
        if pace:
            wait = ts / 1000.0 - time.time()
            if wait > 0:
                producer.flush()
                time.sleep(max(wait, PACE_S))
        producer.send(to["topic"], key=key, value=value)
        sent += 1
    producer.flush()
    producer.close()
    return sent


def shifted(events, shift_ms: int) -> None:
    """Move ``events`` by ``shift_ms`` of event time."""
    for event in events:
        event["ts"] += shift_ms
        if event.get("trigger_ts") is not None:
            event["trigger_ts"] += shift_ms


# In an aged fleet's backlog, a job's status polls are kept one a minute (and every one that changed
# its run's state, restarts or failure counter): its feature state's long-lived parts are its
# checkpoint history and these; its windows of metric polls fill in the real-time part's first minute.
BACKLOG_STATUS_EVERY_MS = MINUTE


def aged_split(job_events, cut_ts: int) -> tuple[list[dict], list[dict]]:
    """A job's events before ``cut_ts`` as a backlog (its checkpoints, its status polls thinned to
    :data:`BACKLOG_STATUS_EVERY_MS` and those that changed something), and those from it on."""
    backlog, live = [], []
    last_status = None
    for event in job_events:
        if event["ts"] >= cut_ts:
            live.append(event)
        elif event["kind"] == "checkpoint":
            backlog.append(event)
        elif event["kind"] == "job_status":
            changed = last_status is None or any(event.get(k) != last_status.get(k) for k in (
                "state", "num_restarts", "checkpoints_failed_total"))
            if changed or event["ts"] - last_status["ts"] >= BACKLOG_STATUS_EVERY_MS:
                backlog.append(event)
                last_status = event
    return backlog, live


def main(argv: list[str]) -> None:
    target_file, jobs_n, minutes, *aged = argv
    aged_ms, catch_up_ms = (int(aged[0]) * MINUTE, int(float(aged[1]) * 1000)) if aged else (0, 0)
    to = json.loads(Path(target_file).read_text())
    cut_ts = simulator.DEFAULT_START_TS + aged_ms
    backlog, live = [], []
    for job in simulator.simulate_fleet(int(jobs_n), 3000, aged_ms + int(minutes) * MINUTE):
        job_backlog, job_live = aged_split(job.events, cut_ts) if aged_ms else ([], job.events)
        backlog += job_backlog
        live += job_live
    # The fleet starts 5 s after its events are encoded, so that none is published later than its
    # event time (late events would count their incidents that much slower): the encoding's time
    # is measured on a sample of the events first. A backlog ends then, and the real-time part
    # starts after the catch-up time.
    events = backlog + live
    sample = [dict(e) for e in events[::100]]
    started = time.monotonic()
    encoded(sample)
    encoding_s = (time.monotonic() - started) * len(events) / max(1, len(sample))
    del events, sample
    start_ts = int((time.time() + 5 + 1.5 * encoding_s) * 1000) + catch_up_ms
    shifted(backlog, start_ts - catch_up_ms - cut_ts)
    shifted(live, start_ts - cut_ts)
    backlog_records, records = encoded(backlog), encoded(live)
    del backlog, live
    if records and records[0][0] < time.time() * 1000:
        raise SystemExit(f"encoding took longer than measured: the first events are "
                         f"{time.time() - records[0][0] / 1000:.1f}s late; nothing published")
    print(f"ready {start_ts} {len(records)} {len(backlog_records)}", flush=True)
    publish(to, backlog_records)
    del backlog_records
    publish(to, records, pace=True)


if __name__ == "__main__":
    main(sys.argv[1:])
