"""One Flink job's detection steps: the feature frame the detectors and the policy read."""

from __future__ import annotations

import pandas as pd

from feature_store.compute import OUTPUT_COLUMNS
from feature_store.job_features import features_for_events
from pipelines import simulator
from pipelines.detection.flink_job import feature_frame


def test_the_feature_frame_is_pandas_own_frame_of_the_rows_in_every_case():
    """Built from the rows' values as tuples: the same columns, values and dtypes as pandas gives
    for the dicts, with a row lacking a column, one row, or none."""
    rows = [row for name in ("skew_hot_key", "checkpoint_storage_errors", "healthy_restart")
            for row in features_for_events(simulator.simulate_job(name, seed=4, duration_ms=6 * 60_000).events)]
    assert len(rows) > 400
    for case in (rows, rows[:1], [], [*rows[:3], {k: v for k, v in rows[3].items() if k != "busy_max"}]):
        expected = pd.DataFrame.from_records(case, columns=OUTPUT_COLUMNS)
        pd.testing.assert_frame_equal(feature_frame(case), expected)
