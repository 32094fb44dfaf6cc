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

from pipelines.families.base import Family, Plot, col, column, fired, human_duration, mb, num, vertex_else_job

NAME = "state_leak"

# What :meth:`StateLeak.limit_eta_s` reads.
LIMIT_COLUMNS = ("vertex_state_size_bytes", "state_size_bytes", "vertex_state_rel_slope_per_h", "state_rel_slope_per_h")


class StateLeak(Family):
    def severity(self, row: Mapping[str, Any], forecast: dict | None, critical_eta_s: float) -> str:
        if forecast is not None and forecast["eta_ms"] <= critical_eta_s * 1000:
            return "critical"
        return "warning"

    def summary(self, where: str, row: Mapping[str, Any], forecast: dict | None, severity: str) -> str:
        slope = num(row, "vertex_state_rel_slope_per_h") or num(row, "state_rel_slope_per_h") or 0.0
        size = num(row, "vertex_state_size_bytes") or num(row, "state_size_bytes")
        eta = f", limit in {human_duration(forecast['eta_ms'] / 1000)}" if forecast else ", no known limit"
        return (f"[{severity}] state leak in {where}: state {mb(size)} growing {slope * 100:.0f}%/h without "
                f"levelling off{eta}; set state TTL or clear keys")

    def runbook_for(self, row: Mapping[str, Any]) -> list[str]:
        steps = list(self.runbook)
        if (num(row, "checkpointed_rel_slope_per_h") or 0.0) < 0.05 <= (num(row, "state_rel_slope_per_h") or 0.0):
            steps.insert(1, "Incremental checkpoints hide this leak: checkpointed size is flat while full state grows.")
        return steps

    def forecast(self, row: Mapping[str, Any], configured_limit: int | None) -> dict | None:
        """ETA to the state limit: the job's own ``max_state_size_bytes`` first, else the configured one.

        With the job's limit the features carry the largest subtask's ETA already; with a configured
        limit the whole state's growth is extrapolated from its relative slope.
        """
        eta_s, limit_ratio = num(row, "limit_eta_s"), num(row, "vertex_limit_ratio") or num(row, "limit_ratio")
        if eta_s is not None and limit_ratio:
            # The ratio is the largest subtask's state over the limit.
            return {"metric": "largest_subtask_state_bytes", "limit_source": "job",
                    "limit_ratio": round(limit_ratio, 4), "eta_ms": int(eta_s * 1000)}
        if configured_limit:
            eta = float(configured_limit_eta_s(pd.DataFrame([row]), np.array([configured_limit], dtype="float64"))[0])
            if not math.isnan(eta):
                return {"metric": "state_size_bytes", "limit_source": "config", "limit": configured_limit,
                        "eta_ms": int(eta * 1000)}
        return None

    def limit_eta_s(self, rows: pd.DataFrame, limits: np.ndarray) -> np.ndarray | None:
        return configured_limit_eta_s(rows, limits)

    def guard_text(self, warmup_horizon_s: float) -> str:
        return f"its {warmup_horizon_s:.0f} s warm-up horizon"

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


FAMILY = StateLeak(
    name=NAME, label="State leak", alertname="FlinkStateLeak", model_name="sentinel-state-leak",
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
    # limit in sight (the horizon itself comes from the config).
    post_rule=(("warmup_guard", True),),
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
