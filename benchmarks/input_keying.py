"""What keying the input costs in Spark's JVM, before the shuffle: ``detection_input`` (the job cut
from a matching key, the event time by a pattern that stops at a leading ``ts``) against the
same columns read the way it did before (the key's pattern matched three times, the event time
by Spark's JSON path, which tokenises the whole document), both checked to give the same rows.

The records are the production-like fleet's (600 jobs polled every 5 s, as the throughput
benchmark's), keyed as the input contract says, in a cached DataFrame of two partitions on
``local[2]``; each variant is written to Spark's ``noop`` sink, best of ``--repeat``.

Usage: ``.venv/bin/python benchmarks/input_keying.py [--minutes 8] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from benchmarks.fleet_publisher import encoded  # noqa: E402
from benchmarks.kafka_io import machine  # noqa: E402
from pipelines import simulator  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.detection.processor import CONTRACT_KEY, detection_input  # noqa: E402
from pipelines.detection.validation import EARLIEST_TS  # noqa: E402
from pipelines.spark_session import build_spark  # noqa: E402

MAX_FUTURE_MS = 300_000


def by_json_path(records):
    """The keying before: regular expressions for the key's parts, Spark's JSON path for ``ts``."""
    key, value = F.col("key").cast("string"), F.col("value").cast("string")
    keyed = key.rlike(CONTRACT_KEY)
    read = records.select(
        F.when(keyed, F.regexp_extract(key, CONTRACT_KEY, 1)).otherwise(F.get_json_object(value, "$.cluster"))
        .alias("cluster"),
        F.when(keyed, F.regexp_extract(key, CONTRACT_KEY, 2)).otherwise(F.get_json_object(value, "$.job_id"))
        .alias("job_id"),
        F.get_json_object(value, "$.ts").try_cast("long").alias("ts"),
        "key", "value", "topic", "partition", "offset", F.unix_millis("timestamp").alias("kafka_timestamp_ms"))
    plausible = F.col("ts").between(EARLIEST_TS, F.unix_millis(F.current_timestamp()) + MAX_FUTURE_MS)
    return read.select("cluster", "job_id", F.when(plausible, F.timestamp_millis("ts")).alias("event_time"),
                       "key", "value", "topic", "partition", "offset", "kafka_timestamp_ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=8, help="minutes of the fleet's events")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    records = encoded(simulator.merged_events(list(simulator.simulate_fleet(600, 2000, args.minutes * 60_000))))
    spark = build_spark(load_config(), "input-keying")
    table = pa.table({"key": [r[1] for r in records], "value": [r[2] for r in records], "topic": ["in"] * len(records),
                      "partition": pa.array([0] * len(records), pa.int32()), "offset": list(range(len(records))),
                      "timestamp": pa.array([r[0] * 1000 for r in records], pa.timestamp("us", tz="UTC"))})
    frame = spark.createDataFrame(table.to_pandas()).repartition(2).cache()
    frame.count()
    variants = {"before: key patterns, JSON path": by_json_path(frame),
                "detection_input": detection_input(frame, MAX_FUTURE_MS)}
    columns = ["offset", "cluster", "job_id", "event_time"]
    same = variants["detection_input"].select(*columns).exceptAll(variants["before: key patterns, JSON path"]
                                                                  .select(*columns)).count() == 0
    print(f"machine: {machine()}; {len(records):,} records of 600 jobs, local[2]; the same rows: {same}")
    print("| keying | seconds (best of {}) | records/s |".format(args.repeat))
    print("|---|---:|---:|")
    for name, variant in variants.items():
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            variant.write.format("noop").mode("overwrite").save()
            best = min(best, time.perf_counter() - started)
        print(f"| {name} | {best:.2f} | {len(records) / best:,.0f} |")
    spark.stop()
    if not same:
        raise SystemExit("detection_input's rows differ from the JSON path's")


if __name__ == "__main__":
    main()
