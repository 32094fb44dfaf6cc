"""One Flink cluster's poll (:class:`ClusterCollector`): its REST API read into input-contract events.

One :class:`ClusterCollector` per Flink cluster; the service (:mod:`pipelines.collector.service`)
polls every cluster on one event loop, each over its own pool of kept-alive connections with at most ``collector.max_concurrent_requests``
requests under way. Each poll reads ``/jobs/overview`` and the JobManager's heap
(``/jobmanager/metrics``) once, then polls the jobs side by side, and publishes each job's events
as soon as that job's poll is done (a slow job, or a slow vertex, delays nobody else's). Per job:

- ``job_status``: the overview entry, ``/jobs/:id/checkpoints`` counts, ``/checkpoints/config``
  (interval, timeout, storage; read until it names the storage or the job has settled, then
  kept) and the ``numRestarts`` job metric;
- ``checkpoint``: each newly finished checkpoint once, with ``/checkpoints/details/:cid/subtasks/:vid``
  of each vertex (which also carries the vertex's own totals, so ``/checkpoints/details/:cid``
  is not asked); the ledger remembers what was published, across restarts;
- ``vertex_metrics`` (running jobs): one request per vertex for the ``<subtask>.<metric>`` ids of
  ``/jobs/:id/vertices/:vid/metrics`` (a metric's older name only until the cluster shows it uses
  the newer one), at most once per refresh of the metrics the JobManager serves
  (``metrics.fetcher.update-interval`` in ``/jobmanager/config``, 10 s by default): asked more
  often, they repeat the values of the last answer.

The request budget: what cannot change while a job's tasks do not change state is not asked
again. ``/jobs/:id`` (the vertices and their parallelism) and ``numRestarts`` are kept while the
overview's ``last-modification`` of the job (the latest state change of the job or any of its
tasks: a restart, a rescale, a redeploy) stays the same, once the job has run unchanged for longer
than Flink's REST and metric caches can be stale (``SETTLE_MS``); before that they are asked at
every poll.

A job that reaches a terminal state gets two last polls (``job_status`` and its last checkpoints;
two, because Flink's REST cache can serve the first from before the end), then is left alone. A
failing request is retried with backoff; what still fails is logged and skipped (a checkpoint
whose details are gone is published without vertices; a job that cannot be read is tried again at
the next poll, its ledger untouched). A cluster that cannot be reached at all is polled again after
a growing pause, up to ``collector.max_backoff_s``. Events that do not satisfy the input contract
(a Flink answer nobody foresaw) are logged and counted, never published.

Several collector processes can share a fleet: ``collector.shard`` ``i/N`` makes a process poll
only the jobs that a rendezvous hash of the job id gives to shard ``i`` of ``N`` (see
:class:`~pipelines.collector.shard.Shard`), with a ledger file of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

from pipelines.collector import mapping
from pipelines.collector.ledger import CheckpointLedger
from pipelines.collector.rest import FlinkRestClient, FlinkRestError
from pipelines.collector.shard import Shard, ledger_base_name
from pipelines.config import CollectorConfig, FlinkClusterEndpoint, StorageConfig
from pipelines.io.input_publisher import Publish
from pipelines.io.storage import Location

log = logging.getLogger(__name__)

# Ten times Flink's default web.refresh-interval and three times its metrics.fetcher.update-interval:
# well past the REST and metric caches' staleness, and tolerant of some clock skew between the
# collector and the JobManager.
SETTLE_MS = 30_000
CONFIG_REREAD_S = 600  # the JobManager's metric refresh interval is read again this often


# What the starting job's sparse graph answers for the storage (Flink 2.3), not a storage's name.
UNKNOWN_STORAGE = "Unknown"


def names_storage(checkpoint_config: dict) -> bool:
    """Whether ``/checkpoints/config`` names the job's checkpoint storage."""
    return checkpoint_config.get("checkpoint_storage") not in (None, "", UNKNOWN_STORAGE)


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
    job_polls: int = 0  # jobs of this shard polled (the overview may list more)
    job_seconds: list[float] = field(default_factory=list)  # from the poll's start to each job's events published
    published: dict[str, int] = field(default_factory=dict)  # events published, by kind

    def __post_init__(self) -> None:
        for event in self.events:
            self.published[event["kind"]] = self.published.get(event["kind"], 0) + 1

    def line(self) -> str:
        kinds = {kind: self.published.get(kind, 0) for kind in ("job_status", "checkpoint", "vertex_metrics")}
        text = (f"{self.cluster}: {self.jobs} jobs, {kinds['checkpoint']} checkpoints, "
                f"{kinds['vertex_metrics']} vertex samples, {kinds['job_status']} job statuses")
        if self.invalid:
            text += f", {self.invalid} events off-contract (not published)"
        text += f" ({self.requests} requests, {self.duration_s:.2f}s)"
        if self.errors:
            text += f"; {len(self.errors)} errors, first: {self.errors[0]}"
        return text


@dataclass
class _JobCache:
    """What one job's poll keeps for the next: answers that cannot change while the job's tasks
    keep their state (``last_modification``)."""

    last_modification: object = None
    vertices: list[dict] | None = None
    job_metrics: dict | None = None


class ClusterCollector:
    """Polls one Flink cluster; each job's checkpoints are recorded in the ledger only once
    Kafka acknowledged its events, and the ledger is saved at the end of every poll."""

    def __init__(self, endpoint: FlinkClusterEndpoint, settings: CollectorConfig, publish: Publish,
                 clock: Callable[[], float] = time.time, source: str = "collector",
                 storage: StorageConfig | None = None, shard: Shard | None = None, keep_events: bool = True):
        self.endpoint = endpoint
        # Whether a poll's result lists its events (tests, --once) or only counts them (the
        # service: a fleet's cycle would otherwise keep every event alive until it ends).
        self.keep_events = keep_events
        self.publish = publish
        self.clock = clock
        self.source = source
        self.shard = shard or Shard.parse(settings.shard)
        self.settings = settings
        self.rest = FlinkRestClient(endpoint.rest_url, settings.request_timeout_s, settings.retries, settings.backoff_s,
                                    settings.max_concurrent_requests, security=settings.security)
        folder = Location.of(settings.state_dir, storage) if settings.state_dir else None
        self.ledger = CheckpointLedger(folder / self.shard.ledger_name(endpoint.name) if folder else None)
        if folder is not None:
            self._adopt_other_ledgers(folder)
        self._checkpoint_config: dict[str, dict] = {}
        self._jobs: dict[str, _JobCache] = {}
        self._seen_terminal: set[str] = set()
        self._metric_names = [name for candidates, _ in mapping.SUBTASK_METRICS.values() for name in candidates]
        # How often the JobManager refreshes the metrics it serves (0: unknown, asked every poll),
        # when that was last read, and when each job's vertex metrics were last asked.
        self._metrics_refresh_ms = 0
        self._refresh_read_at: float | None = None
        self._metrics_asked_ms: dict[str, int] = {}

    def _adopt_other_ledgers(self, folder: Location) -> None:
        """Merge into this shard's ledger its jobs' entries from the other ledgers of the cluster
        (one process, or another shard count, before a change of N): a job moved between shards
        is not published again from its start, and an older layout's file left behind only ever
        adds what was published."""
        base = ledger_base_name(self.endpoint.name)
        others = [name for name in folder.names() if name == f"{base}.json"
                  or (name.startswith(f"{base}.shard-") and name.endswith(".json"))]
        for name in others:
            if name == self.shard.ledger_name(self.endpoint.name):
                continue
            adopted = CheckpointLedger(folder / name).jobs
            for job_id, entry in adopted.items():
                if self.shard.owns(self.endpoint.name, job_id):
                    self.ledger.adopt(job_id, entry)
        if others:
            log.info("%s shard %s: took %d jobs' ledger entries from %s", self.endpoint.name, self.shard,
                     len(self.ledger.jobs), ", ".join(others))

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def poll(self) -> PollResult:
        """One poll from synchronous code (the tests, ``--once``): its own event loop, and its
        connections closed at the end."""
        async def poll_and_close() -> PollResult:
            try:
                return await self.poll_async()
            finally:
                await self.rest.close()

        return asyncio.run(poll_and_close())

    async def poll_async(self) -> PollResult:
        started, requests_before = time.monotonic(), self.rest.requests
        result = PollResult(self.endpoint.name)
        try:
            await self._poll(result, started)
        finally:
            result.requests, result.duration_s = self.rest.requests - requests_before, time.monotonic() - started
            result.request_seconds = self.rest.take_latencies()
        return result

    async def _poll(self, result: PollResult, started: float) -> None:
        overview_task = asyncio.ensure_future(self.rest.get("/jobs/overview"))
        heap_task = asyncio.ensure_future(self.rest.metrics("/jobmanager/metrics", mapping.JM_HEAP_METRICS))
        refresh_task = None
        if self._refresh_read_at is None or time.monotonic() - self._refresh_read_at > CONFIG_REREAD_S:
            refresh_task = asyncio.ensure_future(self._read_metrics_refresh())
        try:
            overview = await overview_task
        except FlinkRestError as exc:
            heap_task.cancel()
            await asyncio.gather(heap_task, *([refresh_task] if refresh_task else []), return_exceptions=True)
            self._refresh_read_at = None
            result.reachable = False
            result.errors.append(str(exc))
            return
        try:
            jm_metrics = await heap_task
        except FlinkRestError as exc:
            result.errors.append(str(exc))
            jm_metrics = {}
        if refresh_task is not None:
            await refresh_task
        listed = [job for job in overview.get("jobs") or [] if isinstance(job, dict) and job.get("jid")]
        result.jobs = len(listed)
        mine = [job for job in listed if self.shard.owns(self.endpoint.name, job["jid"])]
        jobs = [job for job in mine if not self.ledger.terminal_reported(job["jid"])]
        result.job_polls = len(jobs)
        # At most as many jobs under way as requests may be: each job's events are published as
        # soon as its own requests are answered, instead of every job waiting for the slowest.
        running = asyncio.Semaphore(self.settings.max_concurrent_requests)
        publish_failures: list[BaseException] = []

        async def one(job: dict) -> None:
            async with running:
                try:
                    await self._collect_job(job, jm_metrics, result, publish_failures, started)
                except Exception as exc:  # noqa: BLE001 - one job's odd answer must not stop the others' polls
                    log.exception("%s: job %s: %s", self.endpoint.name, job["jid"], exc)
                    result.errors.append(f"job {job['jid']}: {type(exc).__name__}: {exc}")

        await asyncio.gather(*(one(job) for job in jobs))
        mine_ids = {job["jid"] for job in mine}
        self.ledger.forget_except(mine_ids, self._now_ms())
        for gone in [j for j in self._jobs if j not in mine_ids]:
            del self._jobs[gone]
        for gone in [j for j in self._checkpoint_config if j not in mine_ids]:
            del self._checkpoint_config[gone]
        for gone in [j for j in self._metrics_asked_ms if j not in mine_ids]:
            del self._metrics_asked_ms[gone]
        self._seen_terminal &= mine_ids
        self.ledger.save()
        for error in result.errors:
            log.warning("%s: %s", self.endpoint.name, error)
        if publish_failures:
            raise publish_failures[0]  # Kafka did not take some jobs' events: they are polled again

    async def _collect_job(self, job: dict, jm_metrics: dict, result: PollResult,
                           publish_failures: list[BaseException], started: float) -> None:
        from pipelines.contracts import INPUT

        try:
            events, commit = await self._poll_job(job, jm_metrics, result)
        except FlinkRestError as exc:
            result.errors.append(f"job {job['jid']}: {exc}")
            return
        valid = []
        for event in events:
            if INPUT.accepts(event):
                valid.append(event)
                continue
            result.invalid += 1
            log.error("%s: %s event of job %s breaks the input contract (%s); not published",
                      self.endpoint.name, event["kind"], event["job_id"], "; ".join(INPUT.errors(event)[:3]))
        try:
            if valid:
                outcome = self.publish(valid)
                if inspect.isawaitable(outcome):
                    await outcome
        except Exception as exc:  # noqa: BLE001 - nothing recorded: the next poll publishes them again
            publish_failures.append(exc)
            return
        commit()
        if self.keep_events:
            result.events.extend(valid)
        for event in valid:
            result.published[event["kind"]] = result.published.get(event["kind"], 0) + 1
        result.job_seconds.append(time.monotonic() - started)

    async def _read_metrics_refresh(self) -> None:
        """``metrics.fetcher.update-interval`` from ``/jobmanager/config``; unknown (0: vertex
        metrics asked at every poll) when the JobManager does not say."""
        try:
            answer = await self.rest.get("/jobmanager/config")
        except FlinkRestError as exc:
            log.info("%s: %s; vertex metrics asked at every poll", self.endpoint.name, exc)
            answer = None
        refresh = mapping.metrics_refresh_ms(answer)
        self._metrics_refresh_ms = refresh or 0
        self._refresh_read_at = time.monotonic()

    def _vertex_metrics_due(self, job_id: str, sampled_at: int) -> bool:
        """Whether this poll asks the job's vertex metrics: unless the JobManager has not refreshed
        them since they were last asked (polled every 5 s, a cluster refreshing every 10 s would
        answer every other poll with the values of the one before, stamped with a later time)."""
        interval_ms = self.settings.interval_s * 1000
        last = self._metrics_asked_ms.get(job_id)
        if last is None:
            # As if last asked a job-dependent share of a refresh ago: the fleet's jobs are asked
            # in different polls, each poll the same load, instead of all of them every other poll.
            share = zlib.crc32(job_id.encode()) % 1000 / 1000
            last = sampled_at - int(share * self._metrics_refresh_ms)
        if sampled_at - last < self._metrics_refresh_ms - interval_ms / 2:
            self._metrics_asked_ms[job_id] = last
            return False
        self._metrics_asked_ms[job_id] = sampled_at
        return True

    def _settled(self, job: dict, state: str, sampled_at: int) -> bool:
        changed_at = job.get("last-modification")  # the last change of the job's or a task's state
        return state == "RUNNING" and isinstance(changed_at, int) and sampled_at - changed_at >= SETTLE_MS

    async def _poll_job(self, job: dict, jm_metrics: dict, result: PollResult) -> tuple[list[dict], Callable[[], None]]:
        job_id = job["jid"]
        name = self.endpoint.name
        state = str(job.get("state") or "").upper()
        sampled_at = self._now_ms()
        cache = self._jobs.get(job_id)
        settled = self._settled(job, state, sampled_at)
        unchanged = cache is not None and settled and cache.last_modification == job.get("last-modification")
        if not unchanged:
            cache = self._jobs[job_id] = _JobCache(job.get("last-modification"))

        async def job_metrics() -> dict:
            if cache.job_metrics is not None:
                return cache.job_metrics
            try:
                values = await self.rest.metrics(f"/jobs/{job_id}/metrics", mapping.JOB_METRICS)
            except FlinkRestError as exc:
                result.errors.append(f"job {job_id}: {exc}")
                return {}
            if settled and all(name in values for name in mapping.JOB_METRICS):
                cache.job_metrics = values  # Flink's first answers can lack a metric: asked again
            return values

        async def vertices() -> list[dict]:
            if cache.vertices is not None:
                return cache.vertices
            details = await self.rest.get(f"/jobs/{job_id}")
            found = [v for v in details.get("vertices") or [] if isinstance(v, dict) and v.get("id")]
            if settled:
                cache.vertices = found
            return found

        async def checkpoint_config() -> dict:
            known = self._checkpoint_config.get(job_id)
            return known if known is not None else await self._read_checkpoint_config(job, state, sampled_at)

        if cache.vertices is not None and cache.job_metrics is not None and job_id in self._checkpoint_config:
            # A settled job: nothing but its checkpoints to ask (no tasks to schedule for the rest).
            job_vertices, metrics, config = cache.vertices, cache.job_metrics, self._checkpoint_config[job_id]
            checkpoints = await self.rest.get(f"/jobs/{job_id}/checkpoints")
        else:
            tasks = [asyncio.ensure_future(vertices()), asyncio.ensure_future(self.rest.get(f"/jobs/{job_id}/checkpoints")),
                     asyncio.ensure_future(checkpoint_config()), asyncio.ensure_future(job_metrics())]
            try:
                job_vertices, checkpoints, config, metrics = await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        status = mapping.job_status_event(name, job, checkpoints, config, metrics, jm_metrics, sampled_at,
                                          self.endpoint.max_state_size_bytes, self.source)

        history = [c for c in checkpoints.get("history") or [] if isinstance(c, dict) and "id" in c]
        fresh = self.ledger.unpublished(job_id, history)
        checkpoint_events = [self._checkpoint(job, checkpoint, job_vertices, result) for checkpoint in fresh]
        vertex_events = ([self._vertex_metrics(job, vertex, result) for vertex in job_vertices]
                         if state == "RUNNING" and self._vertex_metrics_due(job_id, sampled_at) else [])
        done = await asyncio.gather(*checkpoint_events, *vertex_events)
        events = [status, *(event for event in done if event is not None)]
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

    async def _vertex_metrics(self, job: dict, vertex: dict, result: PollResult) -> dict | None:
        job_id = job["jid"]
        parallelism = int(vertex.get("parallelism") or 1)
        try:
            values = await self.rest.metrics(f"/jobs/{job_id}/vertices/{vertex['id']}/metrics",
                                             mapping.subtask_metric_names(parallelism, self._metric_names))
        except FlinkRestError as exc:
            result.errors.append(f"job {job_id} vertex {vertex['id']}: {exc}")
            return None
        self._metric_names = mapping.names_in_use(self._metric_names, values)
        return mapping.vertex_metrics_event(self.endpoint.name, job, vertex, values, self._now_ms(), self.source)

    async def _read_checkpoint_config(self, job: dict, state: str, sampled_at: int) -> dict:
        """``/checkpoints/config``, kept for the job's life once it can no longer change.

        Flink answers it from a cached execution graph (refreshed every ``web.refresh-interval``,
        3 s by default). Just after a job starts, that can still be the starting job's sparse
        graph: the interval without the storage (Flink 2.3 says ``"Unknown"``), or a 404. So an
        answer that names the storage is kept at once, and any other only once the job has run,
        unchanged, for longer than the cache can be stale; before that it is asked again at the
        next poll. Keeping a stale answer would lose the JobManager storage's state limit for the
        job's whole life."""
        job_id = job["jid"]
        try:
            config = await self.rest.get(f"/jobs/{job_id}/checkpoints/config")
        except FlinkRestError as exc:
            if exc.status != 404:  # a job without checkpointing has no checkpoint config
                raise
            config = {}
        if names_storage(config) or self._settled(job, state, sampled_at):
            self._checkpoint_config[job_id] = config
        return config

    async def _checkpoint(self, job: dict, checkpoint: dict, vertices: list[dict], result: PollResult) -> dict:
        """The checkpoint's event, with each vertex's ``/checkpoints/details/:cid/subtasks/:vid``:
        that answer holds the vertex's totals too (what ``/checkpoints/details/:cid`` lists per
        vertex), so the details themselves are not asked. A vertex the checkpoint did not include
        answers 404 and is left out; when every vertex does, the checkpoint is gone from Flink's
        cache and its summary from the history is published without vertices."""
        job_id, checkpoint_id = job["jid"], int(checkpoint["id"])
        base = f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/"
        answers = await asyncio.gather(*(self.rest.get(base + vertex["id"]) for vertex in vertices),
                                       return_exceptions=True)
        subtasks: dict[str, dict] = {}
        missing: list[FlinkRestError] = []
        for vertex, answer in zip(vertices, answers):
            if isinstance(answer, FlinkRestError):
                if answer.status == 404:
                    missing.append(answer)
                else:
                    result.errors.append(f"job {job_id} checkpoint {checkpoint_id} details of vertex {vertex['id']}: {answer}")
            elif isinstance(answer, BaseException):
                raise answer
            elif isinstance(answer, dict):
                subtasks[vertex["id"]] = answer
        if vertices and len(missing) == len(vertices):
            result.errors.append(f"job {job_id} checkpoint {checkpoint_id} details: {missing[0]}")
        details = {"tasks": subtasks} if subtasks else None
        return mapping.checkpoint_event(self.endpoint.name, job, checkpoint, details, subtasks, vertices, self.source)
