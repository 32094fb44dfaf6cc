"""Every family through the same checks, the way river's ``check_estimator`` runs every model:
a new family module passes these before anything else reads it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from feature_store.definitions import FEATURES, JOB_FEATURES
from models.baseline import BaselineThresholds, StaticAlarm, baseline_decisions
from models.detectors import DetectorConfig, FamilyDetector, NoveltyDetector, make_detector
from models.post_rule import PostRule
from pipelines.families import REGISTRY, Family

NAMES = {f.name for f in FEATURES}
SEVERITIES = ("info", "warning", "critical")


def _row(value: float | None) -> dict:
    """A feature row with every feature at ``value`` (None: nothing known)."""
    return {"ts": 1_000, "cluster": "c", "job_id": "j", "job_name": "orders", "vertex_id": "v",
            "vertex_name": "window", **{name: value for name in NAMES}}


@pytest.fixture(params=REGISTRY, ids=lambda f: f.name)
def family(request) -> Family:
    return request.param


def test_its_detector_reads_declared_features_of_its_level(family):
    assert family.features and len(set(family.features)) == len(family.features)
    assert set(family.features) <= NAMES
    if family.level == "job":
        assert set(family.features) <= set(JOB_FEATURES)  # a job row carries no vertex features
    config = DetectorConfig(family.name)
    assert config.features == family.features and config.level == family.level
    assert isinstance(make_detector(config), FamilyDetector if family.supervised else NoveltyDetector)


def test_its_monotone_signs_name_declared_features_with_a_sign(family):
    assert all(name in NAMES and sign in (-1, 1) for name, sign in family.monotone)
    assert set(DetectorConfig(family.name).monotone) <= set(family.features)


def test_its_post_rule_builds_and_reads_declared_features(family):
    rule = PostRule(**family.guards)
    assert set(rule.guard_columns()) <= NAMES
    assert family.delay_statistic in ("mean", "median") and callable(getattr(np, family.delay_statistic))
    assert all(1 <= k <= n for k, n in family.calibration_persistence)


@pytest.mark.parametrize("value", [None, 0.0, 1.0, 1e12])
def test_its_incidents_have_a_severity_summary_and_runbook_on_any_row(family, value):
    row = _row(value)
    forecast = family.forecast(row, 10 * 1024 * 1024)
    assert forecast is None or (forecast["eta_ms"] >= 0 and forecast["limit_source"] in ("job", "config"))
    severity = family.severity(row, forecast, 3600.0)
    assert severity in SEVERITIES
    summary = family.summary("orders / window", row, forecast, severity)
    assert summary.startswith(f"[{severity}] ") and "orders / window" in summary
    steps = family.runbook_for(row)
    assert steps and all(isinstance(s, str) and s for s in steps)
    subtask = family.subtask(row)
    assert subtask is None or isinstance(subtask, int)
    assert isinstance(family.recent_evidence(row), dict)


def test_its_static_alarm_never_fires_on_unknown_values(family):
    frame = pd.DataFrame([_row(None)] * 3).astype({name: "float64" for name in NAMES})
    if not family.has_static_alarm:
        assert family.name not in StaticAlarm.FAMILIES
        with pytest.raises(ValueError):
            baseline_decisions(frame, family.name)
        return
    assert family.name in StaticAlarm.FAMILIES
    fired = baseline_decisions(frame, family.name, BaselineThresholds())
    assert fired.dtype == bool and fired.shape == (3,) and not fired.any()


def test_what_it_plots_and_keeps_is_a_declared_feature(family):
    assert family.decisive_plot is None or family.decisive_plot.column in NAMES
    assert family.recent_column is None or family.recent_column in NAMES
    limits = family.limit_eta_s(pd.DataFrame([_row(1.0)]), np.array([math.inf]))
    assert limits is None or limits.shape == (1,)


def test_its_page_plot_is_one_the_incident_page_draws(family):
    from pipelines.reports.incident_plots import PAGE_PLOTS
    assert family.page_plot is None or family.page_plot in PAGE_PLOTS


def test_its_forecasts_come_soonest_first_with_their_band():
    from pipelines.families import BY_NAME
    row = {**_row(None), "checkpoint_timeout_ms": 1000.0, "checkpoint_timeout_eta_s": 240.0,
           "checkpoint_timeout_eta_low_s": 180.0, "checkpoint_timeout_eta_high_s": 360.0,
           "checkpoint_duration_fitted_over_s": 300.0, "vertex_state_size_bytes": 1e6,
           "vertex_state_rel_slope_per_h": 36.0}  # +10 KB/s: a 10 MB limit in 900 s
    found = BY_NAME["state_leak"].forecasts(row, 10_000_000, 900.0)
    assert [f["metric"] for f in found] == ["checkpoint_duration_ms", "state_size_bytes"]
    assert found[0] == {"metric": "checkpoint_duration_ms", "limit": 1000, "limit_source": "job", "eta_ms": 240_000,
                        "eta_low_ms": 180_000, "eta_high_ms": 360_000, "fitted_over_ms": 300_000,
                        "method": "checkpoint_cadence"}
    assert BY_NAME["state_leak"].forecasts(row, None, 120.0) == []  # beyond the warning horizon, no limit
    assert BY_NAME["anomaly"].forecasts(row, None, 900.0) == []
    from pipelines.families.base import timeout_warning
    assert timeout_warning(found) == "; checkpoints will exceed their 1s timeout in ~4 min (3 min-6 min)"
    # The leak's summary gives its state's limit, though the timeout comes sooner (the warning says that).
    summary = BY_NAME["state_leak"].summary("orders / window", {**row, "forecasts": found}, found[0], "warning")
    assert ", limit in 15 min;" in summary
    alone = BY_NAME["state_leak"].summary("orders / window", {**row, "forecasts": found[:1]}, found[0], "warning")
    assert ", no known limit;" in alone


@pytest.mark.parametrize("over_usual, decided", [(0.6, True), (1.0, True), (None, True), (1.02, False), (3.0, False)])
def test_a_bottleneck_taking_in_more_than_its_usual_is_a_surge_not_backpressure_nor_an_anomaly(over_usual, decided):
    # Another vertex waits on it half the time and its checkpoints are held back: all but the rate say backpressure.
    from pipelines.families import BY_NAME
    rule = PostRule(**BY_NAME["backpressure"].guards)
    row = {**_row(None), "job_age_s": 600.0, "others_backpressured_max": 0.6, "checkpoint_duration_over_interval": 0.5,
           "records_in_over_usual": over_usual}
    assert rule.decide([1.0] * rule.n, row) is decided
    # Nor is it an anomaly: the job's checkpoints stretch for the load.
    anomaly = PostRule(**BY_NAME["anomaly"].guards)
    assert anomaly.decide([1.0] * anomaly.n, {**row, "busiest_input_over_usual": over_usual}) is decided


def test_a_backpressured_vertex_s_barrier_wait_is_forecast_against_the_timeout_and_said():
    from pipelines.families import BY_NAME
    from pipelines.families.base import limit_text, timeout_warning
    row = {**_row(None), "checkpoint_timeout_ms": 20_000.0, "barrier_wait_timeout_eta_s": 180.0,
           "barrier_wait_timeout_eta_low_s": 120.0, "barrier_wait_timeout_eta_high_s": 300.0,
           "barrier_wait_fitted_over_s": 36.0, "checkpoint_timeout_eta_s": 400.0}
    found = BY_NAME["backpressure"].forecasts(row, None, 900.0)
    assert [f["metric"] for f in found] == ["checkpoint_barrier_wait_ms", "checkpoint_duration_ms"]
    assert found[0] == {"metric": "checkpoint_barrier_wait_ms", "limit": 20_000, "limit_source": "job",
                        "eta_ms": 180_000, "eta_low_ms": 120_000, "eta_high_ms": 300_000, "fitted_over_ms": 36_000,
                        "method": "checkpoint_cadence"}
    assert timeout_warning(found) == "; checkpoint barriers will wait out their 20s timeout in ~3 min (2 min-5 min)"
    assert limit_text(found[0]) == "the 20s checkpoint timeout (barrier wait)"
    # The end-to-end duration's sooner: its words; beyond the horizon: neither; at the timeout: now.
    sooner = {**row, "checkpoint_timeout_eta_s": 45.0}
    assert timeout_warning(BY_NAME["backpressure"].forecasts(sooner, None, 900.0)).startswith(
        "; checkpoints will exceed their 20s timeout in ~45s")
    assert BY_NAME["backpressure"].forecasts(row, None, 120.0) == []
    now = BY_NAME["skew"].forecasts({**row, "barrier_wait_timeout_eta_s": 0.0}, None, 900.0)
    assert timeout_warning(now) == "; checkpoint barriers wait out their 20s timeout now"


def test_a_leak_s_forecast_to_a_configured_limit_carries_the_growth_test_s_band():
    from pipelines.families import BY_NAME
    leak = BY_NAME["state_leak"]
    # +10 KB/s on 1 MB (36/h): a 10 MB limit in 900 s; the growth window's bounds 24/h-48/h.
    row = {**_row(None), "vertex_state_size_bytes": 1e6, "vertex_state_rel_slope_per_h": 36.0,
           "vertex_state_growth_low_per_h": 24.0, "vertex_state_growth_high_per_h": 48.0}
    forecast = leak.forecast(row, 10_000_000)
    assert forecast == {"metric": "state_size_bytes", "limit_source": "config", "limit": 10_000_000,
                        "eta_ms": 900_000, "eta_low_ms": 675_000, "eta_high_ms": 1_350_000, "fitted_over_ms": None,
                        "method": "linear_trend"}
    assert "limit in 15 min (11 min-22 min);" in leak.summary("orders / window", row, forecast, "warning")
    # A lower bound at or below nothing leaves the band open above; no bounds, no band; the band holds the ETA.
    assert leak.forecast({**row, "vertex_state_growth_low_per_h": -1.0}, 10_000_000)["eta_high_ms"] is None
    unknown = leak.forecast({**row, "vertex_state_growth_high_per_h": None}, 10_000_000)
    assert (unknown["eta_low_ms"], unknown["eta_high_ms"]) == (None, None)
    narrow = leak.forecast({**row, "vertex_state_growth_low_per_h": 40.0, "vertex_state_growth_high_per_h": 44.0},
                           10_000_000)
    assert narrow["eta_low_ms"] <= narrow["eta_ms"] <= narrow["eta_high_ms"] == 900_000
    # The job's state where the vertex's is unknown.
    job_row = {**_row(None), "state_size_bytes": 1e6, "state_rel_slope_per_h": 36.0, "state_growth_low_per_h": 24.0,
               "state_growth_high_per_h": 48.0}
    assert leak.forecast(job_row, 10_000_000)["eta_low_ms"] == 675_000


def test_a_leak_s_forecast_to_the_job_s_own_limit_carries_its_band_and_says_it():
    from pipelines.families import BY_NAME
    from pipelines.families.base import limit_text
    leak = BY_NAME["state_leak"]
    row = {**_row(None), "vertex_state_size_bytes": 2.5 * 2**20, "vertex_limit_ratio": 0.5, "limit_eta_s": 900.0,
           "limit_eta_low_s": 600.0, "limit_eta_high_s": 1200.0, "limit_fitted_over_s": 33.0,
           "state_limit_bytes": 5.0 * 2**20, "vertex_state_rel_slope_per_h": 2.0}
    forecast = leak.forecast(row, None)
    assert forecast == {"metric": "largest_subtask_state_bytes", "limit": 5 * 2**20, "limit_source": "job",
                        "limit_ratio": 0.5, "eta_ms": 900_000, "eta_low_ms": 600_000, "eta_high_ms": 1_200_000,
                        "fitted_over_ms": 33_000, "method": "linear_trend"}
    assert "limit in 15 min (10 min-20 min);" in leak.summary("orders / window", row, forecast, "warning")
    assert limit_text(forecast) == "the 5.0 MB state limit (job, at 50% now)"
    # A band the line leaves open above (it may not rise at all) is said so.
    open_above = leak.forecast({**row, "limit_eta_high_s": None}, None)
    assert open_above["eta_high_ms"] is None
    assert "limit in 15 min (or later: from 10 min);" in leak.summary("orders / window", row, open_above, "warning")
    # At the limit: said so, not "in 0s (0s-0s)".
    at_limit = leak.forecast({**row, "limit_eta_s": 0.0, "limit_eta_low_s": 0.0, "limit_eta_high_s": 0.0}, None)
    assert "state 2.5 MB growing 200%/h without levelling off, at its limit now;" in leak.summary(
        "orders / window", row, at_limit, "critical")
