"""``sentinel collect``: poll Flink's REST API and publish input-contract events to Kafka.

One :class:`ClusterCollector` per Flink cluster. Each poll reads ``/jobs/overview`` and, per job:

- ``job_status``: the overview entry, ``/jobs/:id/checkpoints`` counts, ``/checkpoints/config``
  (interval, timeout, storage; read until it names the storage or the job has settled, then
  kept), the ``numRestarts`` job metric and the JobManager's heap (``/jobmanager/metrics``, once
  per poll);
- ``checkpoint``: each newly finished checkpoint once, with ``/checkpoints/details/:cid`` and the
  per-vertex ``/checkpoints/details/:cid/subtasks/:vid``; the ledger remembers what was
  published, across restarts;
- ``vertex_metrics`` (running jobs): one request per vertex for the ``<subtask>.<metric>`` ids of
  ``/jobs/:id/vertices/:vid/metrics``.

A job that reaches a terminal state gets two last polls (``job_status`` and its last checkpoints;
two, because Flink's REST cache can serve the first from before the end), then is left alone. A
failing request is retried with backoff; what still fails is logged and skipped (a checkpoint
without details is published without vertices; a job that cannot be read is tried again at the
next poll, its ledger untouched). A cluster that cannot be reached at all is polled again after a
growing pause, up to ``collector.max_backoff_s``. Events that do not satisfy the input contract
(a Flink answer nobody foresaw) are logged and counted, never published.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from pipelines.collector import mapping
from pipelines.collector.ledger import CheckpointLedger
from pipelines.collector.rest import FlinkRestClient, FlinkRestError
from pipelines.config import CollectorConfig, FlinkClusterEndpoint, StorageConfig
from pipelines.io.storage import Location

log = logging.getLogger(__name__)

Publish = Callable[[list[dict]], None]

# Ten times Flink's default web.refresh-interval: well past the REST cache's staleness, and
# tolerant of some clock skew between the collector and the JobManager.
CHECKPOINT_CONFIG_SETTLE_MS = 30_000


@dataclass
class PollResult:
    cluster: str
    events: list[dict] = field(default_factory=list)
    jobs: int = 0
    errors: list[str] = field(default_factory=list)
    invalid: int = 0
    reachable: bool = True
    requests: int = 0
    duration_s: float = 0.0
    request_seconds: list[float] = field(default_factory=list)  # each REST request's duration

    def line(self) -> str:
        kinds = {kind: sum(e["kind"] == kind for e in self.events) for kind in ("job_status", "checkpoint", "vertex_metrics")}
        text = (f"{self.cluster}: {self.jobs} jobs, {kinds['checkpoint']} checkpoints, "
                f"{kinds['vertex_metrics']} vertex samples, {kinds['job_status']} job statuses")
        if self.invalid:
            text += f", {self.invalid} events off-contract (not published)"
        text += f" ({self.requests} requests, {self.duration_s:.2f}s)"
        if self.errors:
            text += f"; {len(self.errors)} errors, first: {self.errors[0]}"
        return text


class ClusterCollector:
    """Polls one Flink cluster; :meth:`poll` publishes and only then records what it published."""

    def __init__(self, endpoint: FlinkClusterEndpoint, settings: CollectorConfig, publish: Publish,
                 clock: Callable[[], float] = time.time, source: str = "collector",
                 storage: StorageConfig | None = None):
        self.endpoint = endpoint
        self.publish = publish
        self.clock = clock
        self.source = source
        self.rest = FlinkRestClient(endpoint.rest_url, settings.request_timeout_s, settings.retries, settings.backoff_s)
        ledger = (Location.of(settings.state_dir, storage) / f"{_file_name(endpoint.name)}.json"
                  if settings.state_dir else None)
        self.ledger = CheckpointLedger(ledger)
        self._checkpoint_config: dict[str, dict] = {}
        self._seen_terminal: set[str] = set()

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def poll(self) -> PollResult:
        started, requests_before = time.monotonic(), self.rest.requests
        result = self._poll()
        result.requests, result.duration_s = self.rest.requests - requests_before, time.monotonic() - started
        result.request_seconds = self.rest.take_latencies()
        return result

    def _poll(self) -> PollResult:
        from pipelines.contracts import INPUT

        result = PollResult(self.endpoint.name)
        try:
            overview = self.rest.get("/jobs/overview")
        except FlinkRestError as exc:
            result.reachable = False
            result.errors.append(str(exc))
            return result
        jobs = [job for job in overview.get("jobs") or [] if isinstance(job, dict) and job.get("jid")]
        result.jobs = len(jobs)
        try:
            jm_metrics = self.rest.metrics("/jobmanager/metrics", mapping.JM_HEAP_METRICS)
        except FlinkRestError as exc:
            result.errors.append(str(exc))
            jm_metrics = {}
        commits: list[Callable[[], None]] = []
        for job in jobs:
            if self.ledger.terminal_reported(job["jid"]):
                continue
            try:
                events, commit = self._poll_job(job, jm_metrics, result)
            except FlinkRestError as exc:
                result.errors.append(f"job {job['jid']}: {exc}")
                continue
            for event in events:
                problems = INPUT.errors(event)
                if problems:
                    result.invalid += 1
                    log.error("%s: %s event of job %s breaks the input contract (%s); not published",
                              self.endpoint.name, event["kind"], event["job_id"], "; ".join(problems[:3]))
                else:
                    result.events.append(event)
            commits.append(commit)
        if result.events:
            self.publish(result.events)  # raises if Kafka did not acknowledge: nothing is recorded then
        for commit in commits:
            commit()
        self.ledger.forget_except((job["jid"] for job in jobs), self._now_ms())
        self.ledger.save()
        for error in result.errors:
            log.warning("%s: %s", self.endpoint.name, error)
        return result

    def _poll_job(self, job: dict, jm_metrics: dict, result: PollResult) -> tuple[list[dict], Callable[[], None]]:
        job_id = job["jid"]
        name = self.endpoint.name
        state = str(job.get("state") or "").upper()
        sampled_at = self._now_ms()
        details = self.rest.get(f"/jobs/{job_id}")
        vertices = [v for v in details.get("vertices") or [] if isinstance(v, dict) and v.get("id")]
        checkpoints = self.rest.get(f"/jobs/{job_id}/checkpoints")
        checkpoint_config = self._checkpoint_config.get(job_id)
        if checkpoint_config is None:
            checkpoint_config = self._read_checkpoint_config(job, state, sampled_at)
        try:
            job_metrics = self.rest.metrics(f"/jobs/{job_id}/metrics", mapping.JOB_METRICS)
        except FlinkRestError as exc:
            result.errors.append(f"job {job_id}: {exc}")
            job_metrics = {}
        events = [mapping.job_status_event(name, job, checkpoints, checkpoint_config, job_metrics,
                                           jm_metrics, sampled_at, self.endpoint.max_state_size_bytes, self.source)]

        history = [c for c in checkpoints.get("history") or [] if isinstance(c, dict) and "id" in c]
        fresh = self.ledger.unpublished(job_id, history)
        for checkpoint in fresh:
            events.append(self._checkpoint(job, checkpoint, vertices, result))

        if state == "RUNNING":
            for vertex in vertices:
                try:
                    values = self.rest.metrics(f"/jobs/{job_id}/vertices/{vertex['id']}/metrics",
                                               mapping.subtask_metric_names(int(vertex.get("parallelism") or 1)))
                except FlinkRestError as exc:
                    result.errors.append(f"job {job_id} vertex {vertex['id']}: {exc}")
                    continue
                events.append(mapping.vertex_metrics_event(name, job, vertex, values, self._now_ms(), self.source))

        published_ids = [int(c["id"]) for c in fresh]

        def commit() -> None:
            self.ledger.mark_published(job_id, published_ids, history)
            # Left alone only after one more poll: the poll that first sees a job ended may read
            # its checkpoint history from Flink's REST cache (refreshed every few seconds) from
            # before the end, without the savepoint a stop-with-savepoint took.
            if state in mapping.TERMINAL_JOB_STATES:
                if job_id in self._seen_terminal:
                    self.ledger.mark_terminal(job_id)
                self._seen_terminal.add(job_id)

        return events, commit

    def _read_checkpoint_config(self, job: dict, state: str, sampled_at: int) -> dict:
        """``/checkpoints/config``, kept for the job's life once it can no longer change.

        Flink answers it from a cached execution graph (refreshed every ``web.refresh-interval``,
        3 s by default). Just after a job starts, that can still be the starting job's sparse
        graph: the interval without the storage, or a 404. So an answer that names the storage is
        kept at once, and any other only once the job has run, unchanged, for longer than the
        cache can be stale; before that it is asked again at the next poll. Keeping a stale
        answer would lose the JobManager storage's state limit for the job's whole life."""
        job_id = job["jid"]
        try:
            config = self.rest.get(f"/jobs/{job_id}/checkpoints/config")
        except FlinkRestError as exc:
            if exc.status != 404:  # a job without checkpointing has no checkpoint config
                raise
            config = {}
        changed_at = job.get("last-modification")  # the last change of the job's or a task's state
        settled = (state == "RUNNING" and isinstance(changed_at, int)
                   and sampled_at - changed_at >= CHECKPOINT_CONFIG_SETTLE_MS)
        if config.get("checkpoint_storage") or settled:
            self._checkpoint_config[job_id] = config
        return config

    def _checkpoint(self, job: dict, checkpoint: dict, vertices: list[dict], result: PollResult) -> dict:
        job_id, checkpoint_id = job["jid"], int(checkpoint["id"])
        details: dict | None = None
        subtasks: dict[str, dict] = {}
        try:
            details = self.rest.get(f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}")
            for vertex_id in (details.get("tasks") or {}):
                subtasks[vertex_id] = self.rest.get(f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{vertex_id}")
        except FlinkRestError as exc:
            # The summary from the history is still worth publishing; vertices are what is missing.
            result.errors.append(f"job {job_id} checkpoint {checkpoint_id} details: {exc}")
        return mapping.checkpoint_event(self.endpoint.name, job, checkpoint, details, subtasks, vertices, self.source)


def _file_name(cluster: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in cluster)


def kafka_publisher(config) -> tuple[Publish, Callable[[], None]]:
    """Send events to the input topic, keyed ``<cluster>/<job_id>``; returns (publish, close).
    ``publish`` returns only once Kafka acknowledged every event, and raises otherwise."""
    import json

    from pipelines.contracts import input_event_key
    from pipelines.io import kafka_clients

    kafka = config.kafka
    kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)
    producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
    lock = threading.Lock()

    def publish(events: list[dict]) -> None:
        with lock:
            futures = [producer.send(config.topics.input, key=input_event_key(event),
                                     value=json.dumps(event, separators=(",", ":")).encode()) for event in events]
            producer.flush()
            for future in futures:
                future.get(timeout=kafka.connect_timeout_s)

    return publish, producer.close


def run_collector(config, endpoints: Iterable[FlinkClusterEndpoint], once: bool = False,
                  stop: threading.Event | None = None, report: Callable[[PollResult], None] | None = None,
                  publish: Publish | None = None, metrics=None) -> list[PollResult]:
    """Poll every cluster (each on its own thread when continuous) until ``stop`` is set.

    With ``once``, polls each cluster once and returns the results (the cron-style mode). Every
    poll is accounted in ``metrics`` (a :class:`~pipelines.telemetry.CollectorMetrics`) when given."""
    endpoints = list(endpoints)
    if metrics is not None:
        shown = report

        def report(result: PollResult) -> None:
            metrics.record(result)
            if shown:
                shown(result)

    close: Callable[[], None] = lambda: None
    if publish is None:
        publish, close = kafka_publisher(config)
    settings = config.collector
    collectors = [ClusterCollector(endpoint, settings, publish, storage=config.storage) for endpoint in endpoints]
    stop = stop or threading.Event()
    results: list[PollResult] = []
    try:
        if once:
            for collector in collectors:
                results.append(collector.poll())
                if report:
                    report(results[-1])
            return results
        threads = [threading.Thread(target=_poll_forever, args=(c, settings, stop, report), daemon=True,
                                    name=f"collect-{c.endpoint.name}") for c in collectors]
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(timeout=0.5)
        except KeyboardInterrupt:
            # Let a poll in flight finish, so what it published is also recorded in its ledger.
            stop.set()
            for thread in threads:
                thread.join(timeout=settings.request_timeout_s * (settings.retries + 1) + 5)
            raise
        return results
    finally:
        close()


def _poll_forever(collector: ClusterCollector, settings: CollectorConfig, stop: threading.Event,
                  report: Callable[[PollResult], None] | None) -> None:
    failures = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            result = collector.poll()
        except Exception as exc:  # noqa: BLE001 - one bad poll (Kafka down, a bug on odd input) must not end collection
            log.exception("%s: poll failed: %s", collector.endpoint.name, exc)
            result = PollResult(collector.endpoint.name, reachable=False, errors=[f"{type(exc).__name__}: {exc}"])
        if report:
            report(result)
        failures = 0 if result.reachable else failures + 1
        pause = settings.interval_s if failures == 0 else min(settings.max_backoff_s, settings.interval_s * 2 ** failures)
        stop.wait(max(0.0, pause - (time.monotonic() - started)) if failures == 0 else pause)
