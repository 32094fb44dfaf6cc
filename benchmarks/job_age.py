"""The detection's Python work per event as the Flink jobs age: real-time micro-batches, no Spark.

A fleet's jobs (``--jobs``, the production-like fleet of the simulator, polled every 5 s) run for
``--minutes`` of event time, cut into micro-batches of ``--batch-ms`` of event time each (the
fleet benchmark's 2 s trigger), through the stateful tasks' own steps on one core: each job's
records validated and consumed (:meth:`FlinkJobState.read`), the batch's feature frame, scoring
and the incident policy (:func:`decide`), then each job's state compacted and serialised
(:meth:`FlinkJobState.to_bytes`), as the task writes it to Spark's state store. The states stay
in memory between batches, as in a Python worker's cache of parsed states; with ``--parse``
every batch parses them from their bytes instead (a worker that did not run the bucket last).

It prints, per stretch of the jobs' age, the time per event (validate and consume), per feature
row (frame, score and decide), per job state written and its size. A job's state fills its
windows over its first minutes (the last 12 checkpoints) and its long horizon over 90 minutes
(a thinned buffer of 240 points), so a short run sees young jobs: the 10- and 20-minute fleet
runs of ``detection.py`` do not reach the steady state that this shows (``detection.py fleet
--fleet-aged-minutes 90`` does, with Spark, after catching up the jobs' history).

Usage: ``.venv/bin/python benchmarks/job_age.py [--jobs 300] [--minutes 100] [--every 10]``
(the champions of ``sentinel train`` must exist; 200 jobs for 100 minutes took about eight minutes).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# One OpenMP thread for the models' predict, as Spark gives its Python workers (OMP_NUM_THREADS=1
# in local mode too, measured): before numpy and scikit-learn load OpenMP.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.calibration import calibration_line  # noqa: E402
from benchmarks.fleet_publisher import encoded  # noqa: E402
from benchmarks.hot_path import records_by_job  # noqa: E402
from pipelines import simulator  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.detection.champions import ChampionCache  # noqa: E402
from pipelines.detection.flink_job import FlinkJobState, ReadRules, decide, feature_frame, job_key  # noqa: E402
from pipelines.incidents.policy import PolicySettings  # noqa: E402

MINUTE = 60_000
PHASES = ("parse", "read", "decide", "write")


def run(records: list[tuple[int, bytes, bytes]], batch_ms: int, parse: bool, config, models) -> dict[int, dict]:
    """Totals per minute of event time since the first record: events, feature rows, states
    written, their bytes, and seconds per phase."""
    rules, settings = ReadRules.from_config(config), PolicySettings.from_config(config)
    first = records[0][0]
    kept: dict[str, FlinkJobState] = {}
    written: dict[str, bytes] = {}
    minutes: dict[int, dict] = {}
    start, end = 0, first + batch_ms
    while start < len(records):
        stop = start
        while stop < len(records) and records[stop][0] < end:
            stop += 1
        by_job = records_by_job(records, start, stop)
        totals = minutes.setdefault((end - first - 1) // MINUTE, dict.fromkeys(
            ("events", "rows", "states", "bytes", *PHASES), 0))
        began = time.perf_counter()
        jobs = {}
        for cluster, job_id in by_job:
            name = job_key(cluster, job_id)
            if name not in written:
                jobs[name] = FlinkJobState()
            else:
                jobs[name] = FlinkJobState.from_bytes(written[name]) if parse else kept[name]
        parsed = time.perf_counter()
        readings = [jobs[job_key(*key)].read(job_records, end, rules, key=key) for key, job_records in by_job.items()]
        read = time.perf_counter()
        rows = feature_frame([row for reading in readings for row in reading.rows])
        decide(jobs, rows, models, settings)
        decided = time.perf_counter()
        for name, job in jobs.items():
            job.compact()
            written[name] = job.to_bytes()
            kept[name] = job
            totals["bytes"] += len(written[name])
        wrote = time.perf_counter()
        totals["events"] += stop - start
        totals["rows"] += len(rows)
        totals["states"] += len(jobs)
        for phase, seconds in zip(PHASES, (parsed - began, read - parsed, decided - read, wrote - decided)):
            totals[phase] += seconds
        start, end = stop, end + batch_ms
    return minutes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--minutes", type=int, default=100, help="event time the fleet runs")
    parser.add_argument("--batch-ms", type=int, default=2_000, help="event time per micro-batch")
    parser.add_argument("--every", type=int, default=10, help="minutes of age per line of the table")
    parser.add_argument("--parse", action="store_true", help="parse every job's state from its bytes at every batch")
    args = parser.parse_args()
    config = load_config()
    models = ChampionCache(config).require()
    records = encoded(simulator.merged_events(simulator.simulate_fleet(args.jobs, 2000, args.minutes * MINUTE)))
    # As in a detection task (pipelines/detection/processor.py): no cyclic collection while it runs.
    gc.collect()
    gc.freeze()
    gc.disable()
    print(calibration_line("start"), flush=True)
    minutes = run(records, args.batch_ms, args.parse, config, models)
    print(f"{args.jobs} jobs, {len(records):,} events, {args.batch_ms} ms of event time a batch, states "
          + ("parsed from their bytes at every batch" if args.parse else "kept in memory between batches"))
    print("| jobs' age (min) | events | validate and consume per event | frame, score and decide per row "
          "| parse per state | write per state | bytes per state |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for first in range(0, max(minutes) + 1, args.every):
        group = [minutes[m] for m in range(first, first + args.every) if m in minutes]
        total = {k: sum(g[k] for g in group) for k in group[0]}
        print(f"| {first}-{first + len(group)} | {total['events']:,} | {total['read'] / total['events'] * 1e6:.0f} us "
              f"| {total['decide'] / max(total['rows'], 1) * 1e6:.0f} us | {total['parse'] / total['states'] * 1e6:.0f} us "
              f"| {total['write'] / total['states'] * 1e6:.0f} us | {total['bytes'] // total['states']:,} |", flush=True)
    print(calibration_line("end"))


if __name__ == "__main__":
    main()
