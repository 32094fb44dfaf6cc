"""What an incident says: evidence, forecast, severity, a one-line summary and a runbook.

Pure functions of the feature row that triggered the decision (plus the few recent values the
policy keeps); each family's wording, severity, forecast and runbook are declared with the
family (:mod:`pipelines.families`), and these functions ask its spec.
"""

from __future__ import annotations

from typing import Any, Mapping

from models.detectors import default_features
from pipelines.families import BY_NAME
from pipelines.families.base import human_duration, num, timeout_warning
from pipelines.families.state_leak import LIMIT_COLUMNS, configured_limit_eta_s

__all__ = ["LIMIT_COLUMNS", "configured_limit_eta_s", "evidence", "forecasts", "human_duration", "runbook", "severity",
           "subtask_of", "summary", "timeout_warning"]


def forecasts(family: str, row: Mapping[str, Any], job_settings) -> list[dict]:
    """Every forecast of the family at ``row`` for a job with ``job_settings`` (its state limit and
    warning horizon), soonest first."""
    return BY_NAME[family].forecasts(row, job_settings.state_limit_bytes, job_settings.warning_horizon_s)


def severity(family: str, row: Mapping[str, Any], forecast: dict | None, critical_eta_s: float) -> str:
    return BY_NAME[family].severity(row, forecast, critical_eta_s)


def evidence(family: str, row: Mapping[str, Any], recent: Mapping[str, list]) -> dict:
    """The feature values the family's detector read, non-null ones only, plus recent raw values."""
    names = default_features(family)
    values = {n: round(v, 6) for n in names if (v := num(row, n)) is not None}
    out: dict[str, Any] = {"features": values, "ts": int(row["ts"])}
    out.update({k: v for k, v in recent.items() if v})
    return out


def subtask_of(family: str, row: Mapping[str, Any]) -> int | None:
    return BY_NAME[family].subtask(row)


def summary(family: str, row: Mapping[str, Any], forecast: dict | None, sev: str) -> str:
    job, vertex = row.get("job_name") or row.get("job_id"), row.get("vertex_name")
    where = f"{job} / {vertex}" if vertex else f"{job}"
    return BY_NAME[family].summary(where, row, forecast, sev)


def runbook(family: str, row: Mapping[str, Any]) -> list[str]:
    return BY_NAME[family].runbook_for(row)
