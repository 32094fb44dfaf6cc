"""One simulated job, and the labelled dataset of them every consumer reads.

:func:`simulate_job` runs one job of a scenario (:mod:`pipelines.simulator.scenarios`) through the
job model (:mod:`pipelines.simulator.job`): ``(seed, name, index)`` fixes every number it emits.
:func:`write_dataset` writes jobs of each scenario, split by job, in the layout of
:mod:`pipelines.datasets`.
"""

from __future__ import annotations

import heapq
import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from pipelines.datasets import DATASET_FORMAT, SPLITS, write_jsonl
from pipelines.errors import UsageError
from pipelines.simulator.job import FLINK_2_3, JobSimulation, Reporting
from pipelines.simulator.scenarios import CATALOGUE, Scenario

DEFAULT_START_TS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


class SimulationError(UsageError):
    """Bad simulator parameters; the message says which and why."""


@dataclass(frozen=True)
class SimulatedJob:
    events: list[dict]
    truth: dict  # the job's ground truth: scenario, expected family, labelled faults


def scenario(name: str) -> Scenario:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise SimulationError(f"unknown scenario {name!r}; `sentinel simulate --list` shows the catalogue") from None


def simulate_job(name: str, seed: int = 0, index: int = 0, duration_ms: int | None = None,
                 cluster: str = "sim", start_ts: int = DEFAULT_START_TS, source: str = "simulator",
                 reporting: Reporting = FLINK_2_3, fresh_start: bool | None = None,
                 timing: dict | None = None) -> SimulatedJob:
    """Run one job of scenario ``name``. ``(seed, name, index)`` fixes every number it emits; the
    reporting only changes how its metrics read, not the job. ``fresh_start`` makes the job start
    with the simulation (or not), ``timing`` overrides its checkpoint and poll intervals."""
    chosen = scenario(name)
    duration = duration_ms if duration_ms is not None else chosen.default_duration_ms
    rng = random.Random(f"{seed}:{name}:{index}")
    spec, faults = chosen.build(rng, duration)
    spec = _with_cluster(spec, cluster, index)
    if fresh_start is not None or timing:
        spec = replace(spec, **({"fresh_start": fresh_start} if fresh_start is not None else {}), **(timing or {}))
    job = JobSimulation(spec, faults, seed=f"{seed}:{name}:{index}", start_ts=start_ts, source_label=source,
                        reporting=reporting)
    events = job.run(duration)
    labelled = [f for f in faults if f.family is not None and f.onset_ms <= duration]
    truth = {
        "cluster": spec.cluster, "job_id": job.job_id, "job_name": spec.job_name, "scenario": name,
        "family": chosen.family or "healthy", "seed": seed, "index": index,
        "start_ts": start_ts, "end_ts": start_ts + duration,
        "faults": [
            {"family": f.family, "onset_ts": start_ts + f.onset_ms,
             "vertex_id": job.vertex_ids[f.vertex] if f.vertex is not None else None,
             "vertex_name": spec.vertices[f.vertex].name if f.vertex is not None else None,
             "subtask_index": f.subtask, "description": f.description}
            for f in labelled
        ],
    }
    if spec.warmup_horizon_ms:
        # What its operator knows and would configure (detection.job_overrides): how long this
        # job's healthy state grows after a start.
        truth["warmup_horizon_s"] = spec.warmup_horizon_ms / 1000.0
    return SimulatedJob(events, truth)


def _with_cluster(spec, cluster: str, index: int):
    return replace(spec, cluster=cluster, job_name=f"{spec.job_name}-{index:03d}")


def merged_events(jobs: Iterable[SimulatedJob]) -> Iterator[dict]:
    """All jobs' events in event-time order, as one producer would see them."""
    return heapq.merge(*(job.events for job in jobs), key=lambda e: e["ts"])


def assign_splits(jobs: Sequence[SimulatedJob], seed: int, fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> dict[str, list[SimulatedJob]]:
    """Split by job (never by time), stratified by scenario so every split sees every scenario it can."""
    if abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) < 0:
        raise SimulationError("split fractions must be >= 0 and sum to 1")
    by_scenario: dict[str, list[SimulatedJob]] = {}
    for job in jobs:
        by_scenario.setdefault(job.truth["scenario"], []).append(job)
    splits: dict[str, list[SimulatedJob]] = {name: [] for name in SPLITS}
    for name, group in sorted(by_scenario.items()):
        group = sorted(group, key=lambda j: j.truth["index"])
        random.Random(f"split:{seed}:{name}").shuffle(group)
        n = len(group)
        n_test = round(n * fractions[2]) if n >= 3 else 0
        n_val = round(n * fractions[1]) if n >= 3 else 0
        splits["test"].extend(group[:n_test])
        splits["validation"].extend(group[n_test:n_test + n_val])
        splits["train"].extend(group[n_test + n_val:])
    return splits


def write_dataset(directory: Path, names: Sequence[str], jobs_per_scenario: int, seed: int = 0,
                  duration_ms: int | None = None, fractions=(0.6, 0.2, 0.2)) -> dict:
    """The labelled dataset layout every consumer reads (retraining, evaluation, the lab):

    ``<dir>/<split>/events.jsonl`` (input-contract events in time order),
    ``<dir>/<split>/ground_truth.jsonl`` (one line per job) and ``<dir>/manifest.json``.
    """
    if jobs_per_scenario < 1:
        raise SimulationError("--jobs-per-scenario must be at least 1")
    jobs = [simulate_job(name, seed, index, duration_ms, cluster=f"sim-{split_cluster(index)}")
            for name in names for index in range(jobs_per_scenario)]
    splits = assign_splits(jobs, seed, fractions)
    manifest = {"format": DATASET_FORMAT, "source": "simulator", "seed": seed,
                "scenarios": list(names), "jobs_per_scenario": jobs_per_scenario, "splits": {}}
    for split, members in splits.items():
        events = write_jsonl(directory / split / "events.jsonl", merged_events(members))
        write_jsonl(directory / split / "ground_truth.jsonl", (job.truth for job in members))
        manifest["splits"][split] = {"jobs": len(members), "events": events,
                                     "job_ids": sorted(job.truth["job_id"] for job in members)}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def split_cluster(index: int) -> str:
    return ("eu", "us", "ap")[index % 3]
