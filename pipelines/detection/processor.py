"""The detection job's one stateful stage: Kafka records in, incidents, dead letters and feature
rows out, with every Flink job's state in Spark's state store.

:func:`detect` keys the input records by Flink job (read by Spark itself, from the record key or
the JSON, with a plausible event time for the watermark) and runs :class:`DetectionProcessor`,
Spark's ``transformWithState``, on the executors. Per micro-batch and job, ``handleInputRows``
validates the job's records in the order they arrived and consumes the usable ones
(:meth:`FlinkJobState.read`). The Row flavour, not ``transformWithStateInPandas``: the pandas
flavour catches up a backlog a little faster but runs a real-time fleet's small batches slower
(see BENCHMARKS.md, "2026-11-26, 8443811 and da5b71f: the input's keying, CPU per event, the Row
flavour, state writes"). Scoring is one vectorised call per model over every job of the partition,
not one per job (a scikit-learn call costs about the same whatever its size), so each state key
registers a timer due at once, and Spark's timer phase, which follows the
input rows in the same task, scores the partition's rows and steps the policy of all its jobs
(:func:`~pipelines.detection.flink_job.decide`) at the first timer, then gives each key its
incidents and writes its jobs' states at its own timer. The models are loaded once per Python
worker and follow their alias (:func:`~pipelines.detection.champions.worker_champions`).

A state key is a *bucket* of Flink jobs (``detection.state_buckets``, by a hash of the job), not
one job: each key costs a handful of round trips to Spark's state server per micro-batch, while
its Flink jobs' states are written in one exchange and read, where this worker did not write them
last, in another
(:class:`~pipelines.detection.spark_state.JobStates`). The buckets' keys are chosen so that each
shuffle partition holds as many as the others (:func:`~pipelines.detection.spark_state.state_keys`). A
bucket also keeps when each of its jobs is due to be forgotten and one timer at the earliest: a
job silent for the idle timeout, once the watermark has passed that, is forgotten, keeping only
an incident still open. Records whose JSON names no job are validated
here too, without state, and come out as dead letters.

What the processor relies on of Spark beyond its public API (the state server's protocol, its
hash partitioning) is in :mod:`pipelines.detection.spark_state`; a job's stored state, its layout
and versions, in :mod:`pipelines.detection.job_state`.

Spark's state store holds every job's state; a Python worker also keeps the states it wrote,
parsed, with the random version it wrote beside the job's due time, and reuses one only while the
bucket still names that version (parsing a state cost more than the rest of the job's batch).

Output rows: ``kind`` (``incident``, ``dead_letter``, ``features``, ``late``, ``sample``,
``models``), ``key`` (the incident id, the dead letter's record key, the late reason),
``payload`` (JSON; for ``features`` an Arrow stream of up to 20,000 of the partition's feature rows) and
``count`` (:mod:`pipelines.detection.outputs`). :mod:`pipelines.detection.job` writes them to
their sinks; the feature log writer's Python workers, which load no models, are not this one's.
"""

from __future__ import annotations

import os
import random
from collections import OrderedDict
from typing import Iterator

import orjson
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from pipelines.detection.champions import models_payload, worker_champions
from pipelines.detection.flink_job import (FlinkJobState, ReadRules, Reading, Record, decide, feature_frame,
                                           job_key)
from pipelines.detection.job_state import StoredStateError
from pipelines.detection.outputs import (DEAD_LETTER, FEATURE_ROWS_PER_PAYLOAD, FEATURES, INCIDENT, LATE, MODELS,
                                         OUTPUT_SCHEMA, SAMPLE, WORKER_SCHEMA, feature_log_writer_ready,
                                         feature_rows_payload)
from pipelines.detection.spark_state import DUES, JobStates, StoredValue, check_worker_pyspark, state_keys
from pipelines.detection.validation import EARLIEST_TS
from pipelines.detection.worker_gc import COLLECTOR, CollectorBetweenTasks
from pipelines.incidents.policy import PolicySettings, resolve_gone

# The input topic's key, ``<cluster>/<job_id>`` (a Flink JobID is 32 hex digits).
CONTRACT_KEY = r"^(.+)/([0-9a-f]{32})$"
# A top-level integer ``ts`` ahead of any nested value, escape or bracket in the document (where
# the contract's producers write it): the event time read without parsing the JSON. What this
# cannot vouch for (``ts`` after the vertices, a string before it with an escape, a fraction or an
# exponent, 19 digits or more) is read by Spark's JSON path instead. Valid JSON has no other
# ``"ts":`` there: without a backslash a string holds no quote, and a string before a colon is a key.
# A record cut short after such a ``ts`` still gives it, as a whole one would (the processor makes
# the record a dead letter; its event time moves the watermark no further than a valid one's could).
LEADING_TS = r'^\{[^{}\[\]\\]*?"ts"\s*:\s*(-?[0-9]{1,18})\s*[,}]'


def detection_input(records: DataFrame, max_future_ms: int) -> DataFrame:
    """Kafka records keyed by the Flink job they are about, with a plausible event time.

    Spark reads the job from the record's key as the input contract sets it (``<cluster>/<job_id>``;
    from the JSON when a producer keys otherwise) and the event time from the JSON, with no Python
    on the way to the shuffle. The event time is null where ``ts`` is not a plausible epoch
    millisecond (before 2001, or further in the future than clock skew explains, or not an
    integer), so that one bad record cannot move the watermark or fail the micro-batch; such
    records still reach the processor, which names their fault, as it does for an event whose JSON
    names another job than its key.
    """
    key, value = F.col("key").cast("string"), F.col("value").cast("string")
    keyed = key.rlike(CONTRACT_KEY)
    # A key that matches ends in "/" and the job's 32 digits: cut, not matched twice more (the
    # JVM's cost per record; see BENCHMARKS.md, "2026-11-26, 8443811 and da5b71f: the input's
    # keying, CPU per event, the Row flavour, state writes").
    length = F.length(key)
    # The event time by a pattern that stops at the field: Spark's JSON path tokenises the whole
    # document (the same entry of BENCHMARKS.md).
    leading_ts = F.nullif(F.regexp_extract(value, LEADING_TS, 1), F.lit(""))
    # Two projections: Spark keeps one that would repeat the JSON read apart, so it is read once.
    read = records.select(
        F.when(keyed, key.substr(F.lit(1), length - 33)).otherwise(F.get_json_object(value, "$.cluster"))
        .alias("cluster"),
        F.when(keyed, key.substr(length - 31, F.lit(32))).otherwise(F.get_json_object(value, "$.job_id"))
        .alias("job_id"),
        # try_cast: a "ts" that is no integer is the processor's to name (as a dead letter), not a
        # failed micro-batch (Spark's ANSI cast raises).
        F.coalesce(leading_ts, F.get_json_object(value, "$.ts")).try_cast("long").alias("ts"),
        "key", "value", "topic", "partition", "offset", F.unix_millis("timestamp").alias("kafka_timestamp_ms"))
    # The wall clock read per record, not current_timestamp(): Spark writes a micro-batch's timestamp
    # into the stage's generated Java as a constant, so every micro-batch compiled the stage anew
    # (twice, by CodeGenerator's log), and each new class runs interpreted until the JIT compiles
    # it. reflect() is evaluated outside the generated code. A record is read after its micro-batch
    # starts, so this clock is a few seconds at most ahead of the batch time the processor judges
    # ``ts`` by.
    now_ms = F.reflect(F.lit("java.lang.System"), F.lit("currentTimeMillis")).cast("long")
    plausible = F.col("ts").between(EARLIEST_TS, now_ms + max_future_ms)
    return read.select("cluster", "job_id", F.when(plausible, F.timestamp_millis("ts")).alias("event_time"),
                       "key", "value", "topic", "partition", "offset", "kafka_timestamp_ms")


def detect(records: DataFrame, config, state_partitions: int) -> DataFrame:
    """The streaming detection over Kafka records: one output row per incident event, dead letter,
    late count, data-quality sample, and per partition and micro-batch its feature rows.
    ``state_partitions``: the query's shuffle partitions (its checkpoint's, once it has one)."""
    keyed = detection_input(records, int(config.detection.max_future_s * 1000))
    # Flink jobs in buckets: every state key costs a few round trips to Spark's state server per
    # micro-batch, a Flink job in a bucket only one or two.
    buckets = config.detection.state_buckets
    bucket = F.pmod(F.xxhash64("cluster", "job_id"), F.lit(buckets)) + 1
    keys = F.array(*[F.lit(k) for k in state_keys(buckets, state_partitions)])
    return (keyed.withWatermark("event_time", config.features.watermark_delay)
            .select(F.element_at(keys, bucket.cast("int")).alias("bucket"), packed_record().alias("record"))
            .groupBy("bucket")
            .transformWithState(statefulProcessor=DetectionProcessor(config), outputStructType=OUTPUT_SCHEMA,
                                outputMode="Append", timeMode="EventTime"))


def packed_record() -> Column:
    """What the processor reads of a :func:`detection_input` record, as one binary value: its
    Python worker builds a record's Row from one Arrow scalar per column, so the event time
    (which only the watermark needs) stays behind and the rest travels packed (see BENCHMARKS.md,
    "2026-11-26, e99049f and 9c7fdad: job states read back in one exchange, records as one binary
    value"). Without the event time Spark drops nothing behind the watermark before the
    processor, which counts such events late itself. The layout (:func:`unpacked_record` reads
    it): a header ``partition:offset:timestamp:n_cluster:n_job_id:n_key:n_value:topic`` and a
    newline, then the cluster, job id, key and value; each ``n_`` their length in bytes, -1 for
    null; the timestamp empty when Kafka gave none (a topic name has neither ``:`` nor a newline)."""
    def length(name: str) -> Column:
        return F.coalesce(F.octet_length(name).cast("string"), F.lit("-1"))

    header = F.concat_ws(":", F.col("partition").cast("string"), F.col("offset").cast("string"),
                         F.coalesce(F.col("kafka_timestamp_ms").cast("string"), F.lit("")),
                         *(length(name) for name in PACKED_FIELDS), "topic")
    return F.concat(F.concat(header, F.lit("\n")).cast("binary"),
                    *(F.coalesce(F.col(name).cast("binary"), F.lit(bytearray())) for name in PACKED_FIELDS))


PACKED_FIELDS = ("cluster", "job_id", "key", "value")


def unpacked_record(packed: bytes) -> tuple[str | None, str | None, Record]:
    """(cluster, job id, record) of a :func:`packed_record`. A cluster or job id that is not
    UTF-8 (from a record key) is read with replacement characters, the same way every time."""
    end = packed.index(b"\n")
    partition, offset, timestamp, *lengths, topic = packed[:end].decode().split(":", 7)
    fields: list[bytes | None] = []
    at = end + 1
    for length in map(int, lengths):
        fields.append(None if length < 0 else packed[at:at + length])
        at += max(length, 0)
    cluster, job_id, key, value = fields
    return (None if cluster is None else cluster.decode("utf-8", "replace"),
            None if job_id is None else job_id.decode("utf-8", "replace"),
            Record(value, key, topic, int(partition), int(offset), int(timestamp) if timestamp else None))


def load_models_on_workers(spark, config) -> list[dict]:
    """Have the Python workers the detection query will use import what they run, and the
    stateful processor's load the champions, before its first micro-batch, which otherwise
    spends 10-15 s on it while the first events wait: a batch query of the same shape (a
    stateful processor, then a ``mapInArrow`` in the feature log writer's place) with a task per
    shuffle partition. Spark keeps Python workers apart by kind (a stateful processor's are not a
    ``mapInArrow``'s) and reuses them; the feature log writer's load no models.
    Returns each worker's process id and model versions (None for the writer's); raises
    :class:`~models.registry.ModelUnavailable` when a worker cannot load any model."""
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))  # a stateful task each
    keys = F.array(*[F.lit(k) for k in state_keys(partitions, partitions)])
    warmed = (spark.range(0, partitions, 1, 1).select(F.element_at(keys, F.col("id").cast("int") + 1).alias("task"))
              .groupBy("task")
              .transformWithState(statefulProcessor=_ModelLoader(config), outputStructType=WORKER_SCHEMA,
                                  outputMode="Append", timeMode="None")
              .mapInArrow(feature_log_writer_ready, WORKER_SCHEMA))
    return [row.asDict() for row in warmed.collect()]


class _ModelLoader(StatefulProcessor):
    """Loads the champions in the Python worker it runs in; one row per worker (process id, versions)."""

    def __init__(self, config):
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        check_worker_pyspark()  # before the query starts, where the executors' PySpark is not the driver's

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        cache = worker_champions(self.config)
        cache.ready()
        yield Row(pid=os.getpid(), models=orjson.dumps({f: [m.name, m.version] for f, m in cache.models.items()})
                  .decode())

    def close(self) -> None:
        pass


class DetectionProcessor(StatefulProcessor):
    """Per bucket of Flink jobs: a map of their states (``jobs``), their eviction times and the
    bucket's one eviction timer (``dues``). A job's state is read only when it has records."""

    def __init__(self, config):
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        # No cyclic garbage collection while the task runs (it comes back between tasks, see
        # pipelines/detection/worker_gc.py): a task holds the parsed states of thousands of jobs,
        # which every collection walks, and the states (JSON trees) form no cycles: collections
        # during a task would only slow its parsing.
        COLLECTOR.task_started()
        self.handle = handle
        self.jobs = JobStates(handle)
        self.dues = StoredValue(handle, DUES)
        self.rules = ReadRules.from_config(self.config)
        self.settings = PolicySettings.from_config(self.config)
        # This task's buckets that had records, until their timer: their jobs' states and readings.
        self.pending: dict[int, dict[str, FlinkJobState]] = {}
        self.readings: dict[str, Reading] = {}
        self.bucket_dues: dict[int, dict] = {}
        self.incidents: dict[str, list[dict]] | None = None  # each pending job's, once decided

    # --- records of one bucket -----------------------------------------------------------------

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        (bucket,) = key
        now_ms = timerValues.getCurrentProcessingTimeInMs()  # the batch's time: a re-run judges alike
        # Spark does not drop events behind the watermark here (their event time column stays
        # behind, see detect()): the jobs' reading counts them late.
        watermark = timerValues.getCurrentWatermarkInMs()  # 0 or less before the input has one
        by_job: dict[tuple, list[Record]] = {}
        for _, packed in rows:  # detect()'s columns: the bucket and the packed record
            cluster, job_id, record = unpacked_record(packed)
            by_job.setdefault((cluster, job_id), []).append(record)
        dues = self._dues()
        pending = self.pending.setdefault(bucket, {})
        stored = self._jobs([name for name in (job_key(c, j) for c, j in by_job if c is not None and j is not None)
                             if name in dues["due"]], dues)
        for (cluster, job_id), records in by_job.items():
            records.sort(key=lambda r: (r.partition, r.offset))  # each job's records in the order they arrived
            if cluster is None or job_id is None:
                # Records whose JSON names no job: each is a dead letter (with the reason it cannot be used).
                yield from _outputs(FlinkJobState().read(records, now_ms, self.rules, key=(cluster, job_id)))
                continue
            name = job_key(cluster, job_id)
            job = stored[name] if name in stored else FlinkJobState()
            self.readings[name] = job.read(records, now_ms, self.rules, key=(cluster, job_id),
                                           watermark_ms=watermark if watermark > 0 else None)
            pending[name] = job
            yield from _outputs(self.readings[name])
        self.bucket_dues[bucket] = dues
        # Due at once: the timer phase of this same task scores and decides every pending job.
        self.handle.registerTimer(max(watermark, 0))

    # --- the timer phase -----------------------------------------------------------------------

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[Row]:
        (bucket,) = key
        watermark = timerValues.getCurrentWatermarkInMs()
        if self.incidents is None and self.pending:
            yield from self._decide()
        jobs = self.pending.pop(bucket, None)
        if jobs is not None:
            dues = self.bucket_dues.pop(bucket)
            writes: list[tuple[str, bytes]] = []
            for name, job in jobs.items():
                for incident in self.incidents.pop(name, []):
                    yield Row(kind=INCIDENT, key=incident["incident_id"], payload=orjson.dumps(incident), count=1)
                job.compact()
                self._write(name, job, dues, writes)
                dues["due"][name] = job.due(self.rules)
            self.jobs.write(writes)  # before _sweep, which may read one back
        else:
            dues = self._dues()
            if dues["timer"] != expiredTimerInfo.getExpiryTimeInMs():
                return  # a decision's timer, already served
            dues["timer"] = None  # the eviction timer, firing now
        for incident in self._sweep(dues, watermark):
            yield Row(kind=INCIDENT, key=incident["incident_id"], payload=orjson.dumps(incident), count=1)

    def _decide(self) -> Iterator[Row]:
        jobs = {name: job for bucket_jobs in self.pending.values() for name, job in bucket_jobs.items()}
        rows = feature_frame([row for name in jobs for row in self.readings[name].rows])
        self.readings.clear()
        if rows.empty:
            self.incidents = {}
            return
        cache = worker_champions(self.config)
        self.incidents = decide(jobs, rows, cache.ready(), self.settings)
        for start in range(0, len(rows), FEATURE_ROWS_PER_PAYLOAD):
            chunk = rows.iloc[start:start + FEATURE_ROWS_PER_PAYLOAD]
            yield Row(kind=FEATURES, key=None, payload=feature_rows_payload(chunk), count=len(chunk))
        yield Row(kind=MODELS, key=cache.registry_error, payload=models_payload(cache), count=len(rows))

    def _sweep(self, dues: dict, watermark: int) -> list[dict]:
        """Forget the bucket's jobs silent for the idle timeout as far as the watermark knows,
        resolving their open incidents (returned), and keep one timer at the next job due."""
        gone: list[dict] = []
        due_now = [name for name, due in dues["due"].items() if due is not None and watermark >= due]
        for name, job in self._jobs(due_now, dues).items():
            gone.extend(job.gone(self.rules))
            self.jobs.remove(name)
            del dues["due"][name]
            dues["version"].pop(name, None)
        # A job kept for its open incident by an earlier version (due None) is never swept again.
        for name in [name for name, due in dues["due"].items() if due is None]:
            job = self._jobs([name], dues)[name]
            if job.machine.latest_ts is None:
                gone.extend(resolve_gone(job.policy, watermark, self.rules.idle_timeout_ms))
                self.jobs.remove(name)
                del dues["due"][name]
                dues["version"].pop(name, None)
        if dues["timer"] is not None and dues["timer"] <= watermark:
            dues["timer"] = None  # expires in this batch: counted as fired
        upcoming = [due for due in dues["due"].values() if due is not None]
        if upcoming and dues["timer"] is None:
            dues["timer"] = min(upcoming)
            self.handle.registerTimer(dues["timer"])
        if dues["due"]:
            self.dues.put(orjson.dumps(dues))
        else:
            self.dues.clear()
        return gone

    def _dues(self) -> dict:
        stored = self.dues.get()  # None when the bucket has none
        return {"due": {}, "version": {}, "timer": None} if stored is None else orjson.loads(stored)

    def _jobs(self, names: list[str], dues: dict) -> dict[str, FlinkJobState]:
        """The states of the bucket's jobs ``names``: each as this worker wrote it last, if the store
        still holds that version (no other worker wrote it since, no failed batch rolled it back),
        else read from the store, all those in one exchange (:meth:`JobStates.read`; the Python
        worker that runs a partition's task is not always the one that ran it last: every other
        micro-batch or so). Only those states are read: a real-time batch needs a part of its
        bucket's."""
        found: dict[str, FlinkJobState] = {}
        missing = []
        for name in names:
            parsed = _PARSED.take(name, dues["version"].get(name))
            if parsed is None:
                missing.append(name)
            else:
                found[name] = parsed
        if not missing:
            return found
        values = self.jobs.read(missing)
        with COLLECTOR.frozen_as_made():  # half a thousand objects a state: not walked after the task
            for name, value in zip(missing, values):
                if value is None:
                    raise RuntimeError(f"state of job {name} missing from its bucket's map")
                try:
                    found[name] = FlinkJobState.from_bytes(value)
                except StoredStateError as exc:
                    raise StoredStateError(f"job {name}: {exc}") from exc
        return found

    def _write(self, name: str, job: FlinkJobState, dues: dict, writes: list[tuple[str, bytes]]) -> None:
        """Add the job's state to ``writes`` (for :meth:`JobStates.write`), with a new version."""
        version = random.getrandbits(62)
        writes.append((name, job.to_bytes()))
        dues["version"][name] = version
        _PARSED.keep(name, version, job, self.config.detection.state_cache_jobs)

    def close(self) -> None:
        COLLECTOR.task_ended()


class _ParsedStates:
    """The job states this Python worker wrote, parsed, by job and the version written (a random
    number stored beside the job's due time in its bucket). Parsing a state costs more than the
    rest of a job's micro-batch; a worker that handled a bucket last time handles it again about
    every other micro-batch (Spark hands a task to whichever worker is idle). A state is taken out
    while a batch uses it and kept again only when that batch writes it, so a failed batch leaves
    nothing behind; a copy found stale is handed to ``collector`` to be freed between tasks."""

    def __init__(self, collector: CollectorBetweenTasks):
        self.states: OrderedDict[str, tuple[int, FlinkJobState]] = OrderedDict()
        self.collector = collector

    def take(self, name: str, version: int | None) -> FlinkJobState | None:
        kept = self.states.pop(name, None)
        if kept is None:
            return None
        if version is not None and kept[0] == version:
            return kept[1]
        # Stale (another worker wrote the job since): freed between tasks, where it holds up no
        # batch (see BENCHMARKS.md, "2026-11-27, 2592f40 and 7996a19: stale parsed states freed
        # between tasks (Intel Xeon)").
        self.collector.free_later(kept)
        return None

    def keep(self, name: str, version: int, job: FlinkJobState, limit: int) -> None:
        if limit <= 0:
            return
        self.states[name] = (version, job)
        while len(self.states) > limit:
            self.states.popitem(last=False)  # the least recently written


_PARSED = _ParsedStates(COLLECTOR)


def _outputs(reading: Reading) -> Iterator[Row]:
    for letter in reading.dead_letters:
        yield Row(kind=DEAD_LETTER, key=letter["key"], payload=orjson.dumps(letter), count=1)
    for reason, count in reading.late.items():
        yield Row(kind=LATE, key=reason, payload=None, count=count)
    for value in reading.samples:
        yield Row(kind=SAMPLE, key=None, payload=value, count=1)
