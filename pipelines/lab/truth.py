"""What a lab run is labelled as, from what the run did, and its recording in a dataset folder.

The ground truth (:func:`ground_truth`) finds each fault's vertex by its operator's name, a skew's
hot subtask by the records it received, backpressure's onset where another vertex first waits on
the culprit, and labels checkpoint failures where the run really had them; :func:`unsound` says
why a run does not show its scenario (the lab failed, not the job), so the session runs it again.
A run is recorded in the dataset layout of :mod:`pipelines.datasets` (:func:`record_run`).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Sequence

from feature_store.job_features import STOPPING_FAILURES
from pipelines import datasets
from pipelines.families import BACKPRESSURE, CHECKPOINT_FAILURE
from pipelines.lab.scenarios import DATASTREAM, LONG_RUN_S, LabVariant

log = logging.getLogger(__name__)

LAB_CLUSTER = "lab"
# Submission (the PyFlink client compiling the plan) takes about ten seconds: onsets count from after it.
STARTUP_MARGIN_MS = 15_000


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

# --- recording a run -----------------------------------------------------------------------------


def complete_entry(entry: dict) -> None:
    """A run's manifest entry recorded before versions, kinds and lengths were told apart: all
    DataStream jobs, long or short by their duration."""
    entry.setdefault("job_kind", DATASTREAM)
    if "duration_s" in entry:
        entry.setdefault("length", "long" if entry["duration_s"] >= LONG_RUN_S else "short")


def record_run(dataset: Path, split: str, events: list[dict], truth: dict, info: dict | None = None) -> None:
    """Add one run to the dataset folder (:func:`pipelines.datasets.record_run`), the older
    entries of its manifest completed (:func:`complete_entry`)."""
    datasets.record_run(dataset, split, events, truth, info, complete_entry)


def merge_runs(source: Path, target: Path) -> list[str]:
    """Add the runs recorded in ``source`` to ``target`` (:func:`pipelines.datasets.merge_runs`)."""
    return datasets.merge_runs(source, target, complete_entry)
