"""A streaming driver in its own process, for the kill -9 test: Kafka source -> Parquet file sink.

The file sink is exactly-once (its _spark_metadata log), so whatever it holds after a crash and a
restart is exactly what the Kafka source delivered: duplicates or gaps would be the source's.
Each task sleeps a little so a micro-batch is reliably in flight when the test kills us.
"""

from __future__ import annotations

import argparse
import time

from pyspark.sql import functions as F

from pipelines.config import load_config
from pipelines.io.kafka_stream import read_kafka_stream
from pipelines.spark_session import build_spark


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-offsets", type=int, default=500)
    parser.add_argument("--task-delay-s", type=float, default=0.0)
    parser.add_argument("--available-now", action="store_true")
    args = parser.parse_args()

    config = load_config(
        environ={"SENTINEL_KAFKA__BOOTSTRAP_SERVERS": args.bootstrap, "SENTINEL_STATE_DIR": args.state_dir,
                 "SENTINEL_SPARK__MASTER": "local[2]"},
        base_dir=None,
    )
    spark = build_spark(config, "file-sink-driver")
    delay = args.task_delay_s

    def slow(batches):
        time.sleep(delay)
        yield from batches

    records = read_kafka_stream(spark, config, args.topic, max_offsets_per_trigger=args.max_offsets)
    rows = records.select("partition", "offset", F.col("value").cast("string").alias("value"))
    if delay:
        rows = rows.mapInArrow(slow, rows.schema)
    writer = rows.writeStream.format("parquet").option("path", args.out).option("checkpointLocation", args.checkpoint)
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="200 milliseconds")
    query = writer.start()
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
