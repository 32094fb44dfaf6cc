"""A streaming round trip that proves Kafka -> Spark -> Kafka works with the configured stack.

Example input events are published to a fresh topic, read by a Structured Streaming query with
the configured Kafka connector, parsed into the input contract's Spark schema, written back as
JSON to a second fresh topic, and compared one by one with what was sent. The query checkpoints
where the job will (``spark.checkpoint_location``, local or a URI), and each configured storage
location is probed first (:func:`check_storage`). ``sentinel selfcheck`` runs it against any
cluster the config points at; ``make run`` runs it on the embedded stack.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.config import SentinelConfig
from pipelines.contracts import INPUT, input_event_key
from pipelines.contracts.examples import example_events
from pipelines.io import kafka_clients
from pipelines.io.kafka_stream import kafka_stream_writer, read_kafka_stream
from pipelines.io.storage import probe


@dataclass(frozen=True)
class RoundTripResult:
    sent: int
    received: int
    mismatched: int
    seconds: float
    input_topic: str
    output_topic: str

    @property
    def ok(self) -> bool:
        return self.sent == self.received and self.mismatched == 0

    def summary(self) -> str:
        verdict = "OK" if self.ok else "FAILED"
        return (
            f"round trip {verdict}: sent {self.sent} events to {self.input_topic}, Spark parsed them into the "
            f"input contract and wrote {self.received} to {self.output_topic} "
            f"({self.mismatched} differ) in {self.seconds:.1f}s"
        )


def _without_nulls(value: Any) -> Any:
    # to_json leaves out null fields; compare on what is present.
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def check_storage(config: SentinelConfig) -> list[str]:
    """Probe every place the job and the collector keep state; raises StorageError for the first
    that cannot be written."""
    folders = {config.location(config.spark.checkpoint_location), config.offline_store,
               config.location(config.collector.state_dir)}
    return [probe(folder) for folder in sorted(folders, key=lambda f: f.uri)]


def contract_round_trip(spark: SparkSession, config: SentinelConfig, events: int = 3000) -> RoundTripResult:
    run_id = uuid.uuid4().hex[:8]
    in_topic, out_topic = f"sentinel.selfcheck.{run_id}.in", f"sentinel.selfcheck.{run_id}.out"
    kafka = config.kafka
    kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)
    kafka_clients.ensure_topics(kafka.bootstrap_servers, kafka.client_kwargs(), [in_topic, out_topic], kafka.topic_partitions)

    sent = list(example_events(events, seed=7, cluster=f"selfcheck-{run_id}"))
    producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
    for event in sent:
        producer.send(in_topic, key=input_event_key(event), value=json.dumps(event).encode())
    producer.flush()
    producer.close()

    started = time.monotonic()
    parsed = (
        read_kafka_stream(spark, config, in_topic, starting_offsets="earliest")
        .select(F.col("key"), F.from_json(F.col("value").cast("string"), INPUT.spark_schema()).alias("event"))
        .select("key", F.to_json("event").alias("value"))
    )
    checkpoint = config.checkpoint_dir(f"_selfcheck-{run_id}")
    try:
        query = (
            kafka_stream_writer(parsed, config, out_topic)
            .option("checkpointLocation", checkpoint.spark_path)
            .queryName(f"selfcheck_{run_id}")
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination()
        finally:
            query.stop()
    finally:
        checkpoint.delete_tree()
    seconds = time.monotonic() - started

    consumer = kafka_clients.make_consumer(kafka.bootstrap_servers, kafka.client_kwargs())
    received = [json.loads(r.value) for r in kafka_clients.read_records(consumer, out_topic)]
    consumer.close()
    expected = {e["ts"]: _without_nulls(e) for e in sent}
    mismatched = sum(1 for r in received if expected.get(r.get("ts")) != r)
    return RoundTripResult(len(sent), len(received), mismatched, seconds, in_topic, out_topic)
