"""Detectors, the post-rule, the static baseline and the evaluation metrics."""

from __future__ import annotations

import json

import math

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from feature_store.job_features import features_for_events
from feature_store.labels import label_rows
from models.baseline import baseline_decisions
from models.detectors import FAMILY_LEVEL, DetectorConfig, make_detector, rows_for
from models.evaluation import detection_delays, evaluate
from models.post_rule import PostRule
from pipelines import simulator

T0 = 1_767_225_600_000


# --- the post-rule --------------------------------------------------------------------------------


def test_post_rule_needs_k_of_the_last_n_per_entity():
    frame = pd.DataFrame({
        "cluster": ["c"] * 6, "job_id": ["a", "a", "a", "b", "b", "b"], "vertex_id": [None] * 6,
        "ts": [3, 1, 2, 1, 2, 3], "score": [0.9, 0.9, 0.1, 0.9, 0.2, 0.9],
    })
    decided = PostRule(0.5, k=2, n=3).decisions(frame)
    # job a in time order: 0.9, 0.1, 0.9 -> third has 2 of 3; job b: 0.9, 0.2, 0.9 -> same, separately.
    assert decided.tolist() == [True, False, False, False, False, True]
    assert PostRule.from_dict(PostRule(0.3, 2, 4).to_dict()) == PostRule(0.3, 2, 4)
    with pytest.raises(ValueError):
        PostRule(0.5, k=3, n=2)


def test_the_warm_up_guard_lets_a_young_job_alarm_only_with_a_limit_in_sight():
    rule = PostRule(0.5, 1, 1, warmup_s=1800, warmup_eta_s=3600)
    frame = pd.DataFrame({
        "cluster": "c", "job_id": ["young", "young-near-limit", "old", "unknown-age"], "vertex_id": "v", "ts": 1,
        "score": 0.9, "job_age_checkpoints": [10, 10, 40, None], "checkpoint_interval_ms": 60_000,
        "limit_eta_s": [None, 600.0, None, None],
    })
    assert rule.decisions(frame).tolist() == [False, True, True, False]
    # The streaming decision applies the same guard to the row it decides on.
    assert [rule.decide([0.9], row) for row in frame.to_dict("records")] == [False, True, True, False]
    assert rule.decide([0.9]) and not rule.decide([0.1], frame.iloc[2].to_dict())
    assert PostRule.from_dict(rule.to_dict()) == rule


def test_a_rule_with_evidence_decides_only_when_a_row_shows_some():
    rule = PostRule(0.5, 1, 1, evidence=(("checkpoint_failed_fraction", 1e-9), ("checkpoint_duration_over_timeout", 0.5)))
    frame = pd.DataFrame({"cluster": "c", "job_id": ["slow", "failing", "near-timeout", "unknown"], "vertex_id": None,
                          "ts": 1, "score": 0.9, "checkpoint_failed_fraction": [0.0, 0.25, 0.0, None],
                          "checkpoint_duration_over_timeout": [0.1, 0.1, 0.7, None]})
    assert rule.decisions(frame).tolist() == [False, True, True, False]
    assert [rule.decide([0.9], row) for row in frame.to_dict("records")] == [False, True, True, False]
    assert PostRule.from_dict(json.loads(json.dumps(rule.to_dict()))) == rule  # survives the JSON metadata


def test_calibration_prefers_persistence_when_single_points_are_noise():
    rng = np.random.default_rng(0)
    rows = []
    for job in range(20):
        faulty = job < 10
        for t in range(30):
            positive = faulty and t >= 10
            noise_spike = (not positive) and rng.random() < 0.15
            rows.append({"cluster": "c", "job_id": f"j{job}", "vertex_id": None, "ts": t,
                         "score": 0.9 if positive or noise_spike else 0.1, "positive": positive})
    frame = pd.DataFrame(rows)
    rule = PostRule.calibrate(frame, frame["positive"])
    assert (rule.k, rule.n) != (1, 1)  # isolated spikes are filtered by persistence
    assert 0.1 < rule.threshold <= 0.9


# --- evaluation and the baseline -------------------------------------------------------------------


def test_evaluation_on_a_hand_made_series():
    ts = [T0 + i * 60_000 for i in range(6)]
    frame = pd.DataFrame({
        "cluster": "c", "job_id": ["faulty"] * 6 + ["healthy"] * 6, "vertex_id": None, "ts": ts + ts,
        "trigger_kind": ["checkpoint", "job_status"] * 6,
        "label": ["healthy", "healthy", "state_leak", "state_leak", "state_leak", "state_leak"] + ["healthy"] * 6,
        "onset_ts": [np.nan, np.nan] + [ts[2]] * 4 + [np.nan] * 6,
    })
    decided = [False, False, False, False, True, True] + [False, True, True, False, True, False]
    m = evaluate(frame, decided, "state_leak")
    assert m["precision"] == pytest.approx(2 / 5) and m["recall"] == pytest.approx(2 / 4)
    assert m["f1"] == pytest.approx(2 * 0.4 * 0.5 / 0.9)
    # Two false openings on the healthy job over 2 x 5 minutes of jobs.
    assert m["false_incidents_per_job_day"] == pytest.approx(2 / (10 * 60_000 / 86_400_000))
    assert m["faults"] == 1 and m["fault_recall"] == 1.0
    assert m["delay_s_median"] == 120.0  # onset at ts[2], caught at ts[4]
    assert m["delay_checkpoints_median"] == 2  # ts[2] and ts[4] are checkpoint rows
    assert detection_delays(frame, decided, "state_leak") == [120.0]
    missed = evaluate(frame, [False] * 12, "state_leak")
    assert missed["fault_recall"] == 0.0 and math.isnan(missed["delay_s_median"])


def test_static_baseline_alarms():
    frame = pd.DataFrame({
        "state_size_bytes": [2e9, 1e6, None], "checkpoint_failed_fraction": [0.0, 0.1, None],
        "checkpoint_duration_over_interval": [1.5, 0.2, None], "backpressured_max": [0.25, 0.1, None],
        "records_in_max_over_mean": [1.2, 1.6, None],
    })
    assert baseline_decisions(frame, "state_leak").tolist() == [True, False, False]
    assert baseline_decisions(frame, "checkpoint_failure").tolist() == [True, True, False]
    assert baseline_decisions(frame, "backpressure").tolist() == [True, False, False]
    assert baseline_decisions(frame, "skew").tolist() == [False, True, False]


# --- the detectors' shared contract -----------------------------------------------------------------


def _labelled(jobs) -> pd.DataFrame:
    """Feature rows of simulated jobs with the point-in-time label of each row."""
    return pd.concat([label_rows(pd.DataFrame(features_for_events(job.events)), job.truth)
                      .assign(scenario=job.truth["scenario"]) for job in jobs], ignore_index=True)


@pytest.fixture(scope="module")
def split_rows():
    names = list(simulator.CATALOGUE)
    jobs = [simulator.simulate_job(n, 11, i, duration_ms=min(simulator.CATALOGUE[n].default_duration_ms, 40 * 60_000))
            for n in names for i in range(3)]
    splits = simulator.assign_splits(jobs, 11)
    return _labelled(splits["train"]), _labelled(splits["test"])


@pytest.mark.parametrize("family", sorted(FAMILY_LEVEL))
def test_every_detector_scores_in_range_deterministically_and_well_above_chance(family, split_rows):
    train, test = (rows_for(frame, FAMILY_LEVEL[family]) for frame in split_rows)
    target = (train["label"] == "healthy") if family == "anomaly" else (train["label"] == family)
    config = DetectorConfig(family, seed=3)
    scores = make_detector(config).fit(train, target.to_numpy()).score(test)
    again = make_detector(DetectorConfig.from_dict(config.to_dict())).fit(train, target.to_numpy()).score(test)
    assert scores.shape == (len(test),)
    assert np.all((scores >= 0) & (scores <= 1))
    assert np.array_equal(scores, again)
    positive = (test["label"] != "healthy") if family == "anomaly" else (test["label"] == family)
    assert roc_auc_score(positive, scores) > (0.7 if family == "anomaly" else 0.9)


def test_a_detector_config_rejects_unknown_features():
    with pytest.raises(ValueError, match="not in the feature store"):
        DetectorConfig("skew", features=("records_in_max_over_mean", "made_up"))
    with pytest.raises(ValueError, match="unknown family"):
        DetectorConfig("latency")


def test_scoring_needs_a_fitted_detector_and_accepts_no_rows():
    frame = pd.DataFrame({name: [0.5] for name in DetectorConfig("skew").features})
    detector = make_detector(DetectorConfig("skew"))
    with pytest.raises(RuntimeError, match="before fit"):
        detector.score(frame)
    novelty = make_detector(DetectorConfig("anomaly")).fit(
        pd.DataFrame({name: np.linspace(0, 1, 20) for name in DetectorConfig("anomaly").features}))
    assert novelty.score(frame.iloc[0:0]).shape == (0,)
