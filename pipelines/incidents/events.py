"""What the incident policy publishes: incident events built from its per-entity state.

The policy (:mod:`pipelines.incidents.policy`) decides when an incident opens, updates and
resolves; these functions make the event of each from the incident's state
(:class:`~pipelines.incidents.policy_state.OpenIncident`): its deterministic id, its summary (the
cause's latest sentence and each symptom once), evidence, forecasts, runbook and routing labels,
its ordered times, what it says of a predicted failure, and a suspicion's ``info`` incident.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from pipelines.contracts import SCHEMA_VERSION
from pipelines.contracts import TERMINAL_JOB_STATES as TERMINAL_STATES
from pipelines.families import ALERTNAMES, BY_NAME
from pipelines.families.base import TIMEOUT_METRICS, timeout_forecast_in
from pipelines.families.registry import RECENT_COLUMNS
from pipelines.incidents import evidence as ev
from pipelines.incidents.policy_state import OpenIncident, Suspicion
from pipelines.incidents.settings import JobSettings, PolicySettings

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def incident_id(cluster: str, job_id: str, family: str, vertex_id: str | None, opened_at: int) -> str:
    raw = f"{cluster}|{job_id}|{family}|{vertex_id or ''}|{opened_at}".encode()
    return f"{family}-{hashlib.sha256(raw).hexdigest()[:20]}"


def clean_value(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def cause_sentence(family: str, record: dict, forecast: dict | None, severity: str) -> str:
    """What an open incident says of its cause at ``record``: the family's summary, and the
    timeout warning its forecasts carry."""
    return ev.summary(family, record, forecast, severity) + ev.timeout_warning(record.get("forecasts") or [])


def summary_base(summary: str) -> str:
    """A published summary without its severity and its symptoms."""
    return summary.split("] ", 1)[-1].split(" (and ", 1)[0]


def summary_with_symptoms(open_: OpenIncident, severity: str, base: str) -> str:
    """An open incident's summary: its cause's latest sentence, and each symptom once, in its
    latest words (not the text of every earlier update appended again)."""
    details = [s.detail or s.family.replace("_", " ") for s in open_.symptoms]
    return f"[{severity}] {base}" + (f" (and {', '.join(details)})" if details else "")


def recent_failure(family: str, record: dict) -> dict:
    return BY_NAME[family].recent_evidence(record)


def public_symptoms(open_: OpenIncident) -> list[dict]:
    """The incident's symptoms as its events publish them."""
    return [{"family": s.family, "first_at": s.first_at, "evidence": s.evidence} for s in open_.symptoms]


def rank(severity: str) -> int:
    return SEVERITY_RANK[severity]


def with_symptoms(open_: OpenIncident, severity: str, ts: int, settings: PolicySettings) -> str:
    """The worse of ``severity`` and the severities of symptoms seen within the clear time."""
    current = [s.severity for s in open_.symptoms if ts - s.last_at < settings.resolve_after_ms]
    return max([severity, *current], key=SEVERITY_RANK.get)


UNCONFIRMED = "unconfirmed"
FORECAST_RECEDED = "forecast_receded"


def opened_incident(record: dict, severity: str, eta_ms: float | None) -> OpenIncident:
    """The incident of ``record``'s entity opening at its row: where it is, and its id."""
    family, ts = record["family"], int(record["ts"])
    return OpenIncident(incident_id(record["cluster"], record["job_id"], family, record["vertex_id"], ts), ts,
                        severity, eta_ms, ts, record.get("vertex_id"), record.get("vertex_name"),
                        ev.subtask_of(family, record))


def suspicion(recent: list, record: dict, forecast: dict | None, job_settings: JobSettings) -> Suspicion:
    """What a decision a guard holds back becomes if the job ends or goes away before the guard
    lifts: the opening of an ``info`` incident, kept until then (see :func:`unconfirmed`);
    ``recent`` is the entity's last evidence values."""
    guard = BY_NAME[record["family"]].guard_text(job_settings.warmup_horizon_s)
    event = incident_event("opened", opened_incident(record, "info", None), recent, record, forecast, "info")
    event["summary"] = f"[suspected] {event['summary']} (not confirmed: within {guard})"
    return Suspicion(event, guard)


def unconfirmed(held: Suspicion, at_ms: int, why: str) -> list[dict]:
    """A suspicion still held when its job ended or went away: published as an ``info`` incident
    opened where the guard first held it back and resolved at once, ``resolution: unconfirmed``.
    A fault shorter than its guard is told, not swallowed; it never pages (severity ``info``)."""
    opened = {**held.event, "labels": {**held.event["labels"], "severity": "info"}}
    ts = max(at_ms, opened["updated_at"])
    where = f" / {opened['vertex_name']}" if opened.get("vertex_name") else ""
    resolved = {**opened, "event": "resolved", "updated_at": ts, "resolved_at": ts, "forecast": None, "forecasts": [],
                "summary": f"[resolved] suspected {opened['family'].replace('_', ' ')} in {opened['job_name']}{where}: "
                           f"not confirmed, {why} within {held.guard}",
                "labels": {**opened["labels"], "event": "resolved"}, "resolution": UNCONFIRMED}
    return [opened, resolved]


def incident_labels(family: str, record: dict, open_: OpenIncident, severity: str, kind: str) -> dict:
    """Routing labels: all but ``severity`` and ``event`` name the incident's alert (its identity in
    Alertmanager: an alertname per family, the cluster, the job and the vertex), so an incident's
    opened, updated and resolved events are one alert; ``severity`` routes it, ``event`` is kept
    for consumers of contract v1 that read it."""
    return {"alertname": ALERTNAMES[family], "cluster": record["cluster"], "job_name": record.get("job_name") or "",
            "job_id": record["job_id"], "vertex_id": open_.vertex_id or "",
            "vertex": open_.vertex_name or "", "family": family, "severity": severity, "event": kind}


def incident_time(open_: OpenIncident, ts: int) -> int:
    """An incident event's time: the row's, but never before the incident opened or its last event.
    A job's rows arrive up to the allowed lateness out of event-time order (checkpoints carry the
    JobManager's clock, status polls the collector's), and an alert must not end before it starts."""
    last = open_.last_event or {}
    return max(ts, open_.opened_at, last.get("updated_at") or ts)


def incident_event(kind: str, open_: OpenIncident, recent_values: list, record: dict, forecast: dict | None,
                   severity: str) -> dict:
    """The ``kind`` event of the open incident at ``record`` (``recent_values``: its entity's last
    evidence values); an opened or updated one becomes the incident's last event."""
    family = record["family"]
    ts = incident_time(open_, int(record["ts"]))
    open_.model = {"name": record.get("model_name") or open_.model.get("name", ""),
                   "version": record.get("model_version") or open_.model.get("version"),
                   "alias": record.get("model_alias") or open_.model.get("alias")}
    recent = {f"recent_{RECENT_COLUMNS[family]}": recent_values} if family in RECENT_COLUMNS else {}
    recent.update(recent_failure(family, record))
    if kind == "resolved":
        summary = f"[resolved] {family.replace('_', ' ')} in {record.get('job_name')}" + (
            f" / {open_.vertex_name}" if open_.vertex_name else "") + (
            " (the job ended)" if record.get("job_state") in TERMINAL_STATES else " has cleared")
    else:
        open_.summary_base = summary_base(cause_sentence(family, record, forecast, severity))
        summary = summary_with_symptoms(open_, severity, open_.summary_base)
    event = {
        "schema_version": SCHEMA_VERSION,
        "incident_id": open_.id,
        "event": kind,
        "family": family,
        "severity": severity,
        "cluster": record["cluster"],
        "job_id": record["job_id"],
        "job_name": record.get("job_name") or "",
        "vertex_id": open_.vertex_id,
        "vertex_name": open_.vertex_name,
        "subtask_index": open_.subtask_index,
        "score": min(1.0, max(0.0, float(record["score"]))),
        "model": open_.model,
        "opened_at": open_.opened_at,
        "updated_at": ts,
        "resolved_at": ts if kind == "resolved" else None,
        "summary": summary,
        "evidence": ev.evidence(family, record, recent),
        "forecast": forecast,
        "forecasts": (record.get("forecasts") or []) if kind != "resolved" else [],
        "runbook": ev.runbook(family, record),
        "labels": incident_labels(family, record, open_, severity, kind),
    }
    if open_.symptoms:
        event["symptoms"] = public_symptoms(open_)
    warns = timeout_forecast_in(event["forecasts"], TIMEOUT_METRICS) is not None
    if kind != "resolved" and open_.warned_at is None and warns:
        open_.warned_at = ts
    event.update(prediction_fields(open_))
    if kind != "resolved":
        open_.last_event = event
    return event


def prediction_fields(open_: OpenIncident) -> dict:
    """``predicted`` on an incident opened on a forecast; once a checkpoint failed while it was
    open, ``first_failure_at`` and ``lead_time_ms`` (from its first warning that checkpoints would
    fail; null: it gave none), the failure then marked told."""
    fields: dict[str, Any] = {"predicted": True} if open_.predicted else {}
    failed = open_.first_failure_at
    if failed is not None:
        open_.failure_told = True
        warned = open_.warned_at
        fields.update(first_failure_at=failed, lead_time_ms=None if warned is None else max(0, failed - warned))
    return fields
