"""Kafka I/O throughput: the raw kafka-python ceiling against the Spark source and sink.

One run, one data set (contract events from ``example_events``) on a private embedded broker:

1. raw kafka-python consume of the whole topic (the ceiling),
2. the Spark source alone (``sentinel_kafka`` -> ``noop`` sink),
3. source + ``from_json`` into the input contract's Spark schema,
4. source -> Kafka sink (records copied to a second topic).

Each Spark figure is one ``Trigger.AvailableNow`` query over the whole topic, timed from start to
termination, on an already-warm session (a warm-up query runs first). Prints a Markdown table for
BENCHMARKS.md. Usage: ``.venv/bin/python benchmarks/kafka_io.py [--events 200000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from pyspark.sql import functions as F  # noqa: E402

from infra.embedded_stack import EmbeddedStack, free_port  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.contracts import INPUT, input_event_key  # noqa: E402
from pipelines.contracts.examples import example_events  # noqa: E402
from pipelines.io import kafka_clients  # noqa: E402
from pipelines.io.kafka_stream import kafka_stream_writer, read_kafka_stream  # noqa: E402
from pipelines.spark_session import build_spark  # noqa: E402


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    import pyspark
    import kafka
    return (f"{os.cpu_count()} cores ({cpu}), {round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB, "
            f"Python {platform.python_version()}, {java}, pyspark {pyspark.__version__}, kafka-python {kafka.__version__}")


def produce(config, topic: str, events: int) -> int:
    producer = kafka_clients.make_producer(config.kafka.bootstrap_servers, config.kafka.client_kwargs(),
                                           linger_ms=20, batch_size=256 * 1024, acks=1)
    total_bytes = 0
    for event in example_events(events, seed=11):
        value = json.dumps(event).encode()
        total_bytes += len(value)
        producer.send(topic, key=input_event_key(event), value=value)
    producer.flush()
    producer.close()
    return total_bytes


def raw_consume(config, topic: str, events: int) -> float:
    consumer = kafka_clients.make_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs(),
                                           max_poll_records=10_000, fetch_max_bytes=64 * 2**20,
                                           max_partition_fetch_bytes=16 * 2**20)
    partitions = kafka_clients.partitions_of(consumer, topic)
    from kafka import TopicPartition

    tps = [TopicPartition(topic, p) for p in partitions]
    started = time.perf_counter()
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    seen = 0
    while seen < events:
        for batch in consumer.poll(timeout_ms=1000).values():
            seen += len(batch)
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def timed_query(writer_stream, checkpoint: str) -> tuple[float, int]:
    started = time.perf_counter()
    query = writer_stream.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return elapsed, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as state:
        config = load_config(environ={"SENTINEL_STATE_DIR": state,
                                      "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
                                      "SENTINEL_KAFKA__TOPIC_PARTITIONS": str(args.partitions)})
        stack = EmbeddedStack(config)
        stack.up(mlflow=False)
        try:
            topic, sink_topic, warm_topic = "bench.in", "bench.out", "bench.warm"
            kafka_clients.ensure_topics(config.kafka.bootstrap_servers, config.kafka.client_kwargs(),
                                        [topic, sink_topic, warm_topic], args.partitions)
            size = produce(config, topic, args.events)
            produce(config, warm_topic, 1000)
            spark = build_spark(config, "bench")
            timed_query(read_kafka_stream(spark, config, warm_topic).writeStream.format("noop"), f"{state}/warm")

            results = [("raw kafka-python consume (ceiling)", raw_consume(config, topic, args.events), args.events)]
            source = read_kafka_stream(spark, config, topic)
            results.append(("Spark source -> noop",
                             *timed_query(source.writeStream.format("noop"), f"{state}/c1")))
            parsed = source.select(F.from_json(F.col("value").cast("string"), INPUT.spark_schema()).alias("e")).select("e.*")
            results.append(("Spark source + from_json(contract) -> noop",
                             *timed_query(parsed.writeStream.format("noop"), f"{state}/c2")))
            results.append(("Spark source -> Kafka sink",
                             *timed_query(kafka_stream_writer(source.select("key", "value"), config, sink_topic), f"{state}/c3")))
            spark.stop()
        finally:
            stack.down()

    ceiling = args.events / results[0][1]
    print(f"machine: {machine()}")
    print(f"data: {args.events} contract events, {size / args.events:.0f} B mean, {args.partitions} partitions, "
          f"Spark {config.spark.master}\n")
    print("| stage | events | seconds | events/s | ratio to ceiling |")
    print("|---|---:|---:|---:|---:|")
    for name, seconds, rows in results:
        assert rows == args.events, f"{name} saw {rows} of {args.events} events"
        rate = rows / seconds
        print(f"| {name} | {rows} | {seconds:.2f} | {rate:,.0f} | {rate / ceiling:.2f} |")


if __name__ == "__main__":
    main()
