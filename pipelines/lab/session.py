"""A lab session: one Flink cluster, one collector, and the variants running on it.

It starts the local standalone cluster (:mod:`infra.flink_cluster`), submits variants
(:mod:`pipelines.lab.scenarios`) of the scenario job (``flink_jobs/scenario_job.py``) with their
faults' onsets as wall-clock times, several at once where the cluster has slots, cancels each
when its time is up (making its checkpoint storage refuse writes while a scenario says so), and
records each run with its ground truth (:mod:`pipelines.lab.truth`) when its end is collected.
A run that does not show its scenario is run once more.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from pipelines.datasets import SPLITS, recorded_runs
from pipelines.errors import SetupError
from pipelines.lab.scenarios import NAMED, LabVariant
from pipelines.lab.truth import LAB_CLUSTER, STARTUP_MARGIN_MS, at_ms, ground_truth, record_run, unsound

JOB_DIR = Path(__file__).parent / "flink_jobs"
JOB_SCRIPT = JOB_DIR / "scenario_job.py"
# A PyFlink client compiling its plan on a loaded machine (2 cores shared) took over two minutes.
SUBMIT_TIMEOUT_S = 300.0


class LabError(SetupError, RuntimeError):
    """A lab run that cannot be done as asked; the message says what to change."""


def scenario(name: str, duration_s: int) -> LabVariant:
    try:
        return NAMED[name].variant(duration_s)
    except KeyError:
        raise LabError(f"unknown lab scenario {name!r}; choose from {', '.join(NAMED)}") from None


@dataclass
class LabRun:
    variant: LabVariant
    job_id: str
    events: list[dict]
    truth: dict
    dataset: Path

    @property
    def scenario(self) -> str:
        return self.variant.run_id

    def summary(self) -> str:
        kinds = {k: sum(e["kind"] == k for e in self.events) for k in ("checkpoint", "vertex_metrics", "job_status")}
        sizes = [e["state_size_bytes"] for e in self.events if e["kind"] == "checkpoint" and e["status"] == "COMPLETED"]
        failed = sum(1 for e in self.events if e["kind"] == "checkpoint" and e["status"] == "FAILED")
        state = f"state {sizes[0]:,} -> {sizes[-1]:,} bytes" if sizes else "no completed checkpoint"
        return (f"lab {self.variant.run_id}: job {self.job_id}, {kinds['checkpoint']} checkpoints ({failed} failed, "
                f"{state}), {kinds['vertex_metrics']} vertex samples, {kinds['job_status']} job statuses; "
                f"labelled {', '.join(self.truth['families']) or 'healthy'}; recorded in "
                f"{self.dataset / self.variant.split}")


@dataclass
class _Active:
    variant: LabVariant
    job_id: str
    job_name: str
    submitted_at: int
    onset_ms: int
    deadline: float  # monotonic
    cancelled_at: int | None = None
    cancel_deadline: float | None = None
    stop_requested: float | None = None
    outage_blocked: bool = False


@dataclass
class LabSession:
    """One Flink cluster, one collector, and the variants running on it (up to ``concurrency``)."""

    config: object
    dataset: Path
    concurrency: int = 1
    publish_to_kafka: bool = True
    interval_s: float | None = None
    progress: Callable[[str], None] = print
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, variants: Sequence[LabVariant], keep_cluster: bool = False) -> list[LabRun]:
        from infra.flink_cluster import LocalFlinkCluster, ensure_flink_runtime
        from pipelines.collector import ClusterCollector
        from pipelines.config import FlinkClusterEndpoint
        from pipelines.io.input_publisher import kafka_publisher

        version = self.config.lab.flink_version
        elsewhere = [v.run_id for v in variants if v.flink_version != version]
        if elsewhere:
            raise LabError(f"{', '.join(elsewhere)} are runs for another Flink version than lab.flink_version={version}")
        slots = self.config.lab.taskmanager_slots
        too_wide = [v.run_id for v in variants if v.parallelism > slots]
        if too_wide:
            raise LabError(f"{', '.join(too_wide)} need more than lab.taskmanager_slots={slots} slots")
        publish_kafka, close_kafka = (kafka_publisher(self.config) if self.publish_to_kafka else (None, lambda: None))
        by_job: dict[str, list[dict]] = {}

        def publish(batch: list[dict]) -> None:
            if publish_kafka is not None:
                publish_kafka(batch)
            for event in batch:
                by_job.setdefault(event["job_id"], []).append(event)

        cluster = LocalFlinkCluster(self.config, ensure_flink_runtime(self.config, log=self.progress))
        pending = list(variants)
        active: dict[str, _Active] = {}
        done: list[LabRun] = []
        retried: set[str] = set()
        submitting: tuple[LabVariant, int, Future] | None = None
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flink-submit")
        try:
            self.progress(cluster.start())
            for job_id in cluster.running_jobs():  # left over by an interrupted session
                self.progress(f"cancelling job {job_id}, left running by an earlier lab session")
                cluster.cancel(job_id)
            settings = self.config.collector.model_copy(update={
                "state_dir": Path(self.config.lab.datasets_dir) / "collector",
                **({"interval_s": self.interval_s} if self.interval_s else {})})
            collector = ClusterCollector(FlinkClusterEndpoint(name=LAB_CLUSTER, rest_url=cluster.rest_url),
                                         settings, publish, source="lab")
            started = time.monotonic()
            while (pending or active or submitting) and not self.stop.is_set():
                poll_started = time.monotonic()
                if submitting is not None and submitting[2].done():
                    variant, submitted_at, future = submitting
                    submitting = None
                    try:
                        job_id = future.result()
                    except Exception as exc:  # noqa: BLE001  a refused job must not stop the grid
                        self.progress(f"  {variant.run_id}: Flink refused the job ({exc}); skipped")
                    else:
                        active[job_id] = self._activate(variant, job_id, submitted_at)
                if submitting is None and pending and self._fits(pending[0], active.values()):
                    variant = pending.pop(0)
                    submitted_at = int(time.time() * 1000)
                    argv = self._argv(variant, submitted_at)
                    submitting = (variant, submitted_at, pool.submit(cluster.submit_python, JOB_DIR / variant.script, argv,
                                                          SUBMIT_TIMEOUT_S))
                result = collector.poll()
                if not result.reachable:
                    raise LabError(f"the lab cluster stopped answering: {result.errors[0]}")
                elapsed = time.monotonic() - started
                self.progress(f"  {elapsed:6.0f}s  {len(active)} running, {len(pending)} waiting; {result.line()}")
                if (active or submitting) and not cluster.taskmanager_alive():
                    # The TaskManager died under the jobs (a native crash): what ran on it is not
                    # the scenario any more. Start a new one and run those variants again.
                    self.progress(f"  the TaskManager died; {cluster.restart_taskmanager()}; running "
                                  f"{', '.join(r.variant.run_id for r in active.values()) or 'nothing'} again")
                    for job_id, run in list(active.items()):
                        cluster.cancel(job_id)
                        self._unblock_storage(cluster, run)
                        by_job.pop(job_id, None)
                        pending.insert(0, run.variant)
                    active.clear()
                    continue
                for job_id, run in list(active.items()):
                    self._storage_outage(cluster, run)
                    finished = self._advance(cluster, run, by_job.get(job_id, []))
                    if finished:
                        del active[job_id]
                        events = by_job.pop(job_id, [])
                        problem = unsound(run.variant, events, run.cancelled_at, run.submitted_at)
                        if problem and run.variant.run_id not in retried:
                            retried.add(run.variant.run_id)
                            pending.insert(0, run.variant)
                            self.progress(f"  {run.variant.run_id}: {problem}; running it again")
                            continue
                        done.append(self._record(run, events))
                        self.progress(done[-1].summary() + (f" (recorded although {problem})" if problem else ""))
                self.stop.wait(max(0.0, settings.interval_s - (time.monotonic() - poll_started)))
            return done
        finally:
            pool.shutdown(wait=True)
            for job_id, run in active.items():
                self._unblock_storage(cluster, run)
                cluster.cancel(job_id)
            close_kafka()
            if not keep_cluster:
                for line in cluster.stop():
                    self.progress(line)

    def _fits(self, variant: LabVariant, active: Iterable[_Active]) -> bool:
        running = list(active)
        used = sum(r.variant.parallelism for r in running)
        return len(running) < self.concurrency and used + variant.parallelism <= self.config.lab.taskmanager_slots

    def _argv(self, variant: LabVariant, submitted_at: int) -> list[str]:
        onset_ms = submitted_at + STARTUP_MARGIN_MS + int(variant.onset_s * 1000)
        args = {**variant.job_args, **{name: onset_ms for name in variant.onset_args},
                **{name: at_ms(submitted_at, seconds) for name, seconds in variant.at_args}}
        argv = ["--job-name", f"lab-{variant.run_id}"]
        for key, value in args.items():
            argv += [f"--{key}", str(value)]
        return argv

    def _activate(self, variant: LabVariant, job_id: str, submitted_at: int) -> _Active:
        onset_ms = submitted_at + (STARTUP_MARGIN_MS + int(variant.onset_s * 1000) if variant.onset_s else 0)
        self.progress(f"  submitted lab-{variant.run_id} as job {job_id} ({variant.split}; "
                      f"{variant.duration_s}s, onset {variant.onset_s:g}s)")
        return _Active(variant, job_id, f"lab-{variant.run_id}", submitted_at, onset_ms,
                       time.monotonic() + variant.duration_s)

    def _advance(self, cluster, run: _Active, events: list[dict]) -> bool:
        """Cancel a run whose time is up; True once its terminal status has been collected."""
        now = time.monotonic()
        if run.cancelled_at is None:
            if now >= run.deadline:
                self._unblock_storage(cluster, run)
                if cluster.stop_with_savepoint(run.job_id):
                    run.stop_requested = now
                else:
                    cluster.cancel(run.job_id)
                run.cancelled_at, run.cancel_deadline = int(time.time() * 1000), now + 60
            return False
        if run.stop_requested is not None and now - run.stop_requested > 30:
            cluster.cancel(run.job_id)  # the savepoint could not be taken (failing checkpoints): cancel
            run.stop_requested = None
        from pipelines.collector.mapping import TERMINAL_JOB_STATES

        # The collector polls an ended job twice (its first view can predate the savepoint).
        terminal = sum(e["kind"] == "job_status" and e["state"] in TERMINAL_JOB_STATES for e in events) >= 2
        return terminal or now >= run.cancel_deadline

    def _record(self, run: _Active, events: list[dict]) -> LabRun:
        truth = ground_truth(run.variant, run.job_id, run.job_name, events, run.onset_ms, run.submitted_at,
                             run.cancelled_at)
        info = {"run_id": run.variant.run_id, "split": run.variant.split, "scenario": run.variant.scenario,
                "description": run.variant.description, "job_id": run.job_id, "duration_s": run.variant.duration_s,
                "onset_s": run.variant.onset_s, "params": run.variant.job_args, "families": truth["families"],
                "events": len(events), "flink_version": self.config.lab.flink_version,
                "job_kind": run.variant.kind, "length": run.variant.length,
                "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if run.variant.storage_outage:
            info["storage_outage"] = list(run.variant.storage_outage)
        record_run(self.dataset, run.variant.split, events, truth, info)
        return LabRun(run.variant, run.job_id, events, truth, self.dataset)

    # --- checkpoint storage that refuses writes ------------------------------------------------------

    def _storage_outage(self, cluster, run: _Active) -> None:
        """While down, the job's checkpoint folder is a plain file: Flink cannot create ``chk-<n>`` in it."""
        outage = run.variant.storage_outage
        if not outage or run.cancelled_at is not None:
            return
        since_onset_s = time.time() - run.onset_ms / 1000.0
        down = since_onset_s >= 0 and (since_onset_s % outage[0]) < outage[1]
        if down and not run.outage_blocked:
            folder = cluster.checkpoint_dir / run.job_id
            if folder.is_dir():
                folder.rename(folder.with_name(folder.name + ".stash"))
            folder.write_text("lab: checkpoint storage unavailable\n")
            run.outage_blocked = True
        elif not down and run.outage_blocked:
            self._unblock_storage(cluster, run)

    def _unblock_storage(self, cluster, run: _Active) -> None:
        if not run.outage_blocked:
            return
        folder = cluster.checkpoint_dir / run.job_id
        if folder.is_file():
            folder.unlink()
        stash = folder.with_name(folder.name + ".stash")
        if stash.is_dir() and not folder.exists():
            stash.rename(folder)
        elif stash.is_dir():
            shutil.rmtree(stash, ignore_errors=True)
        run.outage_blocked = False


def default_dataset(config) -> Path:
    return Path(config.lab.datasets_dir) / "dataset"


def run_lab(config, name: str, duration: str = "4m", split: str = "test", dataset: Path | None = None,
            publish_to_kafka: bool = True, keep_cluster: bool = False, interval_s: float | None = None,
            progress: Callable[[str], None] = print, stop: threading.Event | None = None) -> LabRun:
    """Run one named lab scenario end to end and record it."""
    from pipelines.simulator import parse_duration

    if split not in SPLITS:
        raise LabError(f"--split must be one of {', '.join(SPLITS)}")
    variant = scenario(name, parse_duration(duration) // 1000).with_(split=split).on_version(config.lab.flink_version)
    session = LabSession(config, Path(dataset or default_dataset(config)), 1, publish_to_kafka, interval_s, progress,
                         stop or threading.Event())
    runs = session.run([variant], keep_cluster=keep_cluster)
    if not runs:
        raise LabError(f"the lab run {name} was stopped before it was recorded")
    return runs[0]


def run_grid(config, variants: Sequence[LabVariant], dataset: Path, concurrency: int = 3,
             publish_to_kafka: bool = False, interval_s: float | None = None, progress: Callable[[str], None] = print,
             stop: threading.Event | None = None) -> list[LabRun]:
    """Record every variant not yet in ``dataset``, ``concurrency`` jobs at a time."""
    done = recorded_runs(dataset)
    todo = [v for v in variants if v.run_id not in done]
    progress(f"grid: {len(variants)} variants, {len(variants) - len(todo)} already recorded in {dataset}, "
             f"{len(todo)} to run, {concurrency} at a time (about "
             f"{sum(v.duration_s + 20 for v in todo) / max(1, concurrency) / 60:.0f} min)")
    if not todo:
        return []
    os.makedirs(dataset, exist_ok=True)
    session = LabSession(config, dataset, concurrency, publish_to_kafka, interval_s, progress, stop or threading.Event())
    return session.run(todo)