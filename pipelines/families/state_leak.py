"""State leaks: keyed state that grows without bound until checkpoints exceed a limit or time out.

Its detector reads the state's relative growth and shape (slopes, fits, deceleration, growth over
a plateau or the prior maximum), never the absolute size (a lab job's megabytes, a fleet's
gigabytes) nor the job's age: how long a job may warm up is the operator's (the post-rule's
warm-up horizon), not learned. Incidents forecast the state reaching its limit.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipelines.families.base import (TIMEOUT_FORECASTS, Family, Plot, band_text, col, column, fired, human_duration, mb,
                                     num, vertex_else_job)

NAME = "state_leak"

# What :meth:`StateLeak.limit_eta_s` reads.
LIMIT_COLUMNS = ("vertex_state_size_bytes", "state_size_bytes", "vertex_state_rel_slope_per_h", "state_rel_slope_per_h")

# --- whether the state still grows: one definition for opening, sustaining and resolving ---------
# Each is the vertex's where known, else the job's (feature_store/trajectory.py computes them).
GROWTH_LOW = ("vertex_state_growth_low_per_h", "state_growth_low_per_h")
GROWTH_HIGH = ("vertex_state_growth_high_per_h", "state_growth_high_per_h")
GROWTH_OPENING_LOW = ("vertex_state_growth_opening_low_per_h", "state_growth_opening_low_per_h")
RECENT_GROWTH_LOW = ("vertex_state_recent_growth_low_per_h", "state_recent_growth_low_per_h")
FILLING = ("vertex_state_filling", "state_filling")
PLATEAU_ETA = ("vertex_state_plateau_eta_s", "state_plateau_eta_s")
PLATEAU = ("vertex_state_plateau_bytes", "state_plateau_bytes")
SIZE = ("vertex_state_size_bytes", "state_size_bytes")
OVER_PRIOR_MAX = ("vertex_state_over_prior_max", "state_over_prior_max")
GROWTH_COLUMNS = GROWTH_LOW + GROWTH_OPENING_LOW + RECENT_GROWTH_LOW + OVER_PRIOR_MAX
SHAPE_COLUMNS = FILLING + PLATEAU_ETA + PLATEAU + SIZE + ("vertex_limit_ratio", "limit_ratio", "limit_eta_s")


def _pick(c: Mapping[str, np.ndarray], names: tuple[str, str]) -> np.ndarray:
    return vertex_else_job(c[names[0]], c[names[1]])


def vertex_own(c: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``c`` with the job's growth and shape blanked, so that the tests below read the vertex's
    own state only: every vertex without state of its own falls back to the job's."""
    job = [names[1] for names in (GROWTH_LOW, GROWTH_HIGH, GROWTH_OPENING_LOW, RECENT_GROWTH_LOW, FILLING,
                                  PLATEAU_ETA, PLATEAU, SIZE, OVER_PRIOR_MAX)]
    return {**c, **{name: np.full(len(c[name]), np.nan) for name in job if name in c}}


def still_growing(c: Mapping[str, np.ndarray], min_growth_per_h: float, to_open: bool = False) -> np.ndarray:
    """Where the state still grows: over the growth window (two minutes of checkpoints, at least
    ten) by at least ``min_growth_per_h`` of itself per hour with 95 % confidence, since its last
    change of pace by more than nothing with 95 % confidence, and to a new high (above every
    state before the last checkpoints). For a leak ``to_open``, also with 99.9 % confidence over
    the same two minutes or at least twenty checkpoints: the test is asked at every checkpoint,
    and a leak that opens on one chance reading stays open while the state wobbles. Noise on a
    flat state leaves the first bound below the minimum; TTL-bounded state that wanders with its
    input rate climbs for a minute or two but within the range it held before; a state that
    stopped fails the second within a few checkpoints. Unknown (too few checkpoints): not
    growing."""
    low = np.nan_to_num(_pick(c, GROWTH_LOW), nan=-np.inf)
    if to_open:
        low = np.minimum(low, np.nan_to_num(_pick(c, GROWTH_OPENING_LOW), nan=-np.inf))
    recent = np.nan_to_num(_pick(c, RECENT_GROWTH_LOW), nan=-np.inf)
    # Null before anything left the short window: nothing to be above yet.
    new_high = np.nan_to_num(_pick(c, OVER_PRIOR_MAX), nan=np.inf) >= 1.0
    return (low >= min_growth_per_h) & (recent > 0.0) & new_high


def fills_below_limit(c: Mapping[str, np.ndarray]) -> np.ndarray:
    """Where the state decelerates toward a plateau it reaches before any limit: a bounded key
    space filling, windows filling, TTLs beginning to expire. A limit in sight sooner than the
    plateau (``limit_eta_s``, the job's or the operator's), or a plateau over the job's limit
    (its largest subtask's share of it), makes the fill a leak all the same."""
    filling = np.nan_to_num(_pick(c, FILLING), nan=0.0) >= 1.0
    plateau_eta = np.nan_to_num(_pick(c, PLATEAU_ETA), nan=np.inf)
    limit_eta = np.nan_to_num(c["limit_eta_s"], nan=np.inf)
    size = _pick(c, SIZE)
    ratio = vertex_else_job(c["vertex_limit_ratio"], c["limit_ratio"])
    with np.errstate(divide="ignore", invalid="ignore"):
        plateau_over_limit = _pick(c, PLATEAU) * ratio / size
    over = np.nan_to_num(plateau_over_limit, nan=0.0) >= 1.0
    return filling & (limit_eta > plateau_eta) & ~over


def shape_judged(c: Mapping[str, np.ndarray]) -> np.ndarray:
    """Where the history is long enough for :func:`fills_below_limit` to say whether the state
    fills (before, a fill and a leak look alike)."""
    return ~np.isnan(_pick(c, FILLING))


class StateLeak(Family):
    def severity(self, row: Mapping[str, Any], forecast: dict | None, critical_eta_s: float) -> str:
        if forecast is not None and forecast["eta_ms"] <= critical_eta_s * 1000:
            return "critical"
        return "warning"

    def summary(self, where: str, row: Mapping[str, Any], forecast: dict | None, severity: str) -> str:
        slope = num(row, "vertex_state_rel_slope_per_h") or num(row, "state_rel_slope_per_h") or 0.0
        size = num(row, "vertex_state_size_bytes") or num(row, "state_size_bytes")
        # The state's own limit: a sooner forecast against the timeout is said by the warning after it.
        candidates = row["forecasts"] if row.get("forecasts") is not None else [forecast] if forecast else []
        forecast = next((f for f in candidates if f["metric"] not in TIMEOUT_FORECASTS), None)
        eta = (", no known limit" if not forecast else ", at its limit now" if forecast["eta_ms"] <= 0
               else f", limit in {human_duration(forecast['eta_ms'] / 1000)}{band_text(forecast)}")
        plateau, plateau_eta = num(row, PLATEAU[0]) or num(row, PLATEAU[1]), num(row, PLATEAU_ETA[0]) or num(row, PLATEAU_ETA[1])
        shape = (f"decelerating, levelling off at {mb(plateau)} in ~{human_duration(plateau_eta)}"
                 if plateau and plateau_eta is not None else "without levelling off")
        return (f"[{severity}] state leak in {where}: state {mb(size)} growing {slope * 100:.0f}%/h {shape}{eta}; "
                "set state TTL or clear keys")

    def runbook_for(self, row: Mapping[str, Any]) -> list[str]:
        steps = list(self.runbook)
        if (num(row, "checkpointed_rel_slope_per_h") or 0.0) < 0.05 <= (num(row, "state_rel_slope_per_h") or 0.0):
            steps.insert(1, "Incremental checkpoints hide this leak: checkpointed size is flat while full state grows.")
        return steps

    def forecast(self, row: Mapping[str, Any], configured_limit: int | None) -> dict | None:
        """ETA to the state limit: the job's own ``max_state_size_bytes`` first, else the configured one.

        With the job's limit the features carry the largest subtask's ETA and its line's band
        already; with a configured limit the whole state's growth is extrapolated from its relative
        slope, the band from the growth test's bounds (:func:`configured_limit_band_s`).
        """
        eta_s, limit_ratio = num(row, "limit_eta_s"), num(row, "vertex_limit_ratio") or num(row, "limit_ratio")
        if eta_s is not None and limit_ratio:
            # The ratio is the largest subtask's state over the limit; the band is its line's.
            low, high, over = num(row, "limit_eta_low_s"), num(row, "limit_eta_high_s"), num(row, "limit_fitted_over_s")
            limit = num(row, "state_limit_bytes")
            return {"metric": "largest_subtask_state_bytes", "limit": None if limit is None else int(limit),
                    "limit_source": "job", "limit_ratio": round(limit_ratio, 4), "eta_ms": int(eta_s * 1000),
                    "eta_low_ms": int(min(low if low is not None else eta_s, eta_s) * 1000),
                    "eta_high_ms": None if high is None else int(max(high, eta_s) * 1000),
                    "fitted_over_ms": None if over is None else int(over * 1000), "method": "linear_trend"}
        if configured_limit:
            eta = float(configured_limit_eta_s(pd.DataFrame([row]), np.array([configured_limit], dtype="float64"))[0])
            if not math.isnan(eta):
                low, high = configured_limit_band_s(row, configured_limit, eta)
                return {"metric": "state_size_bytes", "limit_source": "config", "limit": configured_limit,
                        "eta_ms": int(eta * 1000), "eta_low_ms": None if low is None else int(low * 1000),
                        "eta_high_ms": None if high is None else int(high * 1000), "fitted_over_ms": None,
                        "method": "linear_trend"}
        return None

    def limit_eta_s(self, rows: pd.DataFrame, limits: np.ndarray) -> np.ndarray | None:
        return configured_limit_eta_s(rows, limits)

    def guard_text(self, warmup_horizon_s: float) -> str:
        return f"its {warmup_horizon_s:.0f} s warm-up horizon"

    def cleared_resolution(self, record: Mapping[str, Any]) -> str | None:
        # A leak clears when its state stops growing: it levelled off (or was fixed).
        return "levelled_off"

    def static_alarm(self, frame: pd.DataFrame, thresholds: Any) -> np.ndarray:
        # An operator's checkpointed state above a fixed size, or a straight line up with a good fit.
        return fired((col(frame, "vertex_state_size_bytes") > thresholds.checkpoint_size_bytes) | (
            (col(frame, "vertex_state_rel_slope_per_h") > 0) & (col(frame, "vertex_state_r2") >= thresholds.growing_r2)))


def configured_limit_eta_s(rows: pd.DataFrame, limits: np.ndarray) -> np.ndarray:
    """Seconds until each row's state reaches its configured limit at its relative slope (the
    vertex's where known, else the job's); NaN without a limit or growth."""
    size = vertex_else_job(column(rows, "vertex_state_size_bytes"), column(rows, "state_size_bytes"))
    slope = vertex_else_job(column(rows, "vertex_state_rel_slope_per_h"), column(rows, "state_rel_slope_per_h"))
    growth_per_s = slope * size / 3600.0
    with np.errstate(divide="ignore", invalid="ignore"):
        eta = np.maximum(0.0, (limits - size) / growth_per_s)
    return np.where((growth_per_s > 0) & (size > 0) & ~np.isnan(limits), eta, np.nan)


def configured_limit_band_s(row: Mapping[str, Any], limit: float, eta_s: float) -> tuple[float | None, float | None]:
    """The 95 % band ``(earliest, latest)`` of :func:`configured_limit_eta_s`'s ETA: the state's
    size now reaching ``limit`` at the growth window's steepest and flattest relative slope (the
    growth test's bounds, the vertex's where known), each times the size now as the ETA's slope
    is. The band always holds the ETA; it is open above (latest None) where the state may not
    grow at all, and unknown (both None) without the bounds."""
    if eta_s <= 0:
        return 0.0, 0.0
    level = 0 if num(row, SIZE[0]) is not None else 1  # the vertex's where known, as the ETA's
    size, low_rate, high_rate = num(row, SIZE[level]), num(row, GROWTH_LOW[level]), num(row, GROWTH_HIGH[level])
    if not size or high_rate is None or high_rate <= 0:
        return None, None
    gap_h = (limit - size) / size * 3600.0
    earliest = min(eta_s, gap_h / high_rate)
    latest = max(eta_s, gap_h / low_rate) if low_rate is not None and low_rate > 0 else None
    return earliest, latest


FAMILY = StateLeak(
    name=NAME, label="State leak", alertname="FlinkStateLeak", model_name="sentinel-state-leak",
    page_plot="state",
    localised=True, supervised=True, colour="tab:red",
    decisive_plot=Plot("vertex_state_size_bytes", "state (bytes)"),
    features=(
        "checkpoint_interval_ms", "state_rel_slope_per_h", "state_r2", "state_frac_increasing",
        "state_rel_slope_long_per_h", "state_r2_long", "state_deceleration", "state_over_prior_max",
        "state_over_plateau", "checkpointed_rel_slope_per_h", "limit_ratio", "limit_eta_s",
        "vertex_state_rel_slope_per_h", "vertex_state_r2", "vertex_state_rel_slope_long_per_h",
        "vertex_state_r2_long", "vertex_state_deceleration", "vertex_limit_ratio", "vertex_state_over_prior_max",
        "vertex_state_over_plateau", "busy_reported", "state_reported", "limit_known"),
    # No monotone signs: a warm-up and a leak differ in how growth, fit and deceleration combine;
    # constrained, the leak detector fired on a simulated CEP warm-up and missed linear leaks.
    # A decision on a job younger than its warm-up horizon needs growth after a plateau or its
    # limit in sight (the horizon itself comes from the config); past it, growth that goes on for
    # 45 s more (a TTL warm-up whose plateau comes just after a declared horizon is not a leak).
    # Growth certain enough to open that then holds at every checkpoint for 90 s needs one score of
    # half the threshold, not 4 of 6 over it (a score that wavers over a plain leak must not lose it).
    post_rule=(("warmup_guard", True), ("confirm_after_horizon_s", 45.0), ("growth_confirms_after_s", 90.0)),
    recent_column="vertex_state_size_bytes",
    runbook=(
        "Find the operator whose state grows (evidence: vertex) and the state it keeps per key.",
        "Set a state TTL (StateTtlConfig) on keyed state that outlives its use, or clear it in a timer.",
        "Check CEP patterns for a within() clause and windows for a trigger that never purges; "
        "retired keys must leave state (FLINK-19970: expired partial matches of retired keys stay).",
        "Move large state from the heap/memory backend to RocksDB (state.backend.type: rocksdb) with "
        "incremental checkpoints; the memory backend fails checkpoints above its maximum state size.",
        "Until fixed: raise the state or frame-size limit and take a savepoint before it is reached.",
    ),
)
