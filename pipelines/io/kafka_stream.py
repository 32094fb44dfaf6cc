"""Read and write Kafka topics as Spark streams, with either connector behind one interface.

``kafka.connector: python`` uses the project's Python Data Source (``sentinel_kafka``);
``kafka.connector: spark`` uses Spark's native ``kafka`` format when ``spark-sql-kafka`` is on the
classpath. Both give the same columns, so the job does not care which one is in use.
"""

from __future__ import annotations

import json
import logging
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from pipelines.config import SECRET_CLIENT_OPTIONS, ConfigError, KafkaSecurityConfig, SentinelConfig
from pipelines.errors import SetupError
from pipelines.io import kafka_clients
from pipelines.io.kafka_clients import normalise_client_options
from pipelines.io.kafka_source import FORMAT_NAME

log = logging.getLogger(__name__)

KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


# kafka-python names whose Java client name is not the same words joined by dots.
_JAVA_NAMES = {"ssl_ciphers": "ssl.cipher.suites"}
# The Java client's JAAS login module of each SASL mechanism.
_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def _jaas_quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def native_security_options(security: KafkaSecurityConfig) -> dict[str, str]:
    """Spark's native connector options (the Java client's names, prefixed with 'kafka.') for
    ``kafka.security``. The Java client reads PEM files itself; its key store is one PEM file
    holding the key and the certificate chain."""
    options = {"kafka.security.protocol": security.protocol}
    if security.tls:
        if security.ssl_cafile is not None:
            options.update({"kafka.ssl.truststore.type": "PEM",
                            "kafka.ssl.truststore.location": str(security.ssl_cafile)})
        if security.ssl_certfile is not None:
            if security.ssl_keyfile is not None and security.ssl_keyfile != security.ssl_certfile:
                raise ConfigError("kafka.security.ssl_keyfile: Spark's connector (kafka.connector: spark) reads the "
                                  "client key and certificate from one PEM file; put both in ssl_certfile")
            options.update({"kafka.ssl.keystore.type": "PEM",
                            "kafka.ssl.keystore.location": str(security.ssl_certfile)})
        if (key_password := security.secret("ssl_key_password")) is not None:
            options["kafka.ssl.key.password"] = key_password
        if not security.ssl_check_hostname:
            options["kafka.ssl.endpoint.identification.algorithm"] = ""
    if security.sasl:
        # Spark redacts sasl.jaas.config in what it logs (KafkaRedactionUtil).
        options["kafka.sasl.mechanism"] = security.sasl_mechanism
        options["kafka.sasl.jaas.config"] = (
            f"{_LOGIN_MODULES[security.sasl_mechanism]} required username={_jaas_quoted(security.sasl_username)} "
            f"password={_jaas_quoted(security.secret('sasl_password'))};")
    return options


def _native_client_options(config: SentinelConfig) -> dict[str, str]:
    # kafka-python names (request_timeout_ms) become Java client names (kafka.request.timeout.ms).
    return {
        **native_security_options(config.kafka.security),
        **{"kafka." + _JAVA_NAMES.get(key, key.replace("_", ".")): str(value)
           for key, value in normalise_client_options(config.kafka.client_options).items()},
    }


def _format_and_options(config: SentinelConfig) -> tuple[str, dict[str, str]]:
    kafka = config.kafka
    if kafka.connector == "spark":
        return "kafka", {"kafka.bootstrap.servers": kafka.bootstrap_servers, **_native_client_options(config)}
    client_options = kafka.client_kwargs()
    secrets = {key: client_options.pop(key) for key in SECRET_CLIENT_OPTIONS if key in client_options}
    return FORMAT_NAME, {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "clientOptions": json.dumps(client_options),
        "clientSecrets": json.dumps(secrets),
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
    else:
        # As many tasks as cores: three partitions on two cores ran in two waves, the last alone.
        tasks = config.kafka.read_tasks if config.kafka.read_tasks is not None else \
            spark.sparkContext.defaultParallelism
        if tasks:
            options["readTasks"] = str(tasks)
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


def topic_end_offsets(config: SentinelConfig, topic: str) -> dict[int, int]:
    """The end offset of each of ``topic``'s partitions now."""
    consumer = kafka_clients.metadata_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    try:
        return kafka_clients.latest_offsets(consumer, topic, kafka_clients.partitions_of(consumer, topic))
    finally:
        consumer.close()


def offsets_read(progress: dict | None, topic: str) -> dict[int, int]:
    """The offsets that a query's progress says its (only) Kafka source has read up to, by partition:
    ``{"0": 42}`` from the Python source, ``{topic: {"0": 42}}`` from Spark's own."""
    if not progress or not progress.get("sources"):
        return {}
    end = progress["sources"][0].get("endOffset") or {}
    if isinstance(end, str):
        end = json.loads(end)
    return {int(p): int(o) for p, o in end.get(topic, end).items()}


def has_read_to(progress: dict | None, topic: str, ends: dict[int, int]) -> bool:
    read = offsets_read(progress, topic)
    return all(read.get(p, -1) >= o for p, o in ends.items())


def process_all_published(query: StreamingQuery, config: SentinelConfig, topic: str, timeout_s: float = 600.0) -> None:
    """Wait until ``query`` has processed everything on ``topic`` up to its end now.

    ``StreamingQuery.processAllAvailable`` alone can return before that: it returns when any
    trigger finds no new data, and a trigger whose source was asked just before the last record
    arrived finds none. (It failed a test once that way: the query stopped at the second of three
    chunks published.) So it is asked again until the query's last progress is at the ends.
    """
    ends = topic_end_offsets(config, topic)
    deadline = time.monotonic() + timeout_s
    query.processAllAvailable()
    while not has_read_to(query.lastProgress, topic, ends):
        if time.monotonic() > deadline:
            raise TimeoutError(f"query {query.name} read {topic} up to {offsets_read(query.lastProgress, topic)}, "
                               f"not to its end {ends}, in {timeout_s:.0f} s")
        query.processAllAvailable()


class InputDataLost(SetupError):
    """The input topic lost offsets the job had not read (deleted by retention, or the topic re-created)."""


# How each connector says it: the project's source names its error, Spark's names its option.
_DATA_LOSS_MARKERS = ("KafkaDataLossError: ", "Some data may have been lost", "failOnDataLoss")


def explain_data_loss(exc: BaseException) -> InputDataLost | None:
    """A query's failure because of lost input offsets, as one line that names this project's key;
    None for any other failure. The query's whole message (a logical plan of a hundred lines)
    goes to the log at DEBUG."""
    text = str(exc)
    if not any(marker in text for marker in _DATA_LOSS_MARKERS):
        return None
    log.debug("the detection query stopped on lost input offsets:\n%s", text)
    lines = [line.strip() for line in text.splitlines()]
    reason = next((line.split("KafkaDataLossError: ", 1)[1] for line in lines if "KafkaDataLossError: " in line),
                  next((line for line in lines if "Some data may have been lost" in line), lines[0] if lines else ""))
    reason = reason.split(" (set failOnDataLoss", 1)[0].strip().rstrip(".")[:300]
    return InputDataLost(f"the input topic lost offsets the job had not read: {reason}. To skip lost offsets and go "
                         "on, set kafka.fail_on_data_loss: false (SENTINEL_KAFKA__FAIL_ON_DATA_LOSS=false); a topic "
                         "re-created on purpose can also start afresh with a new spark.checkpoint_location")
