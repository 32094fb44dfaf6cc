"""The detection job's Python workers at its start: the time to have them ready, and their memory.

Before its first micro-batch the job runs a warm-up of the detection query's shape (a task per
shuffle partition: the stateful processor, then the feature log writer's ``mapInArrow``;
:func:`~pipelines.detection.processor.load_models_on_workers`) so that the first events do not
wait while new Python workers import their libraries and load the champions. This measures that
warm-up on a fresh Spark session (new workers), then once more on the same workers (warm), with
each worker's resident memory (from ``/proc``, so on this machine's local mode only) and the
machine's busy CPU seconds over the cold warm-up (from ``/proc/stat``: Spark's JVM and every
worker, not only this process).

Usage: ``.venv/bin/python benchmarks/worker_start.py [--repeat 2]`` (the champions of
``sentinel train`` must exist in the configured registry).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from benchmarks.calibration import calibration_line  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.detection.champions import ChampionCache  # noqa: E402
from pipelines.detection.processor import load_models_on_workers  # noqa: E402
from pipelines.spark_session import build_spark  # noqa: E402


def busy_cpu_s() -> float:
    """The machine's busy CPU seconds since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    ticks = sum(int(fields[i]) for i in (0, 1, 2, 5, 6, 7))
    return ticks / os.sysconf("SC_CLK_TCK")


def resident_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def one_start(config) -> list[str]:
    """A fresh session's warm-up, cold then warm; the report's lines."""
    spark = build_spark(config, "worker-start")
    try:
        spark.range(10).collect()  # the JVM's own start, not the workers'
        busy, started = busy_cpu_s(), time.monotonic()
        workers = load_models_on_workers(spark, config)
        cold_s, cold_cpu = time.monotonic() - started, busy_cpu_s() - busy
        started = time.monotonic()
        again = load_models_on_workers(spark, config)
        warm_s = time.monotonic() - started
        scoring = [w for w in workers if w["models"] is not None]
        lines = [f"cold: {len(workers)} workers ({len(scoring)} with the champions) ready in {cold_s:.1f} s, "
                 f"{cold_cpu:.1f} busy CPU s on the machine; warm: {warm_s:.1f} s"
                 + ("" if {w["pid"] for w in again} == {w["pid"] for w in workers} else " (other workers)")]
        for worker in workers:
            role = "champions" if worker["models"] is not None else "no models"
            lines.append(f"  worker {worker['pid']} ({role}): {resident_mib(worker['pid']):.0f} MiB resident")
        return lines
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="fresh sessions, one after the other")
    args = parser.parse_args()
    config = load_config()
    ChampionCache(config).require()  # say so before starting anything
    print(calibration_line("start"), flush=True)
    for _ in range(args.repeat):
        for line in one_start(config):
            print(line, flush=True)
    print(calibration_line("end"), flush=True)


if __name__ == "__main__":
    main()
