"""Labelled, deterministic Flink metric streams for training, tests and demos.

Runtimes layer: it may import every layer below (the foundation, whose :mod:`pipelines.datasets`
holds the dataset layout, up to the model workflows) and the other runtimes, never the command
line. ``job`` is the model of a running Flink job, ``faults`` and ``scenarios`` what goes wrong in
it, ``runs`` one job and the labelled dataset, ``fleet`` the mixes and fleets, ``publish`` the
events to the input topic, ``calibration`` against real Flink.

>>> job = simulate_job("leak_seed000", seed=1)
>>> [round(e["state_size_bytes"] / 2**20, 1) for e in job.events if e["kind"] == "checkpoint"][:9]
[11.3, 20.9, 30.6, 41.4, 52.6, 62.5, 71.5, 83.3, 93.5]
>>> job.truth["faults"][0]["family"]
'state_leak'
"""

from pipelines.datasets import SPLITS, read_jsonl, write_jsonl
from pipelines.durations import parse_duration
from pipelines.simulator.fleet import (FAULTY, HEALTHY, fleet_jobs, parse_mix, plan_jobs, rotating_job_events,
                                       simulate_fleet)
from pipelines.simulator.runs import (DEFAULT_START_TS, SimulatedJob, SimulationError, assign_splits, merged_events,
                                      scenario, simulate_job, split_cluster, write_dataset)
from pipelines.simulator.scenarios import CATALOGUE

__all__ = ["CATALOGUE", "DEFAULT_START_TS", "FAULTY", "HEALTHY", "SPLITS", "SimulatedJob", "SimulationError",
           "assign_splits", "fleet_jobs", "merged_events", "parse_duration", "parse_mix", "plan_jobs", "read_jsonl",
           "rotating_job_events", "scenario", "simulate_fleet", "simulate_job", "split_cluster", "write_dataset",
           "write_jsonl"]
