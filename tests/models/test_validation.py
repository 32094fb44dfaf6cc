"""The training set's GX suite accepts a sound set and names what is wrong with a broken one."""

from __future__ import annotations

import numpy as np
import pandas as pd

from models.validation import validate_training_set

FAMILIES = ["state_leak", "skew"]
FEATURES = ["busy_max", "state_size_bytes"]


def sound(n_per_label=60):
    labels = ["healthy"] * (3 * n_per_label) + ["state_leak"] * n_per_label + ["skew"] * n_per_label
    n = len(labels)
    rng = np.random.default_rng(0)
    return pd.DataFrame({"cluster": "c", "job_id": [f"j{i % 7}" for i in range(n)], "ts": np.arange(n),
                         "label": labels, "busy_max": rng.uniform(0, 1, n), "state_size_bytes": rng.uniform(0, 1e9, n)})


def test_a_sound_training_set_passes(capfd):
    report = validate_training_set(sound(), FEATURES, FAMILIES, min_rows_per_family=50)
    assert report.success, report.text()
    assert report.checked >= 10
    # The detection job runs the same validations every minute: its log gets no progress bars.
    assert "Calculating Metrics" not in capfd.readouterr().err


def test_a_broken_training_set_is_rejected_with_a_readable_report():
    frame = sound()
    frame.loc[3, "label"] = None
    frame.loc[5, "busy_max"] = 7.5  # a ratio far above 1
    frame = frame[frame["label"] != "skew"]  # a family with no rows
    report = validate_training_set(frame.drop(columns=["state_size_bytes"]), FEATURES, FAMILIES, min_rows_per_family=50)
    assert not report.success
    text = report.text()
    assert "expect_column_to_exist(column=state_size_bytes)" in text
    assert "expect_column_values_to_not_be_null(column=label)" in text
    assert "expect_column_values_to_be_between(column=busy_max" in text and "7.5" in text
    assert "expect_column_distinct_values_to_contain_set(column=label" in text


def test_too_few_rows_of_a_family_and_all_healthy_sets_fail():
    frame = sound()
    thin = pd.concat([frame[frame["label"] != "skew"], frame[frame["label"] == "skew"].head(10)])
    assert "expect_column_values_to_be_between(column=rows" in validate_training_set(thin, FEATURES, FAMILIES).text()
    healthy_only = frame.assign(label="healthy")
    report = validate_training_set(healthy_only, FEATURES, FAMILIES)
    assert "healthy_share" in report.text() and not report.success
