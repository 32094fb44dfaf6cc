"""A streaming driver in its own process, for the kill -9 test: Kafka source -> Parquet file sink.

The file sink is exactly-once (its _spark_metadata log), so whatever it holds after a crash and a
restart is exactly what the Kafka source delivered: duplicates or gaps would be the source's.
Each task sleeps a little so a micro-batch is reliably in flight when the test kills us. The test
restarts the query (:func:`start_file_sink`) in its own Spark, on the same checkpoint.
"""

from __future__ import annotations

import argparse
import time

from pyspark.sql import functions as F

from pipelines.config import load_config
from pipelines.io.kafka_stream import read_kafka_stream
from pipelines.spark_session import build_spark


def start_file_sink(spark, config, topic: str, checkpoint: str, out: str, max_offsets: int, task_delay_s: float = 0.0,
                    available_now: bool = False):
    """The query: ``topic`` into Parquet files in ``out``, each task ``task_delay_s`` late."""

    def slow(batches):
        time.sleep(task_delay_s)
        yield from batches

    records = read_kafka_stream(spark, config, topic, max_offsets_per_trigger=max_offsets)
    rows = records.select("partition", "offset", F.col("value").cast("string").alias("value"))
    if task_delay_s:
        rows = rows.mapInArrow(slow, rows.schema)
    writer = rows.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="200 milliseconds")
    return writer.start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-offsets", type=int, default=500)
    parser.add_argument("--task-delay-s", type=float, default=0.0)
    args = parser.parse_args()

    config = load_config(
        environ={"SENTINEL_KAFKA__BOOTSTRAP_SERVERS": args.bootstrap, "SENTINEL_STATE_DIR": args.state_dir,
                 "SENTINEL_SPARK__MASTER": "local[2]"},
        base_dir=None,
    )
    spark = build_spark(config, "file-sink-driver")
    query = start_file_sink(spark, config, args.topic, args.checkpoint, args.out, args.max_offsets, args.task_delay_s)
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
