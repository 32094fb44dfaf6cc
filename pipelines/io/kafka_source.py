"""Kafka for Spark Structured Streaming through PySpark's Python Data Source API.

The Spark Kafka connector jar cannot be fetched everywhere (not on this project's machines), so
this data source, ``format("sentinel_kafka")``, reads and writes Kafka with kafka-python. Rows have
the columns of Spark's own Kafka source (``key, value, topic, partition, offset, timestamp,
timestampType, headers``), so nothing downstream knows which of the two is in use.

Reading: one Spark input partition per Kafka partition and micro-batch (or ``readTasks`` of about
the same size, cutting and joining the partitions' offset ranges); the offsets
``{"<partition>": next_offset}`` live in Spark's checkpoint, which is what makes a restarted query
resume exactly where the last committed batch ended. Kafka consumer groups are not used.

Options (all strings, as Spark passes them):

=======================  ==========================================================================
``kafka.bootstrap.servers``  required, ``host:port[,host:port]``
``subscribe``            required for reading: one topic
``topic``                for writing, when the rows have no ``topic`` column
``startingOffsets``      ``earliest`` (default), ``latest`` or JSON ``{"0": 42}`` (-2 earliest, -1 latest)
``maxOffsetsPerTrigger`` at most this many records per micro-batch, spread over partitions by lag
``failOnDataLoss``       ``true`` (default): stop when offsets were deleted or a topic was reset
``readTasks``            read each micro-batch in this many Spark tasks of about equal size (default:
                         one per Kafka partition with records)
``clientOptions``        JSON object passed to every kafka-python client (security, SASL, TLS, ...)
``clientSecrets``        JSON object of the clients' secrets (``sasl_plain_password``, ``ssl_password``):
                         apart from ``clientOptions`` so that Spark's redaction (its key says
                         "secret") hides them wherever Spark shows options, and kept out of reprs
``pollTimeoutMs``        how long a task waits for records it knows exist (default 120000)
``brokerWaitMs``         how long a task waits on while the broker does not answer at all (default
                         :data:`BROKER_WAIT_MS`, half an hour): it reads on when the broker is back,
                         instead of failing the query
``metadataTimeoutMs``    how long the driver waits for the topic's metadata (default 30000)
=======================  ==========================================================================

One piece: one Spark data source (``KafkaDataSource``, registered as ``sentinel_kafka``), whose
reader and writer share the options above, the clients built from them and the row schema; Spark
pickles the reader's and writer's objects to its Python workers, which import them from here.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa
from kafka import TopicPartition
from kafka.errors import OffsetOutOfRangeError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from pipelines.io import kafka_clients

log = logging.getLogger(__name__)

FORMAT_NAME = "sentinel_kafka"
# How long a read task waits on while the broker does not answer at all (``brokerWaitMs``); the
# detection job's sinks wait as long for a broker that does not take their incidents.
BROKER_WAIT_MS = 30 * 60_000

# Spark's own Kafka source schema (with includeHeaders=true).
KAFKA_ROW_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)
_ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
_ROWS_PER_ARROW_BATCH = 10_000
EARLIEST, LATEST = -2, -1


class KafkaDataLossError(RuntimeError):
    """Offsets the query still needed are gone (retention, topic re-creation)."""


@dataclass(frozen=True)
class _ClientSpec:
    bootstrap_servers: str
    client_options_json: str
    client_secrets_json: str = field(default="{}", repr=False)

    @property
    def client_options(self) -> dict[str, Any]:
        return {**json.loads(self.client_options_json), **json.loads(self.client_secrets_json)}


def _json_object_option(options: Mapping[str, str], name: str) -> str:
    try:
        parsed = json.loads(options.get(name, "{}"))
    except json.JSONDecodeError as exc:
        # The message leaves the value out: it may be a secret.
        raise ValueError(f"option '{name}' is not a JSON object ({exc.msg} at character {exc.pos})") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"option '{name}' must be a JSON object")
    return json.dumps(parsed, sort_keys=True)


def _client_spec(options: Mapping[str, str]) -> _ClientSpec:
    servers = options.get("kafka.bootstrap.servers") or options.get("bootstrap.servers")
    if not servers:
        raise ValueError("option 'kafka.bootstrap.servers' is required")
    return _ClientSpec(servers, _json_object_option(options, "clientOptions"),
                       _json_object_option(options, "clientSecrets"))


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ValueError(f"option {name!r} must be true or false, got {value!r}")
    return value.lower() == "true"


# One consumer and one producer per Python worker process and client spec: Spark reuses Python
# workers across tasks, and a kafka-python client costs a metadata round trip to create.
_WORKER_CONSUMERS: dict[_ClientSpec, Any] = {}
_WORKER_PRODUCERS: dict[_ClientSpec, Any] = {}


def _worker_consumer(spec: _ClientSpec):
    consumer = _WORKER_CONSUMERS.get(spec)
    if consumer is None:
        consumer = kafka_clients.make_consumer(
            spec.bootstrap_servers,
            spec.client_options,
            max_poll_records=_ROWS_PER_ARROW_BATCH,
            # A consumer fetches ahead of what it returns, and a task stops at its range's end:
            # what was fetched past it is thrown away, so small reads pay for a large fetch.
            fetch_max_bytes=4 * 1024 * 1024,
            max_partition_fetch_bytes=1024 * 1024,
        )
        _WORKER_CONSUMERS[spec] = consumer
    return consumer


def _worker_producer(spec: _ClientSpec):
    producer = _WORKER_PRODUCERS.get(spec)
    if producer is None:
        producer = kafka_clients.make_producer(spec.bootstrap_servers, spec.client_options)
        _WORKER_PRODUCERS[spec] = producer
    return producer


@dataclass(frozen=True)
class KafkaPartitionRange:
    """Offsets ``[start, end)`` of one Kafka partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


class KafkaReadTask(InputPartition):
    """The work of one Spark task: offset ranges of one or more Kafka partitions, read in turn."""

    def __init__(self, ranges: Sequence[KafkaPartitionRange]):
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)


def split_evenly(ranges: Sequence[KafkaPartitionRange], tasks: int) -> list[list[KafkaPartitionRange]]:
    """``ranges`` cut into at most ``tasks`` groups of about the same number of records, each a run
    of consecutive offsets (a partition's range may be cut between two groups). A micro-batch of
    three partitions on two cores otherwise runs in two waves, the third task alone."""
    total = sum(r.size for r in ranges)
    share = -(-total // tasks) if total else 0
    groups: list[list[KafkaPartitionRange]] = [[]]
    room = share
    for r in ranges:
        start = r.start
        while start < r.end:
            if room == 0:
                groups.append([])
                room = share
            end = min(r.end, start + room)
            groups[-1].append(KafkaPartitionRange(r.topic, r.partition, start, end))
            room -= end - start
            start = end
    return [g for g in groups if g]


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]):
        self.spec = _client_spec(options)
        self.topic = options.get("subscribe", "")
        if not self.topic or "," in self.topic:
            raise ValueError("option 'subscribe' must name exactly one topic")
        self.starting = options.get("startingOffsets", "earliest").strip()
        max_offsets = options.get("maxOffsetsPerTrigger")
        self.max_offsets = int(max_offsets) if max_offsets else None
        if self.max_offsets is not None and self.max_offsets < 1:
            raise ValueError("option 'maxOffsetsPerTrigger' must be >= 1")
        self.fail_on_data_loss = _flag(options, "failOnDataLoss", True)
        self.poll_timeout_s = float(options.get("pollTimeoutMs", "120000")) / 1000.0
        self.broker_wait_s = float(options.get("brokerWaitMs", BROKER_WAIT_MS)) / 1000.0
        self.metadata_timeout_s = float(options.get("metadataTimeoutMs", "30000")) / 1000.0
        read_tasks = options.get("readTasks")
        self.read_tasks = int(read_tasks) if read_tasks else None
        if self.read_tasks is not None and self.read_tasks < 1:
            raise ValueError("option 'readTasks' must be >= 1")
        self._consumer = None
        self._available_now_target: dict[str, int] | None = None
        self._last_latest: dict[str, int] | None = None

    # --- driver side -------------------------------------------------------------------------

    @property
    def consumer(self):
        if self._consumer is None:
            self._consumer = kafka_clients.metadata_consumer(self.spec.bootstrap_servers, self.spec.client_options)
        return self._consumer

    def _partitions(self) -> list[int]:
        return kafka_clients.partitions_of(self.consumer, self.topic, self.metadata_timeout_s)

    def _bounds(self) -> tuple[dict[int, int], dict[int, int]]:
        partitions = self._partitions()
        return (
            kafka_clients.earliest_offsets(self.consumer, self.topic, partitions),
            kafka_clients.latest_offsets(self.consumer, self.topic, partitions),
        )

    def initialOffset(self) -> dict:
        earliest, latest = self._bounds()
        if self.starting == "earliest":
            return {str(p): o for p, o in earliest.items()}
        if self.starting == "latest":
            return {str(p): o for p, o in latest.items()}
        try:
            requested = {int(p): int(o) for p, o in json.loads(self.starting).items()}
        except (ValueError, AttributeError, TypeError) as exc:
            raise ValueError(
                f"startingOffsets must be earliest, latest or JSON like {{\"0\": 42}}, got {self.starting!r}"
            ) from exc
        unknown = set(requested) - set(earliest)
        if unknown:
            raise ValueError(f"startingOffsets names partitions {sorted(unknown)} that {self.topic} does not have")
        offsets = {}
        for p in earliest:
            wanted = requested.get(p, EARLIEST)
            offsets[str(p)] = earliest[p] if wanted == EARLIEST else latest[p] if wanted == LATEST else wanted
        return offsets

    def prepareForTriggerAvailableNow(self) -> None:
        latest = kafka_clients.latest_offsets(self.consumer, self.topic, self._partitions())
        self._available_now_target = {str(p): o for p, o in latest.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_offsets) if self.max_offsets else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        # One broker round trip where it can be (a fetch from where the query is, for the
        # high-watermarks; a partition's start only for one new to the query): each is slow on a
        # broker busy with a producer.
        partitions = self._partitions()
        latest_by_int = kafka_clients.latest_offsets(self.consumer, self.topic, partitions,
                                                     known={int(p): o for p, o in start.items()})
        latest = {str(p): o for p, o in latest_by_int.items()}
        if self._available_now_target is not None:
            latest = {p: min(o, self._available_now_target[p]) for p, o in latest.items() if p in self._available_now_target}
        self._last_latest = latest

        # Partitions added to the topic since the query started are read from their beginning.
        start = dict(start)
        added = [int(p) for p in latest if p not in start]
        if added:
            for p, offset in kafka_clients.earliest_offsets(self.consumer, self.topic, added).items():
                start[str(p)] = offset
        for p, offset in list(start.items()):
            if p not in latest:
                self._data_loss(f"partition {p} of {self.topic} disappeared")
                continue
            if offset > latest[p]:
                self._data_loss(
                    f"{self.topic}[{p}] ends at {latest[p]} but the query already read up to {offset}: "
                    "the topic was deleted and re-created, or the broker lost data"
                )
                start[p] = latest[p]
        end = {p: max(latest[p], start[p]) for p in latest}
        if isinstance(limit, ReadMaxRows):
            end = _rate_limited(start, end, limit.max_rows)
        return end

    def reportLatestOffset(self) -> dict | None:
        return self._last_latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = []
        for p, end_offset in sorted(end.items(), key=lambda item: int(item[0])):
            start_offset = start.get(p)
            if start_offset is None:
                start_offset = kafka_clients.earliest_offsets(self.consumer, self.topic, [int(p)])[int(p)]
            if end_offset > start_offset:
                ranges.append(KafkaPartitionRange(self.topic, int(p), int(start_offset), int(end_offset)))
        if self.read_tasks is None:
            return [KafkaReadTask([r]) for r in ranges]
        return [KafkaReadTask(group) for group in split_evenly(ranges, self.read_tasks)]

    def _data_loss(self, message: str) -> None:
        if self.fail_on_data_loss:
            raise KafkaDataLossError(message + " (set failOnDataLoss=false to skip lost offsets)")
        log.warning("data loss, continuing: %s", message)

    def commit(self, end: dict) -> None:
        # Offsets live in Spark's checkpoint; Kafka needs no commit.
        pass

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # --- executor side -----------------------------------------------------------------------

    def read(self, partition: KafkaReadTask) -> Iterator[pa.RecordBatch]:
        yield from read_ranges(self.spec, partition.ranges, self.fail_on_data_loss, self.poll_timeout_s,
                               self.broker_wait_s)


def _rate_limited(start: dict, end: dict, max_rows: int) -> dict:
    """Spread ``max_rows`` over partitions in proportion to their lag, always making progress."""
    lag = {p: end[p] - start[p] for p in end}
    total = sum(lag.values())
    if total <= max_rows:
        return end
    limited = {p: start[p] + (lag[p] * max_rows) // total for p in end}
    leftover = max_rows - sum(limited[p] - start[p] for p in end)
    for p in sorted(end, key=lambda q: -(end[q] - limited[q])):
        if leftover <= 0:
            break
        if limited[p] < end[p]:
            limited[p] += 1
            leftover -= 1
    return limited


def read_ranges(
    spec: _ClientSpec, ranges: Sequence[KafkaPartitionRange], fail_on_data_loss: bool, poll_timeout_s: float,
    broker_wait_s: float = 0.0,
) -> Iterator[pa.RecordBatch]:
    """The records of ``ranges`` (each of a different partition) as Arrow batches, each partition's
    in offset order. The partitions are fetched together, one request for all of them, and a
    partition whose range is read is paused: each fetch is a broker round trip, slow on a busy
    broker.

    No records for ``poll_timeout_s`` fail the read, unless the broker does not answer at all: then
    it waits on, up to ``broker_wait_s`` in all, and reads on when the broker is back (a failed
    task fails the streaming query, which only a restart brings back)."""
    consumer = _worker_consumer(spec)
    nonempty = [r for r in ranges if r.end > r.start]
    wanted = {TopicPartition(r.topic, r.partition): r for r in nonempty}
    if len(wanted) < len(nonempty):
        raise ValueError("read_ranges: two ranges of one partition")
    consumer.assign(list(wanted))
    for tp, part in wanted.items():
        consumer.seek(tp, part.start)
    position = {tp: part.start for tp, part in wanted.items()}
    columns: dict[str, list] = {name: [] for name in _ARROW_SCHEMA.names}
    last_progress = waiting_since = time.monotonic()
    # After an outage the consumer reconnects at most its reconnect backoff apart: the read gives
    # it that long, or the poll timeout if longer, once the broker answers again.
    after_outage = False
    grace_s = consumer.config.get("reconnect_backoff_max_ms", 0) / 1000.0 + poll_timeout_s
    try:
        while True:
            done = [tp for tp in wanted if position[tp] >= wanted[tp].end]
            if len(done) == len(wanted):
                break
            if done:
                consumer.pause(*done)  # no more fetches (and no records) of a finished partition
            try:
                fetched = consumer.poll(timeout_ms=500, max_records=_ROWS_PER_ARROW_BATCH)
            except OffsetOutOfRangeError as exc:
                _skip_deleted(consumer, wanted, position, fail_on_data_loss, exc)
                continue
            for tp, records in fetched.items():
                part = wanted.get(tp)
                if part is None:
                    continue
                for record in records:
                    if record.offset >= part.end:
                        break
                    if record.offset < position[tp]:
                        continue  # a batch re-delivered from before the seek position
                    columns["key"].append(record.key)
                    columns["value"].append(record.value)
                    columns["topic"].append(part.topic)
                    columns["partition"].append(part.partition)
                    columns["offset"].append(record.offset)
                    columns["timestamp"].append(record.timestamp * 1000 if record.timestamp is not None else None)
                    columns["timestampType"].append(record.timestamp_type)
                    columns["headers"].append([{"key": k, "value": v} for k, v in (record.headers or [])])
                    position[tp] = record.offset + 1
            for tp, part in wanted.items():
                if position[tp] < part.end:
                    # Offsets can skip (compaction, transaction markers): the consumer's position is authoritative.
                    position[tp] = max(position[tp], min(consumer.position(tp), part.end))
            if fetched:
                last_progress = waiting_since = time.monotonic()
                after_outage = False
            elif time.monotonic() - last_progress > (grace_s if after_outage else poll_timeout_s):
                if time.monotonic() - waiting_since < broker_wait_s and \
                        not kafka_clients.broker_answers(spec.bootstrap_servers, spec.client_options):
                    log.warning("the broker at %s does not answer: this read waits for it (%.0f s so far)",
                                spec.bootstrap_servers, time.monotonic() - waiting_since)
                    last_progress, after_outage = time.monotonic(), True
                    continue
                behind = ", ".join(f"{tp.topic}[{tp.partition}] at offset {position[tp]} (needs up to "
                                   f"{wanted[tp].end - 1})" for tp in wanted if position[tp] < wanted[tp].end)
                raise TimeoutError(f"no records for {poll_timeout_s:.0f}s from {behind}")
            if len(columns["offset"]) >= _ROWS_PER_ARROW_BATCH:
                yield _to_arrow(columns)
                columns = {name: [] for name in _ARROW_SCHEMA.names}
    finally:
        consumer.resume(*wanted)  # the worker's consumer serves the next task unpaused
    if columns["offset"]:
        yield _to_arrow(columns)


def _skip_deleted(consumer, wanted: Mapping[TopicPartition, KafkaPartitionRange], position: dict,
                  fail_on_data_loss: bool, exc: OffsetOutOfRangeError) -> None:
    """Offsets deleted before they were read (retention): fail, or go on from the earliest left."""
    unread = [tp for tp in wanted if position[tp] < wanted[tp].end]
    earliest = consumer.beginning_offsets(unread)
    lost = [tp for tp in unread if earliest[tp] > position[tp]]
    if not lost:
        raise exc  # out of range for another reason: nothing here to skip to
    for tp in lost:
        message = (f"{tp.topic}[{tp.partition}] offsets {position[tp]}..{earliest[tp] - 1} were deleted "
                   "before they were read (retention?)")
        if fail_on_data_loss:
            raise KafkaDataLossError(message + " (set failOnDataLoss=false to skip lost offsets)") from exc
        log.warning("data loss, continuing: %s", message)
        position[tp] = min(earliest[tp], wanted[tp].end)
        if position[tp] < wanted[tp].end:
            consumer.seek(tp, position[tp])


def _to_arrow(columns: dict[str, list]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(columns, schema=_ARROW_SCHEMA)


# --- the sink ----------------------------------------------------------------------------------


@dataclass
class KafkaCommitMessage(WriterCommitMessage):
    records: int


def _check_sink_schema(schema: StructType, default_topic: str | None) -> None:
    names = set(schema.fieldNames())
    if "value" not in names:
        raise ValueError("a Kafka sink needs a 'value' column (string or binary)")
    if "topic" not in names and not default_topic:
        raise ValueError("a Kafka sink needs a 'topic' column or the 'topic' option")


def _encode(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")


def write_arrow_batches(spec: _ClientSpec, default_topic: str | None, batches: Iterator[pa.RecordBatch]) -> int:
    """Send every row to Kafka and wait for all acknowledgements; raise on the first failure.

    A raised error fails the Spark task, so the micro-batch is retried: delivery is at least once.
    """
    producer = _worker_producer(spec)
    futures = []
    for batch in batches:
        data = batch.to_pydict()
        n = batch.num_rows
        values = data["value"]
        keys = data.get("key", [None] * n)
        topics = data.get("topic", [default_topic] * n)
        partitions = data.get("partition", [None] * n)
        headers = data.get("headers", [None] * n)
        for i in range(n):
            topic = topics[i] or default_topic
            record_headers = [(h["key"], _encode(h["value"])) for h in headers[i]] if headers[i] else None
            futures.append(
                producer.send(
                    topic,
                    value=_encode(values[i]),
                    key=_encode(keys[i]),
                    partition=partitions[i],
                    headers=record_headers,
                )
            )
    producer.flush()
    for future in futures:
        if future.failed():
            raise RuntimeError(f"Kafka rejected a record: {future.exception}")
    return len(futures)


class _KafkaArrowSink:
    """What the stream and batch writers share: options, schema check, and the Arrow write."""

    def __init__(self, options: Mapping[str, str], schema: StructType):
        self.spec = _client_spec(options)
        self.topic = options.get("topic")
        _check_sink_schema(schema, self.topic)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:
        return KafkaCommitMessage(write_arrow_batches(self.spec, self.topic, iterator))


class KafkaStreamWriter(_KafkaArrowSink, DataSourceStreamArrowWriter):
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.debug("batch %d: %d records written to Kafka", batchId, sum(m.records for m in messages if m))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("batch %d aborted; it will be re-sent (at-least-once)", batchId)


class KafkaBatchWriter(_KafkaArrowSink, DataSourceArrowWriter):
    pass


class KafkaDataSource(DataSource):
    """``spark.readStream.format("sentinel_kafka")`` and ``df.writeStream.format("sentinel_kafka")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return KAFKA_ROW_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        return KafkaStreamWriter(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> KafkaBatchWriter:
        return KafkaBatchWriter(self.options, schema)
