"""The detection's Python work per event, without Spark: what the stateful tasks do with a backlog.

The records of the ``throughput`` benchmark's production-like fleet (600 simulated jobs polled
every 5 s for 15 minutes, 548,335 events) go through the live job's own steps, one micro-batch
at a time (``--batch`` records, each job's in arrival order), on one core: each job's records
validated and consumed (:meth:`FlinkJobState.read`, the feature state machine's rows), the
batch's feature frame, then scoring with the MLflow champions and the incident policy
(:func:`decide`). Spark's own parts (reading Kafka, the shuffle, the state store, the Python
workers' row conversion) are left out, and so is their noise: this measures the code the
stateful processor runs, with the machine's speed beside it (:mod:`benchmarks.calibration`).

It also prints a digest of every batch's feature frame and incidents. A change meant to keep the
output (a faster implementation) must keep the digest, for the same champions.

Usage: ``.venv/bin/python benchmarks/hot_path.py [--batch 50000] [--repeat 2]`` (the champions
of ``sentinel train`` must exist).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# One OpenMP thread for the models' predict, as Spark gives its Python workers (OMP_NUM_THREADS=1
# in local mode too, measured): before numpy and scikit-learn load OpenMP.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import orjson  # noqa: E402

from benchmarks.calibration import calibration_line  # noqa: E402
from benchmarks.fleet_publisher import encoded  # noqa: E402
from pipelines import simulator  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.detection.champions import ChampionCache  # noqa: E402
from pipelines.detection.flink_job import FlinkJobState, ReadRules, Record, decide, feature_frame, job_key  # noqa: E402
from pipelines.incidents.policy import PolicySettings  # noqa: E402

MINUTE = 60_000


def records_by_job(records: list[tuple[int, bytes, bytes]], start: int, stop: int) -> dict[tuple[str, str], list[Record]]:
    """``records[start:stop]`` as the stateful processor gets them: by the job their key names, each
    job's in arrival order (the record's place in ``records`` is its offset)."""
    by_job: dict[tuple[str, str], list[Record]] = {}
    for offset in range(start, stop):
        _, key, value = records[offset]
        cluster, job_id = key.decode().rsplit("/", 1)
        by_job.setdefault((cluster, job_id), []).append(Record(value, key, "input", 0, offset))
    return by_job


def run(records: list[tuple[int, bytes, bytes]], batch: int, config, models) -> tuple[dict[str, float], str]:
    """Seconds per phase over all ``records`` (fresh job states), and the output's digest."""
    rules, settings = ReadRules.from_config(config), PolicySettings.from_config(config)
    now_ms = max(ts for ts, _, _ in records) + 1  # the recording's clock: nothing is in the future
    jobs: dict[str, FlinkJobState] = {}
    seconds = {"read and consume": 0.0, "feature frame": 0.0, "score and decide": 0.0}
    digest = hashlib.sha256()
    for start in range(0, len(records), batch):
        by_job = records_by_job(records, start, min(start + batch, len(records)))
        started = time.perf_counter()
        readings = {}
        for (cluster, job_id), job_records in by_job.items():
            name = job_key(cluster, job_id)
            job = jobs.setdefault(name, FlinkJobState())
            readings[name] = job.read(job_records, now_ms, rules, key=(cluster, job_id))
        read = time.perf_counter()
        rows = feature_frame([row for reading in readings.values() for row in reading.rows])
        framed = time.perf_counter()
        incidents = decide({name: jobs[name] for name in readings}, rows, models, settings)
        decided = time.perf_counter()
        seconds["read and consume"] += read - started
        seconds["feature frame"] += framed - read
        seconds["score and decide"] += decided - framed
        digest.update(rows.to_csv(index=False).encode())
        digest.update(orjson.dumps(incidents, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY))
    return seconds, digest.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=50_000, help="records per micro-batch (a task's share of "
                        "the throughput benchmark's 100,000 on two partitions)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    config = load_config()
    models = ChampionCache(config).require()
    records = encoded(simulator.merged_events(simulator.simulate_fleet(600, 2000, 15 * MINUTE)))
    print(calibration_line("start"), flush=True)
    print("| run | events | read and consume | feature frame | score and decide | total | events/s | digest |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for attempt in range(1, args.repeat + 1):
        seconds, digest = run(records, args.batch, config, models)
        total = sum(seconds.values())
        print(f"| {attempt} | {len(records):,} | {seconds['read and consume']:.2f} s | {seconds['feature frame']:.2f} s | "
              f"{seconds['score and decide']:.2f} s | {total:.2f} s | {len(records) / total:,.0f}/s | `{digest}` |",
              flush=True)
    print(calibration_line("end"))
    print("models: " + ", ".join(f"{family} {model.name} v{model.version}" for family, model in models.items()))


if __name__ == "__main__":
    main()
