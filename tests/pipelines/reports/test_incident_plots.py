"""The checkpoint plot every incident page shows: durations against the timeout, and the forecast."""

from __future__ import annotations

import pandas as pd
import pytest

from pipelines.reports.incident_plots import checkpoint_plot
from pipelines.reports.page_inputs import JobMetrics

MIN = 60_000


def _metrics() -> JobMetrics:
    checkpoints = pd.DataFrame([{"ts": i * 10_000 + 900, "trigger_ts": i * 10_000, "checkpoint_id": i,
                                 "status": "COMPLETED", "duration_ms": 1000 + 40 * i, "state_size_bytes": 1e6 * i,
                                 "failure_message": None} for i in range(30)])
    status = pd.DataFrame([{"ts": 0, "state": "RUNNING", "num_restarts": 0, "interval_ms": 10_000, "timeout_ms": 3000,
                            "max_state_size_bytes": None}])
    empty = pd.DataFrame()
    return JobMetrics(checkpoints, empty, empty, empty, status)


def _incident(forecasts):
    return {"event": "updated", "family": "state_leak", "updated_at": 5 * MIN, "opened_at": 4 * MIN,
            "resolved_at": None, "forecasts": forecasts, "forecast": forecasts[0] if forecasts else None}


def test_the_timeout_forecast_is_drawn_with_its_band_and_eta():
    forecast = {"metric": "checkpoint_duration_ms", "limit": 3000, "limit_source": "job", "eta_ms": 240_000,
                "eta_low_ms": 180_000, "eta_high_ms": 360_000}
    svg = checkpoint_plot([_incident([forecast])], _metrics())
    assert "forecast: the timeout in ~4 min (3 min-6 min)" in svg
    assert "its 95 % band" in svg and "open above" not in svg
    open_above = checkpoint_plot([_incident([{**forecast, "eta_high_ms": None}])], _metrics())
    assert "its 95 % band (open above)" in open_above


def test_without_a_timeout_forecast_only_the_durations_are_drawn():
    state = {"metric": "state_size_bytes", "limit": 5 * 2**20, "limit_source": "config", "eta_ms": 900_000}
    svg = checkpoint_plot([_incident([state])], _metrics())
    assert "timeout 3s" in svg and "forecast" not in svg


def test_a_vertex_s_barrier_wait_forecast_is_drawn_over_its_own_waits():
    metrics = _metrics()
    metrics.barrier_waits = pd.DataFrame([{"ts": i * 10_000 + 900, "trigger_ts": i * 10_000, "vertex_id": vid,
                                           "wait_ms": 100.0 * i} for i in range(30) for vid in ("slow", "other")])
    barrier = {"metric": "checkpoint_barrier_wait_ms", "limit": 3000, "limit_source": "job", "eta_ms": 120_000,
               "eta_low_ms": 60_000, "eta_high_ms": None}
    incident = {**_incident([barrier]), "family": "backpressure", "vertex_id": "slow", "vertex_name": "enrich"}
    svg = checkpoint_plot([incident], metrics)
    assert "barrier wait of enrich" in svg
    assert "forecast: barriers wait out the timeout in ~2 min (or later: from 60s)" in svg
    assert "its 95 % band (open above)" in svg and "forecast: the timeout" not in svg
    # Another vertex's incident has no waits of its own drawn, nor a forecast it does not carry.
    assert "barrier wait" not in checkpoint_plot([{**incident, "forecasts": []}], metrics)


def test_the_leak_s_fitted_trend_runs_through_the_data_not_below_it():
    # A state doubling over the window: its relative slope is over the window's mean, not its latest size.
    from pipelines.reports.incident_plots import fitted_trend
    ts = pd.Series([i * 10_000.0 for i in range(12)])
    values = pd.Series([1e8 + 1e7 * i for i in range(12)])  # +1e7 per 10 s
    mean = float(values.mean())
    rel_slope_per_h = 1e7 / 10_000 * 3_600_000 / mean
    start, start_value, end_value, per_ms = fitted_trend(ts, values, rel_slope_per_h, 110_000.0, 12 * 10_000)
    assert start == 0.0 and per_ms == pytest.approx(1e7 / 10_000)
    assert start_value == pytest.approx(1e8) and end_value == pytest.approx(2.1e8)  # the data at both ends
