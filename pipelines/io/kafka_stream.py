"""Read and write Kafka topics as Spark streams, with either connector behind one interface.

``kafka.connector: python`` uses the project's Python Data Source (``sentinel_kafka``);
``kafka.connector: spark`` uses Spark's native ``kafka`` format when ``spark-sql-kafka`` is on the
classpath. Both give the same columns, so the job does not care which one is in use.
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter

from pipelines.config import SentinelConfig
from pipelines.io.kafka_clients import normalise_client_options
from pipelines.io.kafka_source import FORMAT_NAME

KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def _native_client_options(config: SentinelConfig) -> dict[str, str]:
    # kafka-python names (security_protocol) become Java client names (kafka.security.protocol).
    return {
        "kafka." + key.replace("_", "."): str(value)
        for key, value in normalise_client_options(config.kafka.client_options).items()
    }


def _format_and_options(config: SentinelConfig) -> tuple[str, dict[str, str]]:
    kafka = config.kafka
    if kafka.connector == "spark":
        return "kafka", {"kafka.bootstrap.servers": kafka.bootstrap_servers, **_native_client_options(config)}
    return FORMAT_NAME, {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "clientOptions": json.dumps(kafka.client_kwargs()),
        "metadataTimeoutMs": str(int(kafka.connect_timeout_s * 1000)),
    }


def read_kafka_stream(
    spark: SparkSession,
    config: SentinelConfig,
    topic: str,
    starting_offsets: str | None = None,
    max_offsets_per_trigger: int | None = None,
) -> DataFrame:
    """A streaming DataFrame of the topic's records with Spark's Kafka source columns."""
    fmt, options = _format_and_options(config)
    options["subscribe"] = topic
    options["startingOffsets"] = starting_offsets or config.kafka.starting_offsets
    options["failOnDataLoss"] = str(config.kafka.fail_on_data_loss).lower()
    limit = max_offsets_per_trigger or config.kafka.max_offsets_per_trigger
    if limit:
        options["maxOffsetsPerTrigger"] = str(limit)
    if fmt == "kafka":
        options["includeHeaders"] = "true"
    return spark.readStream.format(fmt).options(**options).load().select(*KAFKA_COLUMNS)


def kafka_stream_writer(df: DataFrame, config: SentinelConfig, topic: str | None = None) -> DataStreamWriter:
    """A ``writeStream`` to Kafka; rows need ``value`` and may have ``key``, ``topic``, ``headers``.

    The caller sets the trigger, checkpoint location and query name, and starts it.
    """
    fmt, options = _format_and_options(config)
    if topic:
        options["topic"] = topic
    return df.writeStream.format(fmt).options(**options)


def write_kafka_batch(df: DataFrame, config: SentinelConfig, topic: str | None = None) -> None:
    """Write a batch DataFrame to Kafka (at least once)."""
    fmt, options = _format_and_options(config)
    if topic:
        options["topic"] = topic
    df.write.format(fmt).options(**options).mode("append").save()
