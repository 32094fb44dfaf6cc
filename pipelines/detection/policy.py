"""The incident policy: scores and post-rules in, incident events out; deterministic and pure.

One open incident per (job, family, vertex). Per entity, in event-time order:

* ``opened`` when the family's post-rule holds (K of the last N scores over its threshold);
* ``updated`` when, while open, the severity rises (or has stayed lower for ``resolve_after_s``),
  or the forecast ETA moves by more than ``eta_change_ratio`` (and at least a minute);
* ``resolved`` once the rule has not held for ``resolve_after_s`` of event time, or at once when
  the job reaches a terminal state (finished, cancelled, failed).

Anomalies are what no family explains: the novelty detector's decision opens an incident only
while no supervised family holds for that job. Likewise slow or failing checkpoints caused by a
leak (seed 000), backpressure or skew (barrier alignment waiting on the hot subtask) are a
symptom: while such an incident is open on the job, they are not an incident of their own, and
a symptom incident opened before its cause was recognised is resolved when the cause's opens. The incident id hashes the entity and the event
time it opened, so re-running a micro-batch from the same state re-sends the same ids, and a
replay of the same events gives the same incidents as the live job.

The whole state is a JSON-able dict; :func:`step` returns the events and mutates the state.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd

from models.post_rule import PostRule
from pipelines.detection import evidence as ev

SCHEMA_VERSION = 1
TERMINAL_STATES = ("FINISHED", "CANCELED", "FAILED")
FAMILY_ORDER = ("state_leak", "backpressure", "skew", "checkpoint_failure", "anomaly")
ROOT_CAUSES = ("state_leak", "backpressure", "skew", "checkpoint_failure")
# A family's decision is folded into an incident of these (its cause) on the same job.
EXPLAINED_BY = {"checkpoint_failure": ("state_leak", "backpressure", "skew"), "anomaly": ROOT_CAUSES}
RECENT_VALUES = 6  # raw values kept per entity for the evidence
RECENT_COLUMNS = {"state_leak": "vertex_state_size_bytes", "checkpoint_failure": "checkpoint_failed_fraction",
                  "backpressure": "busy_max", "skew": "records_in_max_over_mean"}


@dataclass(frozen=True)
class PolicySettings:
    resolve_after_ms: int = 600_000
    eta_change_ratio: float = 0.25
    critical_eta_s: float = 3600.0
    state_limit_bytes: int | None = None
    forget_after_ms: int = 1_800_000  # a job silent this long, with nothing open, leaves the state

    @classmethod
    def from_config(cls, config) -> "PolicySettings":
        detection = config.detection
        return cls(int(detection.resolve_after_s * 1000), detection.eta_change_ratio, detection.critical_eta_s,
                   detection.state_limit_bytes, config.features.idle_timeout_ms)


def incident_id(cluster: str, job_id: str, family: str, vertex_id: str | None, opened_at: int) -> str:
    raw = f"{cluster}|{job_id}|{family}|{vertex_id or ''}|{opened_at}".encode()
    return f"{family}-{hashlib.sha256(raw).hexdigest()[:20]}"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def step(state: dict, rows: pd.DataFrame, scores: pd.DataFrame, rules: Mapping[str, PostRule],
         settings: PolicySettings) -> list[dict]:
    """Advance the policy over one batch of scored feature rows; return the incident events.

    ``rows`` are feature rows (late markers excluded), ``scores`` come from
    :func:`pipelines.detection.scoring.score_rows` over them; ``rules`` hold each family's post-rule.
    """
    if scores.empty:
        return _terminal(state, rows)
    merged = scores.merge(rows, left_on="row", right_index=True, how="inner")
    merged["_family_order"] = merged["family"].map(FAMILY_ORDER.index)
    merged["_vertex"] = merged["vertex_id"].fillna("")
    merged = merged.sort_values(["cluster", "job_id", "ts", "_family_order", "_vertex"], kind="stable")
    events: list[dict] = []
    for record in merged.to_dict("records"):
        record = {k: _clean(v) for k, v in record.items()}
        family = record["family"]
        job_key = f"{record['cluster']}/{record['job_id']}"
        job = state.setdefault(job_key, {})
        job["_last_ts"] = max(job.get("_last_ts", 0), int(record["ts"]))
        entity_key = f"{family}/{record['vertex_id'] or ''}"
        entity = job.setdefault(entity_key, {"scores": [], "recent": [], "open": None})
        rule = rules[family]
        entity["scores"] = (entity["scores"] + [float(record["score"])])[-rule.n:]
        column = RECENT_COLUMNS.get(family)
        if column and record.get(column) is not None:
            entity["recent"] = (entity["recent"] + [record[column]])[-RECENT_VALUES:]
        holds = rule.decide(entity["scores"], record)
        if family in EXPLAINED_BY and holds:
            holds = not _explained(job, record["ts"], EXPLAINED_BY[family])
        if family in ROOT_CAUSES and holds:
            job.setdefault("_holding", {})[family] = record["ts"]
        if record.get("job_state") in TERMINAL_STATES:
            holds = False
        changes = _transition(entity, holds, record, settings)
        events.extend(changes)
        if any(e["event"] == "opened" for e in changes):
            events.extend(_supersede(job, family, entity["open"]["id"], record))
    events.extend(_terminal(state, rows))
    _forget_silent_jobs(state, int(merged["ts"].max()), settings.forget_after_ms)
    return events


def _forget_silent_jobs(state: dict, now_ts: int, forget_after_ms: int) -> None:
    """Keep the state bounded by live jobs, as the feature state is: a job silent for the idle
    timeout with no incident open is forgotten (its next event starts it afresh)."""
    for job_key in [k for k, job in state.items()
                    if job.get("_last_ts", now_ts) < now_ts - forget_after_ms
                    and not any(isinstance(e, dict) and e.get("open") for e in job.values())]:
        del state[job_key]


def _supersede(job: dict, cause: str, cause_id: str, record: dict) -> list[dict]:
    """A root cause opening resolves the symptom incidents it explains that opened before it."""
    events = []
    for key, entity in sorted(job.items()):
        family = key.split("/", 1)[0]
        if isinstance(entity, dict) and entity.get("open") and cause in EXPLAINED_BY.get(family, ()):
            event = _resolve_now(entity, family, record)
            event["summary"] = f"[resolved] {family.replace('_', ' ')} in {event['job_name']}: explained by the " \
                               f"{cause.replace('_', ' ')} incident {cause_id}"
            event["evidence"]["explained_by"] = cause_id
            events.append(event)
    return events


def _resolve_now(entity: dict, family: str, record: dict) -> dict:
    row = {**{k: _clean(v) for k, v in record.items()}, "family": family, "score": entity["scores"][-1],
           "vertex_id": entity["open"].get("vertex_id"), "model_name": None, "model_version": None, "model_alias": None}
    event = _event("resolved", entity, row, None, entity["open"]["severity"])
    entity["open"] = None
    return event


def _explained(job: dict, ts: int, causes: tuple[str, ...]) -> bool:
    """One of ``causes`` holds for this job at this evaluation, or has an incident open."""
    if any(job.get("_holding", {}).get(cause) == ts for cause in causes):
        return True
    return any(isinstance(v, dict) and k.split("/", 1)[0] in causes and v.get("open") for k, v in job.items())


def _transition(entity: dict, holds: bool, record: dict, settings: PolicySettings) -> list[dict]:
    family, ts, open_ = record["family"], int(record["ts"]), entity["open"]
    terminal = record.get("job_state") in TERMINAL_STATES
    if holds:
        forecast = ev.leak_forecast(record, settings.state_limit_bytes) if family == "state_leak" else None
        severity = ev.severity(family, record, forecast, settings.critical_eta_s)
        if open_ is None:
            entity["open"] = {"id": incident_id(record["cluster"], record["job_id"], family, record["vertex_id"], ts),
                              "opened_at": ts, "severity": severity, "eta_ms": forecast and forecast["eta_ms"],
                              "eta_at": ts, "clear_since": None}
            return [_event("opened", entity, record, forecast, severity)]
        open_["clear_since"] = None
        severity = _settled_severity(open_, severity, ts, settings)
        if severity != open_["severity"] or _eta_moved(open_, forecast, ts, settings):
            open_.update(severity=severity, eta_ms=forecast and forecast["eta_ms"], eta_at=ts)
            return [_event("updated", entity, record, forecast, severity)]
        return []
    if open_ is None:
        return []
    open_["clear_since"] = open_["clear_since"] if open_["clear_since"] is not None else ts
    if terminal or ts - open_["clear_since"] >= settings.resolve_after_ms:
        event = _event("resolved", entity, record, None, open_["severity"])
        entity["open"] = None
        return [event]
    return []


SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def _settled_severity(open_: dict, severity: str, ts: int, settings: PolicySettings) -> str:
    """Escalate at once; step down only after the lower severity held for ``resolve_after``
    (a failure rate hovering at a boundary must not page, un-page and page again)."""
    if SEVERITY_RANK[severity] >= SEVERITY_RANK[open_["severity"]]:
        open_["lower_since"] = None
        return severity
    lower_since = open_.get("lower_since")
    if lower_since is None:
        open_["lower_since"] = ts
        return open_["severity"]
    if ts - lower_since >= settings.resolve_after_ms:
        open_["lower_since"] = None
        return severity
    return open_["severity"]


def _eta_moved(open_: dict, forecast: dict | None, ts: int, settings: PolicySettings) -> bool:
    old, new = open_.get("eta_ms"), forecast and forecast["eta_ms"]
    if (old is None) != (new is None):
        return True
    if old is None:
        return False
    # Compare with what the old forecast says now: a steady leak's ETA shrinks by the time passed.
    expected = old - (ts - open_["eta_at"])
    return abs(new - expected) > max(60_000, settings.eta_change_ratio * max(expected, 0))


def _terminal(state: dict, rows: pd.DataFrame) -> list[dict]:
    """Jobs whose rows report a terminal state resolve everything still open (e.g. with no scores)."""
    if rows.empty or "job_state" not in rows:
        return []
    events = []
    ended = rows[rows["job_state"].isin(TERMINAL_STATES)].sort_values("ts", kind="stable")
    for record in ended.to_dict("records"):
        job = state.get(f"{record['cluster']}/{record['job_id']}", {})
        for key, entity in sorted(job.items()):
            if isinstance(entity, dict) and entity.get("open"):
                events.append(_resolve_now(entity, key.split("/", 1)[0], record))
    return events


def _event(kind: str, entity: dict, record: dict, forecast: dict | None, severity: str) -> dict:
    open_, family, ts = entity["open"], record["family"], int(record["ts"])
    open_.setdefault("vertex_id", record.get("vertex_id"))
    open_.setdefault("vertex_name", record.get("vertex_name"))
    open_.setdefault("subtask_index", ev.subtask_of(family, record))
    open_["model"] = {"name": record.get("model_name") or open_.get("model", {}).get("name", ""),
                      "version": record.get("model_version") or open_.get("model", {}).get("version"),
                      "alias": record.get("model_alias") or open_.get("model", {}).get("alias")}
    recent = {f"recent_{RECENT_COLUMNS[family]}": entity["recent"]} if family in RECENT_COLUMNS else {}
    if family == "checkpoint_failure" and record.get("last_failure_message"):
        recent["last_failure_message"] = record["last_failure_message"]
    summary = ev.summary(family, record, forecast, severity)
    if kind == "resolved":
        summary = f"[resolved] {family.replace('_', ' ')} in {record.get('job_name')}" + (
            f" / {open_['vertex_name']}" if open_["vertex_name"] else "") + (
            " (the job ended)" if record.get("job_state") in TERMINAL_STATES else " has cleared")
    return {
        "schema_version": SCHEMA_VERSION,
        "incident_id": open_["id"],
        "event": kind,
        "family": family,
        "severity": severity,
        "cluster": record["cluster"],
        "job_id": record["job_id"],
        "job_name": record.get("job_name") or "",
        "vertex_id": open_["vertex_id"],
        "vertex_name": open_["vertex_name"],
        "subtask_index": open_["subtask_index"],
        "score": min(1.0, max(0.0, float(record["score"]))),
        "model": open_["model"],
        "opened_at": open_["opened_at"],
        "updated_at": ts,
        "resolved_at": ts if kind == "resolved" else None,
        "summary": summary,
        "evidence": ev.evidence(family, record, recent),
        "forecast": forecast,
        "runbook": ev.runbook(family, record),
        "labels": {"cluster": record["cluster"], "job_name": record.get("job_name") or "", "family": family,
                   "severity": severity, "event": kind},
    }
