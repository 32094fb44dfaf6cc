"""What a call of the novelty detector costs, by rows scored: scikit-learn's ``score_samples``
against ``models.detectors.isolation_scores`` (the same numbers, checked here on every call).

The detector is fitted as training fits it (``DetectorConfig("anomaly")``) on the job rows of
simulated jobs (deterministic seeds); the rows scored are drawn from the same rows. A real-time
micro-batch scores a few to a few thousand rows per task, a backlog batch tens of thousands.

Usage: ``.venv/bin/python benchmarks/novelty_scoring.py [--repeat 20]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kafka_io import machine  # noqa: E402
from feature_store.job_features import features_for_events  # noqa: E402
from models.detectors import DetectorConfig, isolation_scores, make_detector, rows_for  # noqa: E402
from pipelines import simulator  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as in Spark's Python workers

    jobs = [simulator.simulate_job(name, 9, i, 30 * 60_000) for name in simulator.CATALOGUE for i in range(2)]
    rows = rows_for(pd.DataFrame([r for job in jobs for r in features_for_events(job.events)]), "job")
    detector = make_detector(DetectorConfig("anomaly", seed=1)).fit(rows)
    forest = detector.model
    print(f"machine: {machine()}; {len(forest.estimators_)} trees, fitted on {len(rows):,} job rows")
    print("| rows | score_samples ms | isolation_scores ms | identical |")
    print("|---:|---:|---:|---|")
    rng = np.random.default_rng(0)
    for n in (1, 30, 300, 3000, 30000):
        sample = rows.iloc[rng.integers(0, len(rows), n)]
        X = sample.loc[:, list(detector.config.features)].astype("float64").fillna(detector.medians).to_numpy()
        same = np.array_equal(-forest.score_samples(X), isolation_scores(forest, X))
        timings = {}
        for name, score in (("score_samples", forest.score_samples), ("isolation_scores",
                                                                      lambda x: isolation_scores(forest, x))):
            started = time.perf_counter()
            for _ in range(args.repeat):
                score(X)
            timings[name] = (time.perf_counter() - started) / args.repeat * 1000
        print(f"| {n:,} | {timings['score_samples']:.1f} | {timings['isolation_scores']:.1f} | {same} |")


if __name__ == "__main__":
    main()
