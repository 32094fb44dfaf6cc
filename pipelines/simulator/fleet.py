"""Fleets of simulated jobs: a weighted mix of scenarios (``sentinel simulate --mix``, ``--fleet``),
a production-like fleet of mostly healthy jobs over several clusters (the load benchmarks), and
the key-rotation workload (jobs that retire and are replaced, for state that follows live keys).
"""

from __future__ import annotations

import random
from typing import Iterator, Sequence

from pipelines.simulator.runs import DEFAULT_START_TS, SimulatedJob, SimulationError, scenario, simulate_job
from pipelines.simulator.scenarios import CATALOGUE


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
