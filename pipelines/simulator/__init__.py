"""Labelled, deterministic Flink metric streams for training, tests and demos.

>>> job = simulate_job("leak_seed000", seed=1)
>>> [round(e["state_size_bytes"] / 2**20, 1) for e in job.events if e["kind"] == "checkpoint"][:9]
[11.3, 20.9, 30.6, 41.4, 52.6, 62.5, 71.5, 83.3, 93.5]
>>> job.truth["faults"][0]["family"]
'state_leak'
"""

from __future__ import annotations

import heapq
import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from pipelines.datasets import DATASET_FORMAT, SPLITS, read_jsonl, write_jsonl  # noqa: F401  (part of this package's API)
from pipelines.durations import parse_duration  # noqa: F401  (part of this package's API)
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


def parse_mix(items: Sequence[str]) -> list[tuple[str, float]]:
    """``["leak_linear:2", "healthy_steady"]`` -> weighted scenario names (default weight 1)."""
    mix = []
    for item in items:
        name, _, weight = item.partition(":")
        scenario(name)
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise SimulationError(f"weight in {item!r} is not a number") from None
        if w <= 0:
            raise SimulationError(f"weight in {item!r} must be positive")
        mix.append((name, w))
    return mix


def fleet_jobs(size: int, mix: Sequence[tuple[str, float]], seed: int = 0, duration_ms: int | None = None,
          clusters: Sequence[str] = ("sim-eu", "sim-us")) -> list[SimulatedJob]:
    """``size`` concurrent jobs drawn from the weighted ``mix``, deterministic for the seed."""
    if size < 1:
        raise SimulationError("--fleet needs at least one job")
    rng = random.Random(f"fleet:{seed}")
    names = [name for name, _ in mix]
    weights = [w for _, w in mix]
    # Every scenario of the mix appears at least once when the fleet is big enough.
    chosen = names[:size] + rng.choices(names, weights, k=max(0, size - len(names)))
    return [simulate_job(name, seed, index, duration_ms, cluster=clusters[index % len(clusters)])
            for index, name in enumerate(chosen)]


def plan_jobs(mix: Sequence[tuple[str, float]], seed: int = 0, duration_ms: int | None = None,
              fleet: int | None = None) -> list[SimulatedJob]:
    """One job per scenario of the mix, or with ``fleet`` that many drawn from its weights."""
    if fleet:
        return fleet_jobs(fleet, mix, seed, duration_ms)
    return [simulate_job(name, seed, index, duration_ms) for index, (name, _) in enumerate(mix)]


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


HEALTHY = tuple(name for name, s in CATALOGUE.items() if s.family is None)
FAULTY = tuple(name for name, s in CATALOGUE.items() if s.family is not None)


def simulate_fleet(jobs: int, seed: int, duration_ms: int, start_ts: int = DEFAULT_START_TS,
                   poll_interval_ms: int = 5_000, faulty_share: float = 0.1, clusters: int = 8) -> Iterator[SimulatedJob]:
    """A production-like fleet, one job at a time: mostly healthy jobs, ``faulty_share`` of them
    with a fault of some family, every scenario in turn, spread over ``clusters`` Flink clusters
    and polled every ``poll_interval_ms`` by a collector that reaches each job at its own moment
    of the interval (not all at once)."""
    if jobs < 1 or not 0 <= faulty_share <= 1:
        raise SimulationError("a fleet needs at least one job and a faulty share in [0, 1]")
    faulty_every = round(1 / faulty_share) if faulty_share else 0
    for index in range(jobs):
        faulty = faulty_every and index % faulty_every == faulty_every - 1
        names = FAULTY if faulty else HEALTHY
        name = names[(index // (faulty_every or 1) if faulty else index) % len(names)]
        offset = (index * poll_interval_ms) // jobs  # where in the poll interval the collector reaches it
        yield simulate_job(name, seed, index, duration_ms - offset, cluster=f"fleet-{index % clusters}",
                           start_ts=start_ts + offset, timing={"poll_interval_ms": poll_interval_ms})


def split_cluster(index: int) -> str:
    return ("eu", "us", "ap")[index % 3]


def rotating_job_events(live_jobs: int, events_per_job: int, event_interval_ms: int, duration_ms: int,
                        start_ts: int = DEFAULT_START_TS, cluster: str = "rotation") -> list[dict]:
    """The key-rotation workload of seed 001, with jobs as the keys: ``live_jobs`` jobs are always
    alive; each sends ``events_per_job`` job-status events ``event_interval_ms`` apart, retires and
    is replaced at once by a new job. For checking that state follows live keys, not keys seen."""
    # A job's last event and its successor's first fall together, as in the seed's load test.
    lifetime = max(1, events_per_job - 1) * event_interval_ms
    events = []
    for slot in range(live_jobs):
        born = start_ts + (slot * lifetime) // live_jobs - lifetime  # staggered: slots retire evenly
        generation = 0
        while born < start_ts + duration_ms:
            job_id = f"{slot:016x}{generation:016x}"
            for k in range(events_per_job):
                ts = born + k * event_interval_ms
                if start_ts <= ts < start_ts + duration_ms:
                    events.append({"schema_version": 1, "kind": "job_status", "cluster": cluster, "job_id": job_id,
                                   "job_name": f"rotating-{slot}", "ts": ts, "state": "RUNNING", "num_restarts": 0,
                                   "checkpoints_completed_total": 0, "checkpoints_failed_total": 0,
                                   "checkpoints_in_progress": 0, "checkpoint_interval_ms": 60_000,
                                   "checkpoint_timeout_ms": 600_000, "max_state_size_bytes": None,
                                   "jm_heap_used_bytes": None, "jm_heap_max_bytes": None})
            born += lifetime
            generation += 1
    events.sort(key=lambda e: (e["ts"], e["job_id"]))
    return events
