"""An incident event as the alerts Alertmanager gets: their labels (the alert's identity),
annotations and times, and :class:`AlertBook`, the open incidents whose alerts the relay re-sends.
Why an alert is made so: :mod:`pipelines.alerting.relay`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Sequence

from pipelines.families import ALERTNAMES
from pipelines.families.base import eta_text, limit_text
from pipelines.reports.incident_view import page_file, soonest_forecast

NOT_IDENTITY = {"event"}  # incident labels that are not part of the alert's identity


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alert_labels(incident: dict) -> dict[str, str]:
    """The alert's label set; incidents published before the identity labels existed get them from
    their fields."""
    labels = {k: str(v) for k, v in incident.get("labels", {}).items() if k not in NOT_IDENTITY}
    labels.setdefault("alertname", ALERTNAMES.get(incident["family"], "FlinkIncident"))
    labels.setdefault("cluster", incident["cluster"])
    labels.setdefault("job_name", incident.get("job_name") or "")
    labels.setdefault("job_id", incident["job_id"])
    labels.setdefault("vertex_id", incident.get("vertex_id") or "")
    labels.setdefault("vertex", incident.get("vertex_name") or "")
    labels.setdefault("family", incident["family"])
    labels["severity"] = incident["severity"]
    return {k: v for k, v in labels.items() if v != ""}  # Alertmanager treats an empty label as absent


def to_alert(incident: dict, ends_at_ms: int, incident_url: str | None = None) -> dict:
    annotations = {"summary": incident["summary"], "incident_id": incident["incident_id"],
                   "runbook": "\n".join(f"{i}. {step}" for i, step in enumerate(incident.get("runbook", []), 1)),
                   "score": f"{incident['score']:.2f}"}
    if incident.get("forecast"):
        annotations["forecast"] = json.dumps(incident["forecast"], sort_keys=True)
    forecast = soonest_forecast(incident)
    if forecast and incident.get("event") != "resolved":
        # What a notification template can print as it is, beside the JSON for tools.
        annotations["eta"] = eta_text(forecast)
        annotations["eta_at"] = _iso(incident["updated_at"] + max(int(forecast["eta_ms"]), 0))
        annotations["limit"] = limit_text(forecast)
        annotations["forecasts"] = json.dumps(incident.get("forecasts") or [forecast], sort_keys=True)
    if incident.get("symptoms"):
        annotations["symptoms"] = ", ".join(s["family"] for s in incident["symptoms"])
    if incident_url:
        # The page's own name (the id itself, or a slug and hash of an id that is not URL-safe).
        page = page_file(str(incident["incident_id"])).removesuffix(".html")
        annotations["incident_url"] = incident_url.format(incident_id=page)
    alert = {"labels": alert_labels(incident), "annotations": annotations,
             "startsAt": _iso(incident["opened_at"]), "endsAt": _iso(ends_at_ms)}
    if incident_url:
        alert["generatorURL"] = annotations["incident_url"]
    return alert


@dataclass
class AlertBook:
    """The open incidents by id, and the alerts each incident event means."""

    open_alert_ttl_s: float
    incident_url: str | None = None
    open: dict[str, dict] = field(default_factory=dict)

    def _open_until(self, incident: dict, now_ms: int) -> int:
        # From the later of now and the start: an incident stamped ahead of this clock is still open.
        return max(now_ms, int(incident["opened_at"])) + int(self.open_alert_ttl_s * 1000)

    def apply(self, incident: dict, now_ms: int) -> list[dict]:
        """Record one incident event; the alerts to send for it. Raises (KeyError, TypeError,
        ValueError, OverflowError) for an event it cannot read, and then leaves the book as it was."""
        incident_id = incident["incident_id"]
        previous = self.open.get(incident_id)
        alerts = []
        if previous is not None and previous["severity"] != incident["severity"]:
            # The old severity's alert ends where the new one starts (see pipelines.alerting.relay).
            alerts.append(to_alert(previous, incident["updated_at"], self.incident_url))
        resolved = incident["event"] == "resolved"
        ends_at = (incident.get("resolved_at") or incident["updated_at"]) if resolved else \
            self._open_until(incident, now_ms)
        alerts.append(to_alert(incident, ends_at, self.incident_url))
        if resolved:
            self.open.pop(incident_id, None)
        else:
            self.open[incident_id] = incident
        return alerts

    def open_alerts(self, now_ms: int) -> list[dict]:
        return [to_alert(incident, self._open_until(incident, now_ms), self.incident_url)
                for incident in self.open.values()]


def _collapse(alerts: Sequence[dict]) -> list[dict]:
    """The last alert of each label set: a backlog sends each alert's final state once."""
    last: dict[tuple, dict] = {}
    for alert in alerts:
        last[tuple(sorted(alert["labels"].items()))] = alert
    return list(last.values())


def last_of_each_alert(alerts: Sequence[dict]) -> list[dict]:
    """The last alert of each label set: a backlog sends each alert's final state once."""
    last: dict[tuple, dict] = {}
    for alert in alerts:
        last[tuple(sorted(alert["labels"].items()))] = alert
    return list(last.values())
