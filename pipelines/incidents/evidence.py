"""What an incident says: evidence, forecast, severity, a one-line summary and a runbook.

Pure functions of the feature row that triggered the decision (plus the few recent values the
policy keeps). Each family's runbook steps are declared with the family (:mod:`pipelines.families`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from feature_store.definitions import FEATURES
from models.detectors import default_features
from pipelines.families import BY_NAME

MIB = 1024 * 1024
_LEVEL = {f.name: f.level for f in FEATURES}


def _num(row: Mapping[str, Any], name: str) -> float | None:
    value = row.get(name)
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _mb(n: float | None) -> str:
    return "?" if n is None else f"{n / MIB:.1f} MB"


def human_duration(seconds: float) -> str:
    """``42s``, ``9 min``, ``2.5 h``: how an incident says how long."""
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def leak_forecast(row: Mapping[str, Any], configured_limit: int | None) -> dict | None:
    """ETA to the state limit: the job's own ``max_state_size_bytes`` first, else the configured one.

    With the job's limit the features carry the largest subtask's ETA already; with a configured
    limit the whole state's growth is extrapolated from its relative slope.
    """
    eta_s, limit_ratio = _num(row, "limit_eta_s"), _num(row, "vertex_limit_ratio") or _num(row, "limit_ratio")
    if eta_s is not None and limit_ratio:
        # The ratio is the largest subtask's state over the limit.
        return {"metric": "largest_subtask_state_bytes", "limit_source": "job", "limit_ratio": round(limit_ratio, 4),
                "eta_ms": int(eta_s * 1000)}
    if configured_limit:
        eta = float(configured_limit_eta_s(pd.DataFrame([row]), np.array([configured_limit], dtype="float64"))[0])
        if not math.isnan(eta):
            return {"metric": "state_size_bytes", "limit_source": "config", "limit": configured_limit,
                    "eta_ms": int(eta * 1000)}
    return None


# What :func:`configured_limit_eta_s` reads.
LIMIT_COLUMNS = ("vertex_state_size_bytes", "state_size_bytes", "vertex_state_rel_slope_per_h", "state_rel_slope_per_h")


def configured_limit_eta_s(rows: pd.DataFrame, limits: np.ndarray) -> np.ndarray:
    """Seconds until each row's state reaches its configured limit at its relative slope (the
    vertex's where known, else the job's); NaN without a limit or growth."""
    def column(name: str) -> np.ndarray:
        return rows[name].to_numpy(dtype="float64") if name in rows else np.full(len(rows), np.nan)

    size = np.where(np.isnan(column("vertex_state_size_bytes")), column("state_size_bytes"),
                    column("vertex_state_size_bytes"))
    slope = np.where(np.isnan(column("vertex_state_rel_slope_per_h")), column("state_rel_slope_per_h"),
                     column("vertex_state_rel_slope_per_h"))
    growth_per_s = slope * size / 3600.0
    with np.errstate(divide="ignore", invalid="ignore"):
        eta = np.maximum(0.0, (limits - size) / growth_per_s)
    return np.where((growth_per_s > 0) & (size > 0) & ~np.isnan(limits), eta, np.nan)


def severity(family: str, row: Mapping[str, Any], forecast: dict | None, critical_eta_s: float) -> str:
    if family == "anomaly":
        return "info"
    if family == "state_leak":
        if forecast is not None and forecast["eta_ms"] <= critical_eta_s * 1000:
            return "critical"
        return "warning"
    if family == "checkpoint_failure":
        failed = _num(row, "checkpoint_failed_fraction") or 0.0
        consecutive = _num(row, "checkpoint_consecutive_failures") or 0.0
        return "critical" if consecutive >= 3 or failed >= 0.5 else "warning"
    if family == "backpressure":
        over_timeout = _num(row, "checkpoint_duration_over_timeout") or 0.0
        return "critical" if over_timeout >= 0.5 else "warning"
    return "warning"


def evidence(family: str, row: Mapping[str, Any], recent: Mapping[str, list]) -> dict:
    """The feature values the family's detector read, non-null ones only, plus recent raw values."""
    names = default_features(family)
    values = {n: round(v, 6) for n in names if (v := _num(row, n)) is not None}
    out: dict[str, Any] = {"features": values, "ts": int(row["ts"])}
    out.update({k: v for k, v in recent.items() if v})
    return out


def subtask_of(family: str, row: Mapping[str, Any]) -> int | None:
    hot = _num(row, "hot_subtask")
    return int(hot) if family == "skew" and hot is not None else None


def summary(family: str, row: Mapping[str, Any], forecast: dict | None, sev: str) -> str:
    job, vertex = row.get("job_name") or row.get("job_id"), row.get("vertex_name")
    where = f"{job} / {vertex}" if vertex else f"{job}"
    if family == "state_leak":
        slope = _num(row, "vertex_state_rel_slope_per_h") or _num(row, "state_rel_slope_per_h") or 0.0
        size = _num(row, "vertex_state_size_bytes") or _num(row, "state_size_bytes")
        eta = f", limit in {human_duration(forecast['eta_ms'] / 1000)}" if forecast else ", no known limit"
        return f"[{sev}] state leak in {where}: state {_mb(size)} growing {slope * 100:.0f}%/h without levelling off{eta}; set state TTL or clear keys"
    if family == "backpressure":
        busy = _num(row, "busy_max")
        return (f"[{sev}] backpressure: {where} is the bottleneck (busy {busy * 100:.0f}%)" if busy is not None
                else f"[{sev}] backpressure at {where}") + "; scale it out or enable unaligned checkpoints"
    if family == "skew":
        ratio = _num(row, "records_in_max_over_mean") or _num(row, "state_max_over_mean")
        sub = subtask_of(family, row)
        return (f"[{sev}] skew in {where}: subtask {sub if sub is not None else '?'} carries "
                f"{ratio or 0:.1f}x the mean load; salt the hot key or pre-aggregate")
    if family == "checkpoint_failure":
        failed = _num(row, "checkpoint_failed_fraction")
        over = _num(row, "checkpoint_duration_over_timeout")
        detail = f"{failed * 100:.0f}% of recent checkpoints failed" if failed else "checkpoints near their timeout"
        if over is not None:
            detail += f", latest took {over * 100:.0f}% of the timeout"
        return f"[{sev}] checkpoint failures in {where}: {detail}; check storage latency and the timeout"
    return f"[{sev}] unusual checkpoint behaviour in {where} that no failure family explains; have a look"


def runbook(family: str, row: Mapping[str, Any]) -> list[str]:
    steps = list(BY_NAME[family].runbook)
    if family == "state_leak" and (_num(row, "checkpointed_rel_slope_per_h") or 0.0) < 0.05 <= (
            _num(row, "state_rel_slope_per_h") or 0.0):
        steps.insert(1, "Incremental checkpoints hide this leak: checkpointed size is flat while full state grows.")
    return steps
