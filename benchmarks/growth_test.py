"""How often the leak family's growth test reads a state as growing: to hold a leak (95 %) and to
open one (also 99.9 %, over at least twenty checkpoints), row by row, on the test suite's
simulated fleet and on a lab dataset's split.

No model is involved: the features of recorded events (``features_for_events``) and the family's
``still_growing``. A healthy run's share past its warm-up horizon is how often noise (or a fill)
could open a leak; a leak's first reading from its onset is how soon the test lets one open.

Usage: ``.venv/bin/python benchmarks/growth_test.py [--dataset data/lab --split test] [--fleet]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from feature_store.job_features import features_for_events
from pipelines.datasets import read_jsonl
from pipelines.families.state_leak import GROWTH_COLUMNS, still_growing

MIN_GROWTH_PER_H = 0.05  # the leak rule's
DEFAULT_HORIZON_S = 180.0


def growing(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each row's verdict: growing enough to hold a leak, and to open one."""
    columns = {c: rows[c].to_numpy(dtype="float64") for c in GROWTH_COLUMNS}
    return still_growing(columns, MIN_GROWTH_PER_H), still_growing(columns, MIN_GROWTH_PER_H, to_open=True)


def vertex_series(events: list[dict]):
    """The feature rows of each stateful vertex, in time order: ((job, vertex), rows)."""
    rows = pd.DataFrame(features_for_events(events))
    rows = rows[rows["vertex_id"].notna()].sort_values("ts")
    for key, series in rows.groupby(["job_id", "vertex_id"]):
        if series["vertex_state_size_bytes"].fillna(0).max() > 0:
            yield key, series


def fleet() -> None:
    from tests.helpers.detection_job import fleet as make_fleet, fleet_events
    from tests.pipelines.detection.test_job import FAMILY_FLEET, MINUTES, SEED

    print("simulated fleet (tests/pipelines/detection/test_job.py), every row of each stateful vertex")
    for _, series in vertex_series(fleet_events(make_fleet(FAMILY_FLEET, SEED, MINUTES))):
        hold, open_ = growing(series)
        print(f"  {series['job_name'].iloc[0]:28s} {str(series['vertex_name'].iloc[0])[:36]:36s} "
              f"rows {len(series):5d}  hold {hold.mean():7.2%}  open {open_.mean():7.2%}")


def lab(dataset: Path, split: str) -> None:
    truths = {t["job_id"]: t for t in read_jsonl(dataset / split / "ground_truth.jsonl")}
    print(f"{dataset} {split}: healthy runs' rows past the horizon read as growing; each leak's first "
          "reading from its onset (past the horizon)")
    for (job_id, vertex_id), series in vertex_series(list(read_jsonl(dataset / split / "events.jsonl.gz"))):
        truth = truths.get(job_id)
        if truth is None:
            continue
        leaks = [f for f in truth["faults"] if f["family"] == "state_leak" and f.get("vertex_id") in (None, vertex_id)]
        if truth["faults"] and not leaks:
            continue  # another family's run: not the growth test's question
        ts = series["ts"].to_numpy()
        past = ts >= truth["start_ts"] + (truth.get("warmup_horizon_s") or DEFAULT_HORIZON_S) * 1000
        hold, open_ = growing(series)
        name = f"{truth['run_id'][:60]:60s}"
        if not leaks:
            print(f"  healthy {name} hold {hold[past].mean() if past.any() else 0:7.2%}  "
                  f"open {open_[past].mean() if past.any() else 0:7.2%}")
            continue
        onset = leaks[0].get("onset_ts") or truth["start_ts"]

        def first(verdicts: np.ndarray) -> str:
            seen = verdicts & past & (ts >= onset)
            return f"{(ts[seen][0] - onset) / 1000:6.0f} s" if seen.any() else "  never"
        print(f"  leak    {name} hold {first(hold)}  open {first(open_)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, default=Path("data/lab"))
    parser.add_argument("--split", default="test")
    parser.add_argument("--fleet", action="store_true", help="the simulated fleet instead of a lab split")
    args = parser.parse_args()
    fleet() if args.fleet else lab(args.dataset, args.split)


if __name__ == "__main__":
    main()
