"""Publish a simulated fleet to the input topic as a collector would: in real time, event time =
wall time. A process of its own, started by ``benchmarks/detection.py`` (no Spark imported here:
a Python that imports PySpark's modules in a spawned child can exit before running anything).

Usage: ``python benchmarks/fleet_publisher.py TARGET.json JOBS MINUTES`` (TARGET: the broker,
its client options and the topic, as :func:`target` writes them): simulates the fleet,
moves it to start a few seconds from now (``ts`` and ``trigger_ts`` are the input contract's only
instants), prints ``ready <first event time>`` and publishes it paced by the wall clock.
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
# poll's events together. A send and flush per event time (a millisecond apart) cost the publisher a
# third of a core and the broker an eighth at 2,000 jobs, on the two cores the job under test runs on.
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


def shifted(jobs, start_ts: int) -> None:
    """Move the simulated jobs (which start at ``DEFAULT_START_TS``) to start at ``start_ts``."""
    shift = start_ts - simulator.DEFAULT_START_TS
    for job in jobs:
        for event in job.events:
            event["ts"] += shift
            if event.get("trigger_ts") is not None:
                event["trigger_ts"] += shift


def main(argv: list[str]) -> None:
    target_file, jobs_n, minutes = argv
    to = json.loads(Path(target_file).read_text())
    jobs = list(simulator.simulate_fleet(int(jobs_n), 3000, int(minutes) * MINUTE))
    # The fleet starts 5 s after its events are encoded, so that none is published later than its
    # event time (a start taken before encoding 1.2 million events had the first ones published
    # 10-20 s late, their incidents counted that much slower): the encoding's time is measured on
    # a sample of the events first.
    sample = [dict(e) for job in jobs[::max(1, len(jobs) // 100)] for e in job.events]
    started = time.monotonic()
    encoded(sample)
    encoding_s = (time.monotonic() - started) * sum(len(job.events) for job in jobs) / max(1, len(sample))
    start_ts = int((time.time() + 5 + 1.5 * encoding_s) * 1000)
    shifted(jobs, start_ts)
    records = encoded(simulator.merged_events(jobs))
    del jobs
    if records and records[0][0] < time.time() * 1000:
        raise SystemExit(f"encoding took longer than measured: the first events are "
                         f"{time.time() - records[0][0] / 1000:.1f}s late; nothing published")
    print(f"ready {start_ts} {len(records)}", flush=True)
    publish(to, records, pace=True)


if __name__ == "__main__":
    main(sys.argv[1:])
