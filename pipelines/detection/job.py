"""`sentinel run`: the detection job, one streaming query that reads the input topic once.

records -> :func:`~pipelines.detection.processor.detect` (keyed by Flink job, on the executors:
validation, features, scoring with the champions, incident policy, every job's state in Spark's
state store) -> ``foreachBatch`` (:class:`DetectionSinks`), which only writes the sinks: the
feature log (by the executors, a file per partition), dead letters and incidents to their
topics, the metrics, and a sample of the input to the Great Expectations suite.

At least once, with the same ids: a micro-batch cut short (a crash, kill -9) is run again on
restart from the state before it, so it re-sends the incident events it had sent, with the
same ids, and rewrites the feature log files named by its id. `sentinel replay`
(:func:`pipelines.detection.flink_job.replay`) runs the same steps on recorded events.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson
from kafka.errors import KafkaError
from pyspark.sql import DataFrame, SparkSession

from models.registry import ModelUnavailable
from pipelines.config import ConfigError, SentinelConfig
from pipelines.detection.champions import ChampionCache, record_scoring, scoring_versions
from pipelines.detection.data_quality import BackgroundValidator, flatten
from pipelines.detection.dead_letters import DeadLetterSpool
from pipelines.detection.observability import MetricsListener, checkpointed_newest_event_s
from pipelines.detection.outputs import (DEAD_LETTER, INCIDENT, LATE, MODELS, OUTPUT_SCHEMA, SAMPLE,
                                         feature_log_writer)
from pipelines.detection.processor import detect, load_models_on_workers
from pipelines.detection.spark_state import (UnsupportedPySpark, check_spark_versions, relocate_checkpoint,
                                             state_partitions)
from pipelines.io import kafka_clients
from pipelines.io.kafka_source import BROKER_WAIT_MS
from pipelines.io.kafka_stream import read_kafka_stream
from pipelines.io.storage import Location
from pipelines.telemetry import DetectionMetrics, MetricsServer, serve

log = logging.getLogger(__name__)

DETECTION_QUERY = "detection"
# Checkpoint folders of the job before it was one query (its own policy files, a second query):
# their state cannot be carried into this one.
EARLIER_LAYOUT = ("detection/policy", "dead_letters")
# How long a batch waits for a broker that does not take its incidents before it fails (and is run
# again): as long as the input source waits for an absent broker.
BROKER_WAIT_S = BROKER_WAIT_MS / 1000.0


class DetectionSinks:
    """Write one micro-batch's output (the ``foreachBatch`` body): the feature log on the
    executors, then incident events to their topic, each send acknowledged before the batch
    counts as done (a failed send fails the batch, which is run again), then dead letters to the
    spool (:mod:`pipelines.detection.dead_letters`), whose thread sends them on: the dead-letter
    topic never holds incidents or batches back."""

    def __init__(self, config: SentinelConfig, feature_log: Location | None, metrics: DetectionMetrics | None = None,
                 validator: BackgroundValidator | None = None):
        self.config = config
        self.feature_log = feature_log
        self.metrics = metrics
        self.validator = validator
        self._producer = None
        kafka = config.kafka
        self.spool = DeadLetterSpool(
            Path(config.detection.dead_letter_spool), config.topics.dead_letter,
            lambda: kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs(), max_block_ms=30_000),
            metrics)
        self.incidents_published = 0
        self.dead_letters = 0
        self.late: dict[str, int] = {}
        self.models: dict[str, list[str]] = {}  # family -> [name, version] the executors scored with
        self.registry_error: str | None = None  # as the executors last met it

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        # One Spark action: the stateful stage runs once; each partition writes its feature rows.
        rows = batch.mapInArrow(feature_log_writer(self.feature_log, batch_id), OUTPUT_SCHEMA).collect()
        letters = [r for r in rows if r["kind"] == DEAD_LETTER]
        incidents = [orjson.loads(r["payload"]) for r in rows if r["kind"] == INCIDENT]
        self._publish([(self.config.topics.incidents, i["incident_id"], orjson.dumps(i)) for i in incidents])
        self.spool.put(batch_id, [(r["key"], r["payload"]) for r in letters])
        self._count(batch_id, rows, letters, incidents)
        log.info("batch %d: %d incident events, %d dead letters in %.1fs", batch_id, len(incidents), len(letters),
                 time.monotonic() - started)

    def _publish(self, records: list[tuple[str, str | None, bytes]]) -> None:
        """Send ``records`` and wait for the broker's acknowledgements; while the broker does not
        take them, try again (the same incident ids) for up to :data:`BROKER_WAIT_S`, then fail the
        batch, which Spark runs again."""
        if not records:
            return
        waiting_since = None
        while True:
            try:
                self._send(records)
            except KafkaError as exc:
                now = time.monotonic()
                if waiting_since is None:
                    waiting_since = now
                    log.warning("the broker does not take this batch's %d incident events (%s); trying again for "
                                "up to %.0f min", len(records), exc, BROKER_WAIT_S / 60)
                if now - waiting_since > BROKER_WAIT_S:
                    raise
                self._close_producer()
                time.sleep(5)
                continue
            if waiting_since is not None:
                log.info("the broker took the incident events after %.0f s", time.monotonic() - waiting_since)
            return

    def _send(self, records: list[tuple[str, str | None, bytes]]) -> None:
        if self._producer is None:
            kafka = self.config.kafka
            self._producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
        futures = [self._producer.send(topic, key=None if key is None else key.encode(), value=value)
                   for topic, key, value in records]
        self._producer.flush()
        for future in futures:
            future.get(timeout=30)  # raise here rather than lose one

    def _close_producer(self) -> None:
        kafka_clients.close_quietly(self._producer)
        self._producer = None

    def _count(self, batch_id: int, rows: list, letters: list, incidents: list[dict]) -> None:
        self.incidents_published += len(incidents)
        self.dead_letters += len(letters)
        late: dict[str, int] = {}
        for row in rows:
            if row["kind"] == LATE:
                late[row["key"]] = late.get(row["key"], 0) + row["count"]
            elif row["kind"] == MODELS:
                self.models.update(scoring_versions(row["payload"]))
                self.registry_error = row["key"]
                if self.metrics is not None:
                    record_scoring(self.metrics, row["payload"])
        for reason, count in late.items():
            self.late[reason] = self.late.get(reason, 0) + count
        if late:
            log.warning("batch %d: %s not used (later than features.lateness_s behind their job, or out of order "
                        "in their stream)", batch_id, ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in
                                                              sorted(late.items())))
        for incident in incidents:
            log.info("incident %s %s: %s", incident["event"], incident["incident_id"], incident["summary"])
        if letters:
            log.warning("batch %d: %d records to the dead-letter topic %s", batch_id, len(letters),
                        self.config.topics.dead_letter)
        if self.metrics is not None:
            self.metrics.incidents(incidents)
            for letter in letters:
                self.metrics.dead_letters.labels(orjson.loads(letter["payload"])["reason"]).inc()
            for reason, count in late.items():
                self.metrics.late_events.labels(reason).inc(count)
        if self.validator is not None and self.validator.due():
            samples = [r["payload"] for r in rows if r["kind"] == SAMPLE][:self.config.detection.gx_sample_rows]
            if samples:
                self.validator.submit(flatten(orjson.loads(v) for v in samples), batch_id)

    def close(self) -> None:
        self.spool.close()
        if self._producer is not None:
            self._producer.close()
            self._producer = None


@dataclass
class RunningJob:
    spark: SparkSession
    query: object
    sinks: DetectionSinks
    listener: MetricsListener
    validator: BackgroundValidator
    metrics_server: MetricsServer | None = None  # /metrics for Prometheus
    broker_probe: kafka_clients.BrokerProbe | None = None  # the broker's reachability, for /metrics
    keeper: WorkerKeeper | None = None  # the Python workers kept while the input is quiet

    @property
    def queries(self) -> list:
        return [self.query]

    def await_termination(self, timeout_s: float | None = None, stop_requested: threading.Event | None = None) -> None:
        """Until the query ends (raising its error), ``timeout_s`` passes or ``stop_requested`` is set."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.query.isActive:
            if deadline is not None and time.monotonic() >= deadline:
                return
            if stop_requested is not None and stop_requested.is_set():
                return
            if self.query.exception() is not None:
                raise self.query.exception()
            time.sleep(0.5)
        self.query.awaitTermination()  # raises the query's error, if it failed

    def stop(self, boundary_timeout_s: float = 120.0) -> None:
        """Stop at a batch boundary: the batch under way finishes first (its incidents published,
        its state committed), then the query stops, the producer is flushed and closed and the
        last metrics written. A batch cut short anyway (one that runs past
        ``boundary_timeout_s``) is re-run on restart and re-sends the same incident ids."""
        deadline = time.monotonic() + boundary_timeout_s
        if self.keeper is not None:
            self.keeper.stop(boundary_timeout_s)
        _poll_until(lambda: _between_batches(self.query), deadline, every_s=0.1)
        # The listener goes before the query: Spark posts the termination event asynchronously,
        # and a Python listener called after its process has moved on only fills the log with errors.
        self.spark.streams.removeListener(self.listener)
        self.query.stop()
        self.listener.write()  # the counts as the last batch left them
        self.sinks.close()
        self.validator.wait(10)
        if self.broker_probe is not None:
            self.broker_probe.stop()
        if self.metrics_server is not None:
            self.metrics_server.close()


class WorkerKeeper:
    """Keeps the detection query's Python workers, and the champions loaded in them, while its
    input is quiet. Spark stops a Python worker idle for a minute (a constant of its worker
    factory, not a setting), and the next micro-batch's new workers load the models again while
    the first events after the pause wait (see BENCHMARKS.md, "2026-11-26, ba9c47d: the Python
    workers kept through a quiet input"). So while no micro-batch has read input for ``idle_s``,
    the warm-up of the job's start runs again (:func:`_load_models_on_workers`: a task per shuffle
    partition in the workers Spark finds idle, short when they are warm); a micro-batch that starts
    meanwhile waits that long at most for its cores."""

    def __init__(self, spark: SparkSession, config: SentinelConfig, query, idle_s: float, workers: list[dict]):
        self.spark, self.config, self.query, self.idle_s = spark, config, query, idle_s
        self.workers = workers  # the Python workers (process id, model versions) of the last warm-up
        self.runs = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="keep-python-workers", daemon=True)

    def start(self) -> "WorkerKeeper":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stopping.set()
        self._thread.join(timeout_s)

    def _keep(self) -> None:
        last_used, seen = time.monotonic(), None
        while not self._stopping.wait(min(5.0, self.idle_s / 4)):
            try:
                progress = self.query.lastProgress
                if progress and progress["numInputRows"] > 0 and progress["timestamp"] != seen:
                    seen, last_used = progress["timestamp"], time.monotonic()
                if time.monotonic() - last_used < self.idle_s:
                    continue
                if not self.query.isActive:
                    return
                if self.query.status["isTriggerActive"]:
                    continue  # a micro-batch under way (a long one, or a trigger looking for input) uses them
                self.workers = _load_models_on_workers(self.spark, self.config)
                self.runs += 1
            except Exception as exc:  # the next micro-batch's workers load the models themselves
                log.warning("could not keep the Python workers warm: %s", exc)
            last_used = time.monotonic()


def _poll_until(done: Callable[[], bool], deadline: float, every_s: float) -> None:
    """Until ``done()`` or the monotonic ``deadline``."""
    while time.monotonic() < deadline and not done():
        time.sleep(every_s)


def _between_batches(query) -> bool:
    try:
        return not query.isActive or not query.status["isTriggerActive"]
    except Exception:  # a query that just ended has no status to give
        return True


def _refuse_earlier_checkpoint(config: SentinelConfig) -> None:
    root = config.location(config.spark.checkpoint_location)
    found = [str(root / name) for name in EARLIER_LAYOUT if (root / name).exists()]
    if found:
        raise ConfigError(
            f"{', '.join(found)}: a checkpoint of the detection job before it kept all its state in Spark "
            f"(two queries, policy files of its own); it cannot be resumed. Move {root} aside (or point "
            "spark.checkpoint_location at a new folder) to start afresh from kafka.starting_offsets")


def _load_models_on_workers(spark: SparkSession, config: SentinelConfig) -> list[dict]:
    """The champions loaded in the Python workers before the first micro-batch (which would
    otherwise take 10-15 s longer while the first events wait), or a stop that says why not."""
    started = time.monotonic()
    try:
        workers = load_models_on_workers(spark, config)
    except Exception as exc:  # Spark wraps the worker's error; its own line says what to fix
        lines = str(exc).splitlines()
        unsupported = next((line.split("UnsupportedPySpark: ", 1)[1] for line in lines
                            if "UnsupportedPySpark: " in line), None)
        if unsupported is not None:  # the executors' PySpark, which may not be the driver's
            raise UnsupportedPySpark(unsupported.strip()) from exc
        reason = next((line.split("ModelUnavailable: ", 1)[1] for line in lines if "ModelUnavailable: " in line),
                      lines[0] if lines else repr(exc))
        raise ModelUnavailable(f"the executors' Python workers could not load the champions from "
                               f"{config.mlflow.registry_uri}: {reason.strip()[:500]}") from exc
    scoring = [w for w in workers if w["models"] is not None]
    log.info("%d Python workers loaded the champions in %.1fs (%d more ready for the feature log): %s", len(scoring),
             time.monotonic() - started, len(workers) - len(scoring), scoring[0]["models"] if scoring else "-")
    return workers


def start_detection(spark: SparkSession, config: SentinelConfig, cache: ChampionCache,
                    available_now: bool = False) -> RunningJob:
    """Start the detection query on the configured input topic; the caller awaits or stops it.
    ``cache`` (the driver's) reports the registry and the versions; the executors load their own.
    Raises :class:`~pipelines.detection.spark_state.UnsupportedPySpark` before anything starts on a
    PySpark or Spark the stateful processor was not tested with."""
    check_spark_versions(spark)
    kafka = config.kafka
    kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)
    kafka_clients.ensure_topics(kafka.bootstrap_servers, kafka.client_kwargs(),
                                [config.topics.input, config.topics.incidents, config.topics.dead_letter],
                                kafka.topic_partitions)
    _refuse_earlier_checkpoint(config)
    for entry in relocate_checkpoint(config.checkpoint_dir(DETECTION_QUERY)):
        log.warning("%s named its state schema files in another folder (a checkpoint copied or restored here): "
                    "pointed at this one", entry)
    workers = _load_models_on_workers(spark, config)
    detection = config.detection
    metrics = DetectionMetrics()
    jvm = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)  # None under spark-submit
    if jvm is not None:
        metrics.watch_jvm(jvm.pid)
    metrics.newest_event_seen(DETECTION_QUERY, checkpointed_newest_event_s(
        config.checkpoint_dir(DETECTION_QUERY), int(config.features.watermark_delay.split()[0])))
    server = serve(metrics.registry, detection.metrics_host, detection.metrics_port) \
        if detection.metrics_port is not None else None
    validator = BackgroundValidator(Path(config.state_dir) / "logs" / "input_validation.jsonl",
                                    detection.gx_min_interval_s)
    sinks = DetectionSinks(config, config.offline_store / "live", metrics, validator)
    sinks.spool.start()
    listener = MetricsListener(Path(detection.metrics_file), sinks, cache, metrics)
    spark.streams.addListener(listener)
    partitions = state_partitions(config.checkpoint_dir(DETECTION_QUERY)) or \
        int(spark.conf.get("spark.sql.shuffle.partitions"))
    writer = (detect(read_kafka_stream(spark, config, config.topics.input), config, partitions).writeStream
              .foreachBatch(sinks).queryName(DETECTION_QUERY)
              .option("checkpointLocation", config.checkpoint_dir(DETECTION_QUERY).spark_path))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(
        processingTime=config.spark.trigger_interval)
    query = writer.start()
    keeper = None if available_now or detection.keep_workers_warm_s is None else \
        WorkerKeeper(spark, config, query, detection.keep_workers_warm_s, workers).start()
    # The input source reads an absent broker as a quiet topic: the probe tells them apart.
    probe = kafka_clients.BrokerProbe(kafka.bootstrap_servers, kafka.client_kwargs(), metrics.broker_reachable,
                                      metrics.broker_last_contact).start()
    return RunningJob(spark, query, sinks, listener, validator, metrics_server=server, keeper=keeper, broker_probe=probe)
