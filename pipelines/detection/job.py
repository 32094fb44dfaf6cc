"""`sentinel run`: the detection job, and the batch twin `sentinel replay` runs on recorded events.

Two streaming queries read the input topic, each with its own checkpoint:

* ``detection``: records -> validation -> usable events -> features (``transformWithState``,
  event time) -> ``foreachBatch`` (:class:`BatchProcessor`): score with the champions, run the
  incident policy, publish incidents, append the feature log;
* ``dead_letters``: records -> validation -> unusable records to the dead-letter topic, and a
  sample of the usable ones to the Great Expectations suite in a background thread.

Exactly-once where it is cheap, at-least-once where it is not: the policy state is saved per
micro-batch id and a re-run batch starts from the state before it, so it re-sends the same
incident ids; the feature log file of a batch is named by its id and overwritten on a re-run.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from feature_store import offline_store
from feature_store.compute import batch_features, event_frame, stream_features
from models.registry import LoadedDetector
from pipelines.config import SentinelConfig
from pipelines.detection import policy
from pipelines.detection.data_quality import BackgroundValidator, flatten
from pipelines.detection.observability import MetricsListener
from pipelines.detection.scoring import ChampionCache, score_rows
from pipelines.detection.validation import (check_event, dead_letters, record_text, valid_values,
                                            validate_records)
from pipelines.io import kafka_clients
from pipelines.io.kafka_stream import read_kafka_stream, write_kafka_batch
from pipelines.io.storage import Location
from pipelines.telemetry import DetectionMetrics, MetricsServer, serve

log = logging.getLogger(__name__)

# MLflow's HTTP client retries for minutes by default; the job would rather score with what it has.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

DETECTION_QUERY, DEAD_LETTER_QUERY = "detection", "dead_letters"
KEEP_POLICY_STATES = 5


class PolicyStore:
    """The policy state after each micro-batch, one JSON file per batch id, beside the query's
    checkpoint (on the same storage: a local folder or a URI)."""

    def __init__(self, directory: Location):
        self.directory = directory
        self.directory.make_dirs()

    def _ids(self) -> list[int]:
        return sorted(int(m.group(1)) for name in self.directory.names()
                      if (m := re.fullmatch(r"state-(\d+)\.json", name)))

    def load_before(self, batch_id: int) -> dict:
        """The state as it was after the latest batch before ``batch_id`` (a re-run batch starts there)."""
        earlier = [i for i in self._ids() if i < batch_id]
        if not earlier:
            return {}
        return json.loads((self.directory / f"state-{earlier[-1]:012d}.json").read_text())

    def save(self, batch_id: int, state: dict) -> None:
        (self.directory / f"state-{batch_id:012d}.json").write_text(json.dumps(state, separators=(",", ":")))
        for old in self._ids()[:-KEEP_POLICY_STATES]:
            (self.directory / f"state-{old:012d}.json").delete()


@dataclass
class IncidentSink:
    """Where incident events go: the incident topic (live) or a list (replay, tests)."""

    config: SentinelConfig | None = None
    collected: list[dict] = field(default_factory=list)
    _producer: object = None

    def publish(self, incidents: Sequence[dict]) -> None:
        if self.config is None:
            self.collected.extend(incidents)
            return
        if self._producer is None:
            kafka = self.config.kafka
            self._producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
        futures = [self._producer.send(self.config.topics.incidents, key=i["incident_id"].encode(),
                                       value=json.dumps(i, separators=(",", ":")).encode()) for i in incidents]
        self._producer.flush()
        for future in futures:
            future.get(timeout=30)  # raise here, so the batch fails and is re-run, rather than lose one

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()


class BatchProcessor:
    """Score, decide and publish one micro-batch of feature rows (the ``foreachBatch`` body)."""

    def __init__(self, config: SentinelConfig, models: Callable[[], dict[str, LoadedDetector]], sink: IncidentSink,
                 policy_store: PolicyStore | None = None, feature_log: Location | Path | None = None,
                 metrics: DetectionMetrics | None = None):
        self.config = config
        self.metrics = metrics
        self.models = models
        self.sink = sink
        self.policy_store = policy_store
        self.feature_log = feature_log
        self.settings = policy.PolicySettings.from_config(config)
        self.state: dict = {}
        self.state_after_batch: int | None = None  # the batch whose saved state ``state`` is
        self.incidents_published = 0

    def process_rows(self, rows: pd.DataFrame, batch_id: int) -> list[dict]:
        """The pure part: feature rows (no late markers) in, incident events out (the state advances)."""
        models = self.models()
        if self.policy_store is not None and self.state_after_batch != batch_id - 1:
            # A restart or a re-run batch: start from the state saved before this batch.
            self.state = self.policy_store.load_before(batch_id)
        self.state_after_batch = None  # ``step`` changes it in place until it is saved
        scores = score_rows(rows, models)
        rules = {family: m.post_rule for family, m in models.items()}
        incidents = policy.step(self.state, rows, scores, rules, self.settings)
        return incidents

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        rows = batch.toPandas()
        late = rows["is_late"].fillna(False).astype(bool)
        if late.any():
            # Events the feature state machine refused as behind the watermark: counted with the
            # ones Spark dropped before it (the same metric), never judged.
            log.warning("batch %d: %d events arrived behind the allowed lateness (features.lateness_s) and were "
                        "not used", batch_id, int(late.sum()))
            if self.metrics is not None:
                self.metrics.dropped_late.labels(DETECTION_QUERY).inc(int(late.sum()))
        rows = rows[~late].reset_index(drop=True)
        incidents = self.process_rows(rows, batch_id)
        if self.feature_log is not None:
            offline_store.append_feature_log(rows, self.feature_log, batch_id)
        self.sink.publish(incidents)
        if self.policy_store is not None:
            self.policy_store.save(batch_id, self.state)
            self.state_after_batch = batch_id
        self.incidents_published += len(incidents)
        if self.metrics is not None:
            self.metrics.incidents(incidents)
        for incident in incidents:
            log.info("incident %s %s: %s", incident["event"], incident["incident_id"], incident["summary"])
        log.info("batch %d: %d feature rows, %d incident events in %.1fs", batch_id, len(rows), len(incidents),
                 time.monotonic() - started)


class DeadLetterProcessor:
    """Send a batch's unusable records to the dead-letter topic; hand a sample to the GX suite."""

    def __init__(self, config: SentinelConfig, validator: BackgroundValidator | None,
                 metrics: DetectionMetrics | None = None):
        self.config = config
        self.validator = validator
        self.metrics = metrics
        self.dead_letters = 0

    def __call__(self, validated: DataFrame, batch_id: int) -> None:
        validated = validated.persist()
        try:
            reasons = {row["reason"]: row["count"] for row in
                       validated.filter(F.col("reason").isNotNull()).groupBy("reason").count().collect()}
            count = sum(reasons.values())
            if self.metrics is not None:
                for reason, n in reasons.items():
                    self.metrics.dead_letters.labels(reason).inc(n)
            if count:
                letters = dead_letters(validated)
                write_kafka_batch(letters, self.config, self.config.topics.dead_letter)
                self.dead_letters += count
                log.warning("batch %d: %d records to the dead-letter topic %s", batch_id, count,
                            self.config.topics.dead_letter)
            if self.validator is not None and self.validator.due():
                sample = valid_values(validated).limit(self.config.detection.gx_sample_rows).toPandas()
                self.validator.submit(flatten(json.loads(v) for v in sample["value"]), batch_id)
        finally:
            validated.unpersist()


@dataclass
class RunningJob:
    spark: SparkSession
    queries: list
    processor: BatchProcessor
    dead_letter_processor: DeadLetterProcessor
    listener: MetricsListener
    validator: BackgroundValidator
    metrics_server: MetricsServer | None = None  # /metrics for Prometheus

    def await_termination(self, timeout_s: float | None = None, stop_requested: threading.Event | None = None) -> None:
        """Until a query ends (raising its error), ``timeout_s`` passes or ``stop_requested`` is set."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while all(q.isActive for q in self.queries):
            if deadline is not None and time.monotonic() >= deadline:
                return
            if stop_requested is not None and stop_requested.is_set():
                return
            for q in self.queries:
                if q.exception() is not None:
                    raise q.exception()
            time.sleep(0.5)
        for q in self.queries:
            q.awaitTermination()  # raises the query's error, if it failed

    def stop(self, boundary_timeout_s: float = 120.0) -> None:
        """Stop at a batch boundary: the batch under way finishes first (its incidents published,
        its policy state saved, its offsets committed), then the queries stop, the producers are
        flushed and closed and the last metrics written. A batch cut short anyway (one that runs
        past ``boundary_timeout_s``) is re-run on restart and re-sends the same incident ids."""
        deadline = time.monotonic() + boundary_timeout_s
        self._wait_for_batch_boundary(deadline)  # the last batch's progress reaches the listener
        # The listener goes before the queries: Spark posts the termination events asynchronously,
        # and a Python listener called after its process has moved on only fills the log with errors.
        self.spark.streams.removeListener(self.listener)
        for q in self.queries:
            self._wait_for_batch_boundary(deadline, [q])
            q.stop()
        self.listener.write()  # the counts as the last batch left them
        self.processor.sink.close()
        self.validator.wait(10)
        if self.metrics_server is not None:
            self.metrics_server.close()

    def _wait_for_batch_boundary(self, deadline: float, queries: list | None = None) -> None:
        _poll_until(lambda: all(_between_batches(q) for q in queries or self.queries), deadline, every_s=0.1)


def _poll_until(done: Callable[[], bool], deadline: float, every_s: float) -> None:
    """Until ``done()`` or the monotonic ``deadline``."""
    while time.monotonic() < deadline and not done():
        time.sleep(every_s)


def _between_batches(query) -> bool:
    try:
        return not query.isActive or not query.status["isTriggerActive"]
    except Exception:  # a query that just ended has no status to give
        return True


def _wait_for_first_batch(query, timeout_s: float) -> None:
    """Until ``query`` has reported a first progress (a batch, or an idle trigger when there is no
    data), has ended, or ``timeout_s`` passed."""
    _poll_until(lambda: not query.isActive or query.lastProgress is not None, time.monotonic() + timeout_s,
                every_s=0.2)


def start_detection(spark: SparkSession, config: SentinelConfig, cache: ChampionCache,
                    available_now: bool = False) -> RunningJob:
    """Start both queries on the configured input topic; the caller awaits or stops them."""
    kafka = config.kafka
    kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)
    kafka_clients.ensure_topics(kafka.bootstrap_servers, kafka.client_kwargs(),
                                [config.topics.input, config.topics.incidents, config.topics.dead_letter],
                                kafka.topic_partitions)
    detection = config.detection
    max_future_ms = int(detection.max_future_s * 1000)
    records = read_kafka_stream(spark, config, config.topics.input)
    validated = validate_records(records, max_future_ms)

    metrics = DetectionMetrics()
    server = serve(metrics.registry, detection.metrics_host, detection.metrics_port) \
        if detection.metrics_port is not None else None
    processor = BatchProcessor(config, cache.current, IncidentSink(config),
                               PolicyStore(config.checkpoint_dir(DETECTION_QUERY) / "policy"),
                               config.offline_store / "live", metrics)
    validator = BackgroundValidator(Path(config.state_dir) / "logs" / "input_validation.jsonl",
                                    detection.gx_min_interval_s)
    dlq = DeadLetterProcessor(config, validator, metrics)
    listener = MetricsListener(Path(detection.metrics_file), processor, dlq, cache, metrics)
    spark.streams.addListener(listener)

    features = stream_features(event_frame(valid_values(validated)), int(config.features.lateness_s * 1000),
                               config.features.idle_timeout_ms)

    def trigger(writer):
        return writer.trigger(availableNow=True) if available_now else writer.trigger(
            processingTime=config.spark.trigger_interval)

    detection_query = trigger(features.writeStream.foreachBatch(processor).queryName(DETECTION_QUERY)
                              .option("checkpointLocation", config.checkpoint_dir(DETECTION_QUERY).spark_path)).start()
    # The two queries share one source plan. Started together, the first batch of one of them (either)
    # failed in two of about a dozen restarts in the tests with java.io.OptionalDataException while
    # a task was deserialised (a map changed while it was serialised). So the dead-letter query
    # starts once the detection query has finished its first batch (at most a minute later).
    # Issue 13's single query removes the second query and this wait.
    _wait_for_first_batch(detection_query, timeout_s=60)
    queries = [
        detection_query,
        trigger(validated.writeStream.foreachBatch(dlq).queryName(DEAD_LETTER_QUERY)
                .option("checkpointLocation", config.checkpoint_dir(DEAD_LETTER_QUERY).spark_path)).start(),
    ]
    return RunningJob(spark, queries, processor, dlq, listener, validator, server)


# --- replay ---------------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    events: int
    dead_letters: list[dict]
    incidents: list[dict]
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)  # the feature rows the policy judged


def replay(spark: SparkSession, config: SentinelConfig, paths: Iterable[str | Path],
           models: dict[str, LoadedDetector]) -> ReplayResult:
    """The live pipeline on recorded events, in event time: the same validation, features,
    scoring and policy, so the same events give the same incidents as the live job."""
    lines, letters = [], []
    far_future = 2**62  # a recording is judged by its own clock, not today's
    for path in paths:
        with (gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")) as handle:
            for number, raw in enumerate(handle):
                raw = raw.rstrip(b"\r\n")
                if not raw.strip():
                    continue
                _, reason, error = check_event(raw, now_ms=far_future)
                if reason:
                    # The dead-letter contract's shape: the file stands in for the topic, the line for the offset.
                    text, encoding = record_text(raw)
                    letters.append({"reason": reason, "error": error, "source_topic": str(path), "partition": 0,
                                    "offset": number, "kafka_timestamp": None, "key": None,
                                    "value": text, "value_encoding": encoding})
                else:
                    lines.append(raw.decode("utf-8"))
    processor = BatchProcessor(config, lambda: models, IncidentSink())
    rows = pd.DataFrame()
    if lines:
        events = spark.createDataFrame(pd.DataFrame({"value": lines}), "value string")
        rows = batch_features(event_frame(events), config.features.idle_timeout_ms).toPandas()
        processor.sink.publish(processor.process_rows(rows, 0))
    return ReplayResult(len(lines), letters, processor.sink.collected, rows)
