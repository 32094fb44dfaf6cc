"""The sentinel's own metrics, for Prometheus to scrape: is the watcher itself healthy?

``sentinel run`` and ``sentinel collect`` each serve ``/metrics`` over HTTP (``detection.metrics_port``,
``collector.metrics_port``; 0 picks a free port, unset turns it off). Every metric is named
``checkpoint_sentinel_...``; ``infra/prometheus/sentinel-alerts.yml`` holds alerting rules on them
(the job down, stalled or falling behind, a dependency failing, a Flink cluster unreachable).
Staleness is exported as timestamps (``..._timestamp_seconds``), so a rule reads ``time() - x``
from a stalled process's last value as well as from a live one.

Each part (``sentinel run``, ``collect``, ``alert``) builds one registry (:func:`part_registry`):
its own metrics, the process's (``process_*``: memory, CPU, file descriptors), the platform's
(``python_info``, ``python_gc_*``) and ``checkpoint_sentinel_build_info``. A process runs one part,
so it serves one registry with all of them; tests that build several parts in one process never
share counters.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Iterable

from prometheus_client import (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Counter, Gauge,
                               Histogram, ProcessCollector, start_http_server)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pipelines.contracts import INCIDENT_EVENTS, SEVERITIES
from pipelines.families import FAMILIES

PREFIX = "checkpoint_sentinel"
# The dead-letter reasons the job gives (the dead-letter contract's `reason`), so each counter exists
# at 0 from the start and a rule's increase() sees the first letter.
DEAD_LETTER_REASONS = ("malformed_json", "schema_violation", "unknown_schema_version", "unknown_kind",
                       "impossible_value", "unprocessable")
# Spark's micro-batches: a quiet trigger is well under a second, a backlog's batch minutes.
BATCH_DURATION_BUCKETS = (0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def build_version() -> str:
    try:
        return metadata.version("checkpoint-sentinel")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


class _BuildInfo(Collector):
    """``checkpoint_sentinel_build_info`` (1), Prometheus's convention: what runs where, to join on."""

    def __init__(self, component: str):
        self.labels = {"component": component, "version": build_version(),
                       "python_version": platform.python_version()}

    def collect(self):
        info = GaugeMetricFamily(f"{PREFIX}_build_info", "The sentinel's version and part (1)",
                                 labels=list(self.labels))
        info.add_metric(list(self.labels.values()), 1)
        return [info]


def part_registry(component: str) -> CollectorRegistry:
    """A registry for one part of the sentinel (``detection``, ``collector``, ``alert``) with the
    process, platform and garbage-collector collectors and the build info already in it."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, _BuildInfo(component)):
        registry.register(collector)
    return registry


@dataclass
class MetricsServer:
    registry: CollectorRegistry
    host: str
    port: int
    _server: object = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def serve(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` on a daemon thread (port 0: any free one)."""
    server, _ = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(registry, host, server.server_address[1], server)


@dataclass(frozen=True)
class BatchProgress:
    """What one finished micro-batch of a query reports (from Spark's ``StreamingQueryProgress``)."""

    batch_id: int
    input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    duration_s: float
    state_rows: int
    rows_dropped_by_watermark: int
    newest_event_s: float | None = None  # the batch's newest event time (Spark's eventTime "max")
    watermark_s: float | None = None  # the watermark the batch ran with


class _EventTimeLags(Collector):
    """The lags, computed when read (a scrape, a text file write): a quiet or stalled query's lag
    keeps growing, where a value set at its last batch would stand still."""

    def __init__(self) -> None:
        self.newest: dict[str, float] = {}  # query -> newest event time processed, epoch s
        self.watermark: dict[str, float] = {}

    def describe(self):
        return [GaugeMetricFamily(f"{PREFIX}_event_lag_seconds", ""),
                GaugeMetricFamily(f"{PREFIX}_watermark_lag_seconds", "")]

    def collect(self):
        now = time.time()
        lag = GaugeMetricFamily(f"{PREFIX}_event_lag_seconds", "How far the newest event the query has processed is "
                                "behind the wall clock, now (grows while no newer event comes)", labels=["query"])
        for query, newest in sorted(dict(self.newest).items()):
            lag.add_metric([query], max(0.0, now - newest))
        watermark = GaugeMetricFamily(f"{PREFIX}_watermark_lag_seconds", "How far Spark's event-time watermark is "
                                      "behind the wall clock, now: by design features.max_source_delay_s more than "
                                      "the event lag", labels=["query"])
        for query, mark in sorted(dict(self.watermark).items()):
            watermark.add_metric([query], max(0.0, now - mark))
        return [lag, watermark]


class DetectionMetrics:
    """What ``sentinel run`` reports: its batches, its output, its models. The same registry is
    served on /metrics and written to the text file, so both carry the same names."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or part_registry("detection")
        r = self.registry
        self.incident_events = Counter(f"{PREFIX}_incident_events", "Incident events published",
                                       ["family", "severity", "event"], registry=r)
        # Every family, severity and event from the start, so a rule's or panel's increase() sees the first one.
        for family in FAMILIES:
            for severity in SEVERITIES:
                for event in INCIDENT_EVENTS:
                    self.incident_events.labels(family, severity, event)
        self.dead_letters = Counter(f"{PREFIX}_dead_letters", "Input records sent to the dead-letter topic",
                                    ["reason"], registry=r)
        for reason in DEAD_LETTER_REASONS:
            self.dead_letters.labels(reason)
        self.batch_duration = Histogram(f"{PREFIX}_batch_duration_seconds", "Duration of the query's micro-batches",
                                        ["query"], buckets=BATCH_DURATION_BUCKETS, registry=r)
        self.input_rows = Counter(f"{PREFIX}_input_rows", "Input rows the query has read", ["query"], registry=r)
        self.input_rate = Gauge(f"{PREFIX}_input_rows_per_second", "Input rows per second of the latest batch "
                                "(as they arrived)", ["query"], registry=r)
        self.processed_rate = Gauge(f"{PREFIX}_processed_rows_per_second", "Rows per second of the latest batch",
                                    ["query"], registry=r)
        self.batch_id = Gauge(f"{PREFIX}_batch_id", "The id of the query's latest micro-batch", ["query"], registry=r)
        self.state_rows = Gauge(f"{PREFIX}_state_rows", "Rows in the query's state store", ["query"], registry=r)
        self.dropped_late = Counter(f"{PREFIX}_rows_dropped_by_watermark",
                                    "Rows Spark dropped behind a query's watermark (the detection query drops none: "
                                    "it counts them in late_events)", ["query"], registry=r)
        self.late_events = Counter(f"{PREFIX}_late_events", "Events not used: more than features.lateness_s "
                                   "behind their job's latest (late), out of order in their stream, or further "
                                   "behind the newest input than features.max_source_delay_s (behind_watermark)",
                                   ["reason"], registry=r)
        self.newest_event = Gauge(f"{PREFIX}_newest_event_timestamp_seconds",
                                  "Event time of the newest event the query has processed", ["query"], registry=r)
        self.lags = _EventTimeLags()
        r.register(self.lags)
        self.last_batch = Gauge(f"{PREFIX}_last_batch_timestamp_seconds", "When the query last finished a batch",
                                ["query"], registry=r)
        self.last_progress = Gauge(f"{PREFIX}_last_progress_timestamp_seconds", "When the query last reported: a "
                                   "finished batch, or a trigger that found no new input (Spark reports one every "
                                   "10 s while the input is quiet)", ["query"], registry=r)
        self.model_version = Gauge(f"{PREFIX}_model_version_info", "The model version each family scores with (1)",
                                   ["family", "name", "version"], registry=r)
        self._model_versions: set[tuple[str, str, str]] = set()
        self.registry_reachable = Gauge(f"{PREFIX}_model_registry_reachable",
                                        "1 while the model registry answers, 0 while it does not", registry=r)
        # Degraded dependencies: each names what is wrong, so a rule can say what to fix.
        self.dead_letter_publish_failures = Counter(
            f"{PREFIX}_dead_letter_publish_failures", "Dead letters the dead-letter topic did not take (kept and "
            "retried; incidents are never held back by them)", registry=r)
        self.dead_letters_pending = Gauge(f"{PREFIX}_dead_letters_pending",
                                          "Dead letters waiting for the dead-letter topic to take them", registry=r)
        self.model_load_failures = Counter(f"{PREFIX}_model_load_failures",
                                           "Times a family's champion could not be loaded", ["family"], registry=r)
        self.model_nan_scores = Counter(f"{PREFIX}_model_nan_scores",
                                        "Feature rows a family's champion scored as NaN or not at all", ["family"],
                                        registry=r)
        self.model_scoring = Gauge(f"{PREFIX}_model_scoring",
                                   "1 while a family's champion scores, 0 while the family is blind", ["family"],
                                   registry=r)
        self.broker_reachable = Gauge(f"{PREFIX}_broker_reachable",
                                      "1 while the Kafka broker answered the input source's latest request", registry=r)
        self.broker_last_contact = Gauge(f"{PREFIX}_broker_last_contact_timestamp_seconds",
                                         "When the Kafka broker last answered the input source", registry=r)

    def watch_jvm(self, pid: int) -> None:
        """The driver's JVM's memory and CPU as ``checkpoint_sentinel_jvm_process_*``: the Python
        process's own ``process_*`` leave out the JVM it started, where most of the memory is."""
        ProcessCollector(namespace=f"{PREFIX}_jvm", pid=lambda: pid, registry=self.registry)

    def incidents(self, events: Iterable[dict]) -> None:
        for event in events:
            self.incident_events.labels(event["family"], event["severity"], event["event"]).inc()

    def models(self, versions: dict[str, tuple[str, str]], reachable: bool) -> None:
        """``versions``: family -> (registered name, version)."""
        current = {(family, name, str(version)) for family, (name, version) in versions.items()}
        for labels in current:
            self.model_version.labels(*labels).set(1)
        # Only the versions no longer used go: a scrape meanwhile never sees a family without one.
        for labels in self._model_versions - current:
            self.model_version.remove(*labels)
        self._model_versions = current
        self.registry_reachable.set(1 if reachable else 0)

    def progress(self, query: str, batch: BatchProgress) -> None:
        now = time.time()
        self.input_rows.labels(query).inc(batch.input_rows)
        self.input_rate.labels(query).set(batch.input_rows_per_second)
        self.processed_rate.labels(query).set(batch.processed_rows_per_second)
        self.batch_duration.labels(query).observe(batch.duration_s)
        self.batch_id.labels(query).set(batch.batch_id)
        self.state_rows.labels(query).set(batch.state_rows)
        self.dropped_late.labels(query).inc(batch.rows_dropped_by_watermark)
        self.newest_event_seen(query, batch.newest_event_s)
        if batch.watermark_s is not None:
            self.lags.watermark[query] = batch.watermark_s
        self.last_batch.labels(query).set(now)
        self.last_progress.labels(query).set(now)

    def newest_event_seen(self, query: str, newest_event_s: float | None) -> None:
        """A newer event time than the query's newest yet: a batch's, or the one a restarted
        query's checkpoint vouches for before its first batch."""
        if newest_event_s is not None and newest_event_s > self.lags.newest.get(query, 0.0):
            self.lags.newest[query] = newest_event_s
            self.newest_event.labels(query).set(newest_event_s)

    def idle(self, query: str) -> None:
        """The query's trigger found no new input: it is alive, and its lags go on growing."""
        self.last_progress.labels(query).set(time.time())


class CollectorMetrics:
    """What ``sentinel collect`` reports, per Flink cluster."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or part_registry("collector")
        r = self.registry
        self.polls = Counter(f"{PREFIX}_collector_polls", "Polls of the cluster", ["cluster"], registry=r)
        self.poll_errors = Counter(f"{PREFIX}_collector_poll_errors", "Errors met while polling (after retries)",
                                   ["cluster"], registry=r)
        self.poll_duration = Histogram(f"{PREFIX}_collector_poll_duration_seconds", "Duration of one poll", ["cluster"],
                                       buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.request_duration = Histogram(f"{PREFIX}_collector_request_duration_seconds",
                                          "Duration of one REST request to the JobManager", ["cluster"],
                                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5), registry=r)
        self.events = Counter(f"{PREFIX}_collector_events_published", "Input events published", ["cluster", "kind"],
                              registry=r)
        self.reachable = Gauge(f"{PREFIX}_collector_cluster_reachable", "1 if the cluster's REST API answered the "
                               "latest poll", ["cluster"], registry=r)
        self.jobs = Gauge(f"{PREFIX}_collector_jobs", "Jobs the latest poll saw", ["cluster"], registry=r)
        self.last_poll = Gauge(f"{PREFIX}_collector_last_poll_timestamp_seconds", "When the cluster was last polled",
                               ["cluster"], registry=r)
        self.requests = Counter(f"{PREFIX}_collector_requests", "REST requests to the JobManager", ["cluster"],
                                registry=r)
        self.job_published = Histogram(f"{PREFIX}_collector_job_published_seconds", "From a poll's start to one "
                                       "job's events acknowledged by Kafka", ["cluster"],
                                       buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)

    def record(self, result) -> None:
        """Account for one :class:`~pipelines.collector.PollResult`."""
        cluster = result.cluster
        self.polls.labels(cluster).inc()
        self.poll_errors.labels(cluster).inc(len(result.errors))
        self.poll_duration.labels(cluster).observe(result.duration_s)
        for seconds in result.request_seconds:
            self.request_duration.labels(cluster).observe(seconds)
        for kind, count in result.published.items():
            self.events.labels(cluster, kind).inc(count)
        self.reachable.labels(cluster).set(1 if result.reachable else 0)
        self.jobs.labels(cluster).set(result.jobs)
        self.last_poll.labels(cluster).set(time.time())
        self.requests.labels(cluster).inc(result.requests)
        published = self.job_published.labels(cluster)
        for seconds in result.job_seconds:
            published.observe(seconds)
