"""``sentinel lab``: real Flink jobs that fail the way production jobs do, recorded as labelled data.

A lab session starts the local standalone cluster (:mod:`infra.flink_cluster`), submits variants
(``pipelines/lab/scenarios.py``) of the scenario job (``flink_jobs/scenario_job.py``) with their
faults' onsets as wall-clock times, several at once where the cluster has slots, and runs one
collector against the cluster: the events go to the input topic (so a live detection job sees
real Flink) and into a dataset folder in the layout the retraining workflow reads
(``<dataset>/<split>/events.jsonl.gz``, ``ground_truth.jsonl``, ``manifest.json``), with each
job's ground truth (families, onsets, vertices, hot subtask).

A grid (``sentinel lab --grid corpus``) is resumable: a run is added to the dataset folder when
it ends, and variants already recorded there are skipped, so an interrupted grid picks up where
it stopped (the runs in flight are run again).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from feature_store.job_features import STOPPING_FAILURES
from pipelines import datasets
from pipelines.datasets import read_jsonl, write_jsonl
from pipelines.errors import SetupError
from pipelines.families import BACKPRESSURE, CHECKPOINT_FAILURE
from pipelines.lab.scenarios import DATASTREAM, LONG_RUN_S, NAMED, LabVariant

log = logging.getLogger(__name__)

JOB_DIR = Path(__file__).parent / "flink_jobs"
JOB_SCRIPT = JOB_DIR / "scenario_job.py"
LAB_CLUSTER = "lab"
SPLITS = ("train", "validation", "test")
# Submission (the PyFlink client compiling the plan) takes about ten seconds: onsets count from after it.
STARTUP_MARGIN_MS = 15_000
# A PyFlink client compiling its plan on a loaded machine (2 cores shared) took over two minutes.
SUBMIT_TIMEOUT_S = 300.0
DATASET_FORMAT = "checkpoint-sentinel dataset v1"


class LabError(SetupError, RuntimeError):
    """A lab run that cannot be done as asked; the message says what to change."""


def scenario(name: str, duration_s: int) -> LabVariant:
    try:
        return NAMED[name].variant(duration_s)
    except KeyError:
        raise LabError(f"unknown lab scenario {name!r}; choose from {', '.join(NAMED)}") from None


# --- dataset files -------------------------------------------------------------------------------


def lab_manifest(dataset: Path) -> dict:
    return datasets.load_manifest(dataset) or {"format": DATASET_FORMAT, "source": "lab", "splits": {},
                                               "scenarios": [], "runs": {}}


def recorded_runs(dataset: Path) -> set[str]:
    return set(lab_manifest(dataset).get("runs", {}))


def remove_runs(dataset: Path, run_ids: Sequence[str]) -> list[str]:
    """Take runs out of a dataset folder (events, ground truth, manifest); returns those removed."""
    manifest = lab_manifest(dataset)
    runs = manifest.get("runs", {})
    gone = [r for r in run_ids if r in runs]
    for split in {runs[r]["split"] for r in gone}:
        jobs = {runs[r]["job_id"] for r in gone if runs[r]["split"] == split}
        path = datasets.events_path(dataset, split)
        write_jsonl(path, [e for e in read_jsonl(path) if e["job_id"] not in jobs])
        truth_path = dataset / split / "ground_truth.jsonl"
        truths = [t for t in read_jsonl(truth_path) if t["job_id"] not in jobs]
        write_jsonl(truth_path, truths)
        manifest["splits"][split] = {"jobs": len(truths), "events": sum(1 for _ in read_jsonl(path)),
                                     "job_ids": sorted(t["job_id"] for t in truths)}
    for run_id in gone:
        del runs[run_id]
    (dataset / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return gone


def merge_runs(source: Path, target: Path) -> list[str]:
    """Add the runs recorded in the dataset folder ``source`` to ``target`` (each in the split it
    was recorded in; a run ``target`` holds already is replaced); returns their run ids."""
    runs = lab_manifest(source).get("runs", {})
    for split in sorted({run["split"] for run in runs.values()}):
        path = datasets.events_path(source, split)
        events: dict[str, list[dict]] = {}
        for event in read_jsonl(path) if path else ():
            events.setdefault(event["job_id"], []).append(event)
        truths = {t["job_id"]: t for t in read_jsonl(source / split / "ground_truth.jsonl")}
        for run_id, info in sorted(runs.items()):
            held = lab_manifest(target).get("runs", {}).get(run_id)
            if held is not None and held["job_id"] != info["job_id"]:
                remove_runs(target, [run_id])  # recorded again since: the new recording replaces it
            if info["split"] == split:
                record_run(target, split, events.get(info["job_id"], []), truths[info["job_id"]], info)
    return sorted(runs)


def unsound(variant: LabVariant, events: Sequence[dict], cancelled_at: int | None = None,
            submitted_at: int | None = None) -> str | None:
    """Why a recorded run does not show its scenario (the lab failed, not the job), or None. A
    restart after the lab asked the job to stop (Flink 1.20 restarts a job whose stop-with-savepoint
    failed) is the lab ending the run, not the scenario."""
    completed = sum(1 for e in events if e["kind"] == "checkpoint" and e["status"] == "COMPLETED")
    if completed < 3:
        return f"only {completed} completed checkpoints"
    restarts = max((e["num_restarts"] for e in events if e["kind"] == "job_status"
                    and (cancelled_at is None or e["ts"] < cancelled_at)), default=0)
    if restarts and not variant.job_args.get("fail-after-s") and "fail-onset-ms" not in variant.onset_args:
        return f"{restarts} restarts the scenario does not cause"
    ends = [fault.end_s for fault in variant.faults if fault.end_s is not None]
    if ends and submitted_at is not None and events:
        first = min(e["ts"] for e in events)
        if at_ms(submitted_at, min(ends)) <= first:
            return "its fault ended before the job's first event (the submission outlasted it)"
    if variant.expect_failures is not None:
        failed = len(failed_checkpoints(events, cancelled_at))
        if variant.expect_failures and not failed:
            return "no checkpoint failed: the build-up did not reach its failure"
        if not variant.expect_failures and failed:
            return f"{failed} checkpoints failed in a run that must stay under its timeout"
    return None


def record_run(dataset: Path, split: str, events: list[dict], truth: dict, info: dict | None = None) -> None:
    """Add one run to the dataset folder: its events merged in time order into the split's
    events, one ground-truth line, and its entry in the manifest (a run recorded again replaces itself)."""
    folder = dataset / split
    previous = datasets.events_path(dataset, split)
    events_path, truth_path = folder / "events.jsonl.gz", folder / "ground_truth.jsonl"
    kept = [e for e in read_jsonl(previous) if e["job_id"] != truth["job_id"]] if previous else []
    merged = sorted(kept + events, key=lambda e: (e["ts"], e["job_id"], e["kind"]))
    write_jsonl(events_path, merged)
    if previous is not None and previous != events_path:
        previous.unlink()
    truths = [t for t in (read_jsonl(truth_path) if truth_path.is_file() else []) if t["job_id"] != truth["job_id"]]
    write_jsonl(truth_path, truths + [truth])
    manifest = lab_manifest(dataset)
    manifest.setdefault("runs", {})
    if info is not None:
        manifest["runs"][info["run_id"]] = info
    for entry in manifest["runs"].values():
        # Runs recorded before versions, kinds and lengths were told apart: all DataStream jobs.
        entry.setdefault("job_kind", DATASTREAM)
        if "duration_s" in entry:
            entry.setdefault("length", "long" if entry["duration_s"] >= LONG_RUN_S else "short")
    manifest["splits"][split] = {"jobs": len(truths) + 1, "events": len(merged),
                                 "job_ids": sorted([t["job_id"] for t in truths] + [truth["job_id"]])}
    manifest["scenarios"] = sorted({t["scenario"] for s in manifest["splits"]
                                    for t in read_jsonl(dataset / s / "ground_truth.jsonl")})
    (dataset / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


# --- ground truth ----------------------------------------------------------------------------------


def _stopping(event: dict, cancelled_at: int | None) -> bool:
    message = event.get("failure_message") or ""
    return any(m in message for m in STOPPING_FAILURES) or (cancelled_at is not None and event["ts"] >= cancelled_at)


def failed_checkpoints(events: Sequence[dict], cancelled_at: int | None = None) -> list[dict]:
    """The run's FAILED checkpoints that are the job's own (not the ones its cancellation aborted)."""
    return [e for e in events if e["kind"] == "checkpoint" and e["status"] == "FAILED" and not _stopping(e, cancelled_at)]


def ground_truth(variant: LabVariant, job_id: str, job_name: str, events: Sequence[dict], onset_ms: int,
                 submitted_at: int, cancelled_at: int | None = None) -> dict:
    """The dataset's ground-truth shape, from what the run did: each fault's vertex is found by its
    operator name, a skew's hot subtask is the one that received most records after the onset,
    backpressure begins where another vertex first waits on the culprit, and checkpoint failures
    are labelled where the run really had failed checkpoints."""
    times = [e["ts"] for e in events]
    start_ts, end_ts = (min(times), max(times)) if times else (submitted_at, submitted_at)
    names = {e["vertex_name"]: e["vertex_id"] for e in events if e["kind"] == "vertex_metrics"}
    onset_ts = max(onset_ms, start_ts)
    failures = [e["ts"] for e in failed_checkpoints(events, cancelled_at) if e["ts"] >= onset_ts]
    faults = []
    for fault in variant.faults:
        onset = onset_ts
        if fault.at_first_failure:
            if not failures:
                continue  # the cause never failed a checkpoint in this run
            onset = failures[0]
        vertex_name = _vertex_name(fault, names)
        vertex_id = names.get(vertex_name) if vertex_name else None
        if fault.family == BACKPRESSURE:
            onset = backpressure_onset(events, vertex_id, onset)
            if onset is None:
                continue  # the slowdown never backed up into another vertex in this run
        faults.append({"family": fault.family, "onset_ts": onset, "vertex_id": vertex_id,
                       "vertex_name": vertex_name if vertex_id else None,
                       "subtask_index": _hot_subtask(events, vertex_id, onset_ms) if fault.hot_subtask else None,
                       "description": variant.description})
        if fault.end_s is not None:  # the fault ends (a leak that is fixed): when it stops
            faults[-1]["end_ts"] = at_ms(submitted_at, fault.end_s)
    if failures and not any(f["family"] == CHECKPOINT_FAILURE for f in faults):
        # Checkpoints failed where the variant did not plan it: that is a checkpoint failure too.
        log.warning("%s: %d checkpoints failed although the scenario plans none; labelled as checkpoint_failure",
                    variant.run_id, len(failures))
        faults.append({"family": CHECKPOINT_FAILURE, "onset_ts": failures[0], "vertex_id": None, "vertex_name": None,
                       "subtask_index": None, "description": "checkpoints failed during the run"})
    faults.sort(key=lambda f: f["onset_ts"])
    truth = {"cluster": LAB_CLUSTER, "job_id": job_id, "job_name": job_name, "scenario": f"lab_{variant.scenario}",
             "family": faults[0]["family"] if faults else "healthy", "families": sorted({f["family"] for f in faults}),
             "run_id": variant.run_id, "seed": None, "index": 0, "start_ts": start_ts, "end_ts": end_ts,
             "source": "lab", "faults": faults}
    if variant.warmup_horizon_s is not None:
        truth["warmup_horizon_s"] = variant.warmup_horizon_s
    return truth


def at_ms(submitted_at: int, seconds: float) -> int:
    """The epoch time ``seconds`` after a job submitted at ``submitted_at`` starts (as onsets count)."""
    return submitted_at + STARTUP_MARGIN_MS + int(seconds * 1000)


def _vertex_name(fault, names: dict[str, str]) -> str | None:
    """The fault's vertex as the collector reported it: its operator's name, or the one name that
    matches its pattern (a SQL job's vertices are named by Flink's planner)."""
    if fault.vertex is not None or fault.vertex_pattern is None:
        return fault.vertex
    matching = sorted(name for name in names if re.search(fault.vertex_pattern, name))
    if len(matching) != 1:
        log.warning("%d vertices match %r (%s): the fault is labelled without a vertex", len(matching),
                    fault.vertex_pattern, "; ".join(matching) or "none")
        return None
    return matching[0]


BACKPRESSURED_MS_PER_S = 100.0  # Flink's web UI calls a subtask backpressured from 10 % of its time


def backpressure_onset(events: Sequence[dict], culprit_vertex_id: str | None, onset_ts: int) -> int | None:
    """When another vertex first waits on the culprit: backpressure is what Flink reports, and
    until the buffers between them are full a slow operator's backlog is invisible to it (a hot
    subtask among four can take minutes to fill its channel's share; measured in the lab)."""
    return min((event["ts"] for event in events
                if event["kind"] == "vertex_metrics" and event["ts"] >= onset_ts
                and event["vertex_id"] != culprit_vertex_id
                and any((s.get("backpressured_time_ms_per_s") or 0.0) >= BACKPRESSURED_MS_PER_S
                        for s in event.get("subtasks") or [])), default=None)


def _hot_subtask(events: Sequence[dict], vertex_id: str | None, onset_ms: int) -> int | None:
    totals: dict[int, float] = {}
    for event in events:
        if event["kind"] == "vertex_metrics" and event["vertex_id"] == vertex_id and event["ts"] >= onset_ms:
            for sample in event["subtasks"]:
                totals[sample["index"]] = totals.get(sample["index"], 0.0) + (sample["records_in_per_s"] or 0.0)
    return max(totals, key=totals.get) if totals and max(totals.values()) > 0 else None


# --- running variants --------------------------------------------------------------------------------


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
