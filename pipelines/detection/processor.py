"""The detection job's one stateful stage: Kafka records in, incidents, dead letters and feature
rows out, with every Flink job's state in Spark's state store.

:func:`detect` keys the input records by Flink job (read from their JSON by Spark itself, with a
plausible event time for the watermark) and runs :class:`DetectionProcessor`, Spark's
``transformWithState``, on the executors. Per micro-batch and job, ``handleInputRows`` validates
the job's records in the order they arrived and consumes the usable ones
(:meth:`FlinkJobState.read`). Scoring is one vectorised call per model over every job of the
partition, not one per job (a scikit-learn call costs about a millisecond whatever its size), so
each job registers a timer due at once, and Spark's timer phase, which follows the input rows in
the same task, scores the partition's rows and steps the policy of all its jobs
(:func:`~pipelines.detection.flink_job.decide`) at the first timer, then gives each job its
incidents and writes its state at its own timer. The models are loaded once per Python worker and
follow their alias (:func:`~pipelines.detection.scoring.worker_champions`).

Each job has one state value (feature state machine, policy entry, eviction time) and one
eviction timer: a job silent for the idle timeout, once the watermark has passed that, is
forgotten, keeping only an incident still open. Records whose JSON names no job are validated
here too, without state, and come out as dead letters.

Output rows: ``kind`` (``incident``, ``dead_letter``, ``features``, ``late``, ``sample``,
``models``), ``key`` (the incident id, the dead letter's record key, the late reason),
``payload`` (JSON; for ``features`` an Arrow stream of the partition's feature rows) and
``count``. :mod:`pipelines.detection.job` writes them to their sinks.
"""

from __future__ import annotations

from typing import Iterator

import orjson
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from feature_store.definitions import feature_row_schema
from pipelines.detection.flink_job import (FlinkJobState, ReadRules, Reading, Record, decide, feature_frame,
                                           job_key)
from pipelines.detection.policy import PolicySettings
from pipelines.detection.scoring import worker_champions
from pipelines.detection.validation import EARLIEST_TS

INCIDENT, DEAD_LETTER, FEATURES, LATE, SAMPLE, MODELS = "incident", "dead_letter", "features", "late", "sample", "models"
OUTPUT_SCHEMA = StructType([StructField("kind", StringType()), StructField("key", StringType()),
                            StructField("payload", BinaryType()), StructField("count", LongType())])
STATE_SCHEMA = StructType([StructField("state", BinaryType())])
FEATURE_ROW_ARROW_SCHEMA = to_arrow_schema(feature_row_schema())


def detection_input(records: DataFrame, max_future_ms: int) -> DataFrame:
    """Kafka records keyed by the Flink job their JSON names, with a plausible event time.

    Spark reads ``cluster``, ``job_id`` and ``ts`` itself (no Python on the way to the shuffle).
    The event time is null where ``ts`` is not a plausible epoch millisecond (before 2001, or
    further in the future than clock skew explains), so that one bad record cannot move the
    watermark; such records still reach the processor, which names their fault.
    """
    head = F.from_json(F.col("value").cast("string"), "cluster string, job_id string, ts long")
    plausible = head["ts"].between(EARLIEST_TS, F.unix_millis(F.current_timestamp()) + max_future_ms)
    return records.select(head["cluster"].alias("cluster"), head["job_id"].alias("job_id"),
                          F.when(plausible, F.timestamp_millis(head["ts"])).alias("event_time"),
                          "key", "value", "topic", "partition", "offset",
                          F.unix_millis("timestamp").alias("kafka_timestamp_ms"))


def detect(records: DataFrame, config) -> DataFrame:
    """The streaming detection over Kafka records: one output row per incident event, dead letter,
    late count, data-quality sample, and per partition and micro-batch its feature rows."""
    keyed = detection_input(records, int(config.detection.max_future_s * 1000))
    return (keyed.withWatermark("event_time", config.features.watermark_delay)
            .groupBy("cluster", "job_id")
            .transformWithStateInPandas(statefulProcessor=DetectionProcessor(config), outputStructType=OUTPUT_SCHEMA,
                                        outputMode="Append", timeMode="EventTime"))


class DetectionProcessor(StatefulProcessor):
    def __init__(self, config):
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("job", STATE_SCHEMA)
        self.rules = ReadRules.from_config(self.config)
        self.settings = PolicySettings.from_config(self.config)
        self.pending: dict[str, FlinkJobState] = {}  # this task's jobs that had records, until their timer
        self.readings: dict[str, Reading] = {}
        self.incidents: dict[str, list[dict]] | None = None  # each pending job's, once decided

    # --- records of one job ------------------------------------------------------------------

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        records = sorted((Record(*fields) for frame in rows for fields in zip(
            frame["value"].tolist(), frame["key"].tolist(), frame["topic"].tolist(), frame["partition"].tolist(),
            frame["offset"].tolist(), [None if t != t else int(t) for t in frame["kafka_timestamp_ms"].tolist()])),
            key=lambda r: (r.partition, r.offset))
        cluster, job_id = key
        now_ms = timerValues.getCurrentProcessingTimeInMs()  # the batch's time: a re-run judges alike
        if cluster is None or job_id is None:
            # Records whose JSON names no job: each is a dead letter (with the reason it cannot be used).
            yield from _outputs(FlinkJobState().read(records, now_ms, self.rules, key=(cluster, job_id)))
            return
        job = self._load() or FlinkJobState()
        reading = job.read(records, now_ms, self.rules, key=(cluster, job_id))
        name = job_key(cluster, job_id)
        self.pending[name], self.readings[name] = job, reading
        # Due at once: the timer phase of this same task scores and decides every pending job.
        self.handle.registerTimer(max(timerValues.getCurrentWatermarkInMs(), 0))
        yield from _outputs(reading)

    # --- the timer phase -----------------------------------------------------------------------

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        if self.incidents is None and self.pending:
            yield from self._decide()
        name = job_key(*key)
        job = self.pending.pop(name, None)
        if job is not None:
            incidents = self.incidents.pop(name, [])
            if incidents:
                yield _frame([(INCIDENT, i["incident_id"], orjson.dumps(i), 1) for i in incidents])
            job.compact()
            self._settle(job, watermark)
            return
        job = self._load()
        if job is not None and job.evict_at == expiredTimerInfo.getExpiryTimeInMs():
            job.evict_at = None  # the eviction timer, firing now; any other is a decision's, already served
            self._settle(job, watermark)

    def _decide(self) -> Iterator[pd.DataFrame]:
        rows = feature_frame([row for name in self.pending for row in self.readings[name].rows])
        self.readings.clear()
        if rows.empty:
            self.incidents = {}
            return
        cache = worker_champions(self.config)
        self.incidents = decide(self.pending, rows, cache.ready(), self.settings)
        yield _frame([(FEATURES, None, _arrow_stream(rows), len(rows)),
                      (MODELS, cache.registry_error,
                       orjson.dumps({f: [m.name, m.version] for f, m in cache.models.items()}), len(rows))])

    def _settle(self, job: FlinkJobState, watermark: int) -> None:
        """Keep the job with one eviction timer, or forget it once it has been silent for the idle
        timeout as far as the watermark knows."""
        if job.evict_at is not None and job.evict_at <= watermark:
            job.evict_at = None  # its timer expires in this batch: counted as fired
        due = job.due(self.rules)
        if due is not None and watermark >= due:
            job = job.forgotten()
            if job is None:
                self.state.clear()
                return
        elif due is not None and job.evict_at is None:
            self.handle.registerTimer(due)
            job.evict_at = due
        self.state.update((job.to_bytes(),))

    def _load(self) -> FlinkJobState | None:
        return FlinkJobState.from_bytes(self.state.get()[0]) if self.state.exists() else None

    def close(self) -> None:
        pass


def _outputs(reading: Reading) -> Iterator[pd.DataFrame]:
    rows = ([(DEAD_LETTER, letter["key"], orjson.dumps(letter), 1) for letter in reading.dead_letters]
            + [(LATE, reason, None, count) for reason, count in reading.late.items()]
            + [(SAMPLE, None, value, 1) for value in reading.samples])
    if rows:
        yield _frame(rows)


def _frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=OUTPUT_SCHEMA.fieldNames())


def _arrow_stream(rows) -> bytes:
    table = pa.Table.from_pandas(rows.loc[:, FEATURE_ROW_ARROW_SCHEMA.names], schema=FEATURE_ROW_ARROW_SCHEMA,
                                 preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_feature_rows(payload: bytes) -> pa.Table:
    """The feature rows of a ``features`` output row."""
    return pa.ipc.open_stream(payload).read_all()
