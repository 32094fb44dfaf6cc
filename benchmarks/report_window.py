"""`sentinel report`'s time against the size of the input topic: the pages of the last hour's
incidents, read from a time (``--since``, the seek in pipelines/reports/topic_reader.py) and, for
comparison, from the topics' start (what it did before).

An embedded broker on a free port; the input topic is filled with ``--events`` events of a fleet
spread evenly over the last ``--hours`` (record timestamps as a collector publishing them then
would have), plus the simulated events of the incidents' jobs in the last hour; the incident
topic holds those jobs' incidents, published in the last half hour. After each size in
``--sizes`` (a topic each, written in time order) the report runs from a time, and up to
``--whole-up-to`` from the start too.

Usage: ``.venv/bin/python benchmarks/report_window.py [--events 1000000] [--sizes 100000,300000,1000000]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.calibration import calibration_line  # noqa: E402
from infra.embedded_stack import EmbeddedStack, free_port  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.io import kafka_clients  # noqa: E402

MINUTE = 60_000


def _incident_jobs(now_ms: int, count: int) -> tuple[list[dict], list[dict]]:
    """Simulated leak jobs whose last hour ends now, and an incident of each made by the real policy."""
    import pandas as pd

    from models.post_rule import PostRule
    from pipelines.contracts import INCIDENT
    from pipelines.incidents import policy
    from pipelines.simulator import simulate_job

    events, incidents = [], []
    for index in range(count):
        job = simulate_job("leak_seed000", seed=index, index=index, duration_ms=60 * MINUTE, cluster="bench",
                           start_ts=now_ms - 60 * MINUTE)
        events += job.events
        job_id = job.truth["job_id"]
        opened_min = (now_ms - 30 * MINUTE) // MINUTE
        rows = pd.DataFrame([{"cluster": "bench", "job_id": job_id, "job_name": job.truth.get("job_name", "orders"),
                              "vertex_id": "v1", "vertex_name": "Window", "ts": (opened_min + k) * MINUTE,
                              "trigger_kind": "checkpoint", "is_late": False, "job_state": "RUNNING",
                              "last_failure_message": None} for k in range(3)])
        scores = pd.DataFrame([{"row": k, "family": "skew", "score": 0.9, "model_name": "sentinel-skew",
                                "model_version": "1", "model_alias": "champion"} for k in range(3)])
        rows["hot_subtask"], rows["records_in_max_over_mean"] = 2.0, 4.0
        opened = policy.step({}, rows, scores, {"skew": PostRule(0.5, 2, 3)}, policy.PolicySettings())
        assert opened and INCIDENT.errors(opened[0]) == [], opened
        incidents.append(opened[0])
    return events, incidents


def _publish(config, count: int, now_ms: int, hours: float, template: dict, job_events: list[dict]) -> None:
    """``count`` fleet events spread over the last ``hours`` and the incidents' jobs' events, all
    in the order of their record timestamps."""
    producer = kafka_clients.make_producer(config.kafka.bootstrap_servers, config.kafka.client_kwargs(),
                                           linger_ms=50, batch_size=256 * 1024)
    span = hours * 3600_000
    # One serialised event with the job's name put in: the producer, not JSON, is what costs here.
    value = json.dumps({**template, "job_id": "@JOB@", "job_name": "@JOB@"}).encode()
    jobs = [f"fleet-{j:04d}".encode() for j in range(2000)]
    own = sorted(job_events, key=lambda e: e["ts"])
    next_own = 0
    for i in range(count):
        stamp = int(now_ms - span + span * i / count)
        while next_own < len(own) and own[next_own]["ts"] <= stamp:
            event = own[next_own]
            producer.send(config.topics.input, key=f"bench/{event['job_id']}".encode(),
                          value=json.dumps(event).encode(), timestamp_ms=int(event["ts"]))
            next_own += 1
        job = jobs[i % 2000]
        producer.send(config.topics.input, key=b"bench/" + job, value=value.replace(b"@JOB@", job), timestamp_ms=stamp)
    for event in own[next_own:]:
        producer.send(config.topics.input, key=f"bench/{event['job_id']}".encode(), value=json.dumps(event).encode(),
                      timestamp_ms=int(event["ts"]))
    producer.flush()
    producer.close()


def _report(config, since_s: float, out: Path, from_start: bool = False) -> tuple[float, int, int]:
    """Seconds, pages, input events of the incidents' jobs; ``from_start``: the input topic read
    from its start, as the report did before it read from a time."""
    from pipelines.reports.incident_page import write_pages
    from pipelines.reports.topic_reader import read_since, report_inputs

    started = time.monotonic()
    inputs = report_inputs(config, None, None, 600.0, since_s)
    if from_start:
        keys = {f"{i['cluster']}/{i['job_id']}".encode() for i in inputs.incidents}
        records = read_since(config.kafka.bootstrap_servers, config.kafka.client_kwargs(), config.topics.input, 0,
                             600.0, keep=lambda r: r.key in keys)
        events = [json.loads(r.value) for r in sorted(records, key=lambda r: (r.timestamp, r.partition, r.offset))]
    else:
        events = list(inputs.events)
    pages = write_pages(inputs.incidents, events, out)
    return time.monotonic() - started, len(pages) - 1, len(events)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--sizes", default="100000,300000,1000000")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--incidents", type=int, default=5)
    parser.add_argument("--whole-up-to", type=int, default=300_000,
                        help="read from the topic's start too, for comparison, up to this size")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(",") if int(s) <= args.events)
    print(calibration_line("start"), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(environ={"SENTINEL_STATE_DIR": tmp, "SENTINEL_KAFKA__BOOTSTRAP_SERVERS":
                                      f"127.0.0.1:{free_port()}"}, base_dir=Path(tmp))
        stack = EmbeddedStack(config)
        stack.up(mlflow=False)
        try:
            now_ms = int(time.time() * 1000)
            job_events, incidents = _incident_jobs(now_ms, args.incidents)
            template = next(e for e in job_events if e["kind"] == "checkpoint")
            producer = kafka_clients.make_producer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
            for incident in incidents:
                producer.send(config.topics.incidents, key=incident["incident_id"].encode(),
                              value=json.dumps(incident).encode(), timestamp_ms=now_ms - 30 * MINUTE)
            producer.flush()
            producer.close()
            print("| input events on the topic | report --since 1h | pages | their jobs' events | from the "
                  "topic's start (before) |")
            print("|---:|---:|---:|---:|---:|")
            for size in sizes:
                # A topic per size, written in time order as collectors publish: the fleet's events
                # over the last hours, the incidents' jobs' among them in their last hour.
                config.topics.input = f"bench-input-{size}"
                kafka_clients.ensure_topics(config.kafka.bootstrap_servers, config.kafka.client_kwargs(),
                                            [config.topics.input], config.kafka.topic_partitions)
                started = time.monotonic()
                _publish(config, size, now_ms, args.hours, template, job_events)
                print(f"<!-- published {size} in {time.monotonic() - started:.0f}s -->", flush=True)
                window = _report(config, 3600, Path(tmp) / f"pages-window-{size}")
                whole = (_report(config, 3600, Path(tmp) / f"pages-whole-{size}", from_start=True)
                         if size <= args.whole_up_to else None)
                print(f"| {size + len(job_events):,} | {window[0]:.1f} s | {window[1]} | {window[2]:,} | "
                      + (f"{whole[0]:.1f} s ({whole[2]:,}) |" if whole else "not run |"), flush=True)
        finally:
            stack.down()
    print(calibration_line("end"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
