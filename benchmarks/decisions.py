"""How fast features are computed and incidents decided, in the batch path training and replay use.

Three numbers, on the same simulated fleet (deterministic seeds):

* the feature state machine over recorded events (``features_for_events``): events per second;
* the incident policy over scored feature rows (``policy.step``, post-rules decided vectorised per
  family): scored rows per second, with scores that keep incidents open part of the time (as
  calibration and the gate replay them, once per candidate rule);
* the same replay as calibration and the gate call it (``evaluation.replay_incidents`` with the
  scores made once): the policy plus whatever the replay does around it.

Usage: ``.venv/bin/python benchmarks/decisions.py [--jobs-per-scenario 2] [--minutes 60]``
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import pandas as pd

from feature_store.job_features import features_for_events
from models.evaluation import replay_incidents
from models.post_rule import PostRule
from models.registry import LoadedDetector
from pipelines import simulator
from pipelines.families import FAMILIES, LOCALISED
from pipelines.incidents import policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs-per-scenario", type=int, default=2)
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    jobs = [simulator.simulate_job(name, 9, i, args.minutes * 60_000)
            for name in simulator.CATALOGUE for i in range(args.jobs_per_scenario)]
    events = [e for job in jobs for e in job.events]
    timings = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        rows = features_for_events(events)
        timings.append(time.perf_counter() - started)
    feature_s = min(timings)

    frame = pd.DataFrame(rows)
    rng = np.random.default_rng(0)
    parts = []
    for family in FAMILIES:
        level = frame[frame["vertex_id"].notna()] if family in LOCALISED else frame[frame["vertex_id"].isna()]
        # Scores that drift: runs of high scores open incidents, low ones resolve them.
        drift = np.clip(np.sin(np.arange(len(level)) / 50.0) + rng.normal(0, 0.3, len(level)), 0, 1)
        parts.append(pd.DataFrame({"row": level.index, "family": family, "score": drift, "model_name": "bench",
                                   "model_version": "1", "model_alias": "champion"}))
    scores = pd.concat(parts, ignore_index=True)
    rules = {f: PostRule(0.8, 2, 3, warmup_guard=f == "state_leak") for f in FAMILIES}
    timings, incidents = [], 0
    for _ in range(args.repeat):
        started = time.perf_counter()
        incidents = len(policy.step({}, frame, scores, rules, policy.PolicySettings()))
        timings.append(time.perf_counter() - started)
    policy_s = min(timings)
    models = {f: LoadedDetector("bench", "1", "champion", None, rule, {}) for f, rule in rules.items()}
    timings = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        replay_incidents(frame, models, policy.PolicySettings(), scores)
        timings.append(time.perf_counter() - started)
    replay_s = min(timings)

    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"fleet: {len(jobs)} simulated jobs x {args.minutes} min, {len(events):,} events, {len(rows):,} feature rows")
    print(f"features (batch, one process): {len(events) / feature_s:,.0f} events/s ({feature_s:.2f} s, best of {args.repeat})")
    print(f"incident policy: {len(scores) / policy_s:,.0f} scored rows/s ({len(scores):,} rows, {incidents} incident "
          f"events, {policy_s:.2f} s, best of {args.repeat})")
    print(f"calibration's replay: {len(scores) / replay_s:,.0f} scored rows/s ({replay_s:.2f} s, best of {args.repeat})")


if __name__ == "__main__":
    main()
