"""`sentinel alert`: the incident topic delivered to Alertmanager, one alert per incident.

How an incident becomes an alert, and why:

- **Identity.** An alert is its label set: an incident's ``labels`` without ``event`` (``alertname``
  per family, ``cluster``, ``job_name``, ``job_id``, ``vertex_id``, ``vertex``, ``family``,
  ``severity``). Its opened, updated and resolved events are one alert, and two vertices of a job
  are two alerts.
- **Severity** is a label, as in Prometheus rules, so Alertmanager can route on it. When an
  incident's severity changes, the alert at the old severity ends and the one at the new severity
  starts, which is what a pair of Prometheus rules (warning, critical) on one condition does; the
  incident is never shown twice at once.
- **Time.** ``startsAt`` is the incident's ``opened_at``. An open alert is re-sent every
  ``alert.resend_interval_s`` with ``endsAt`` four intervals ahead (Prometheus's convention), so a
  restarted Alertmanager has it back within one interval and an alert whose relay died ends by
  itself; a resolved incident is sent once more with ``endsAt`` = ``resolved_at``.
- **Nothing dropped.** Offsets are committed to the consumer group only after an Alertmanager
  accepted the alerts; while none does, the relay retries with backoff and reads nothing new. On
  start it rebuilds the open incidents from the topic (events before the committed offsets change
  its book without being sent again), then sends what was not delivered and every open alert.
- **HA.** Every URL gets every alert (members of an Alertmanager cluster deduplicate by labels);
  one acceptance is a delivery, as for Prometheus. Two relays are safe side by side for the same
  reason.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Sequence

from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from pipelines.config import SentinelConfig
from pipelines.families import ALERTNAMES
from pipelines.io import kafka_clients

log = logging.getLogger(__name__)

ENDS_AFTER_RESENDS = 4  # an open alert ends by itself if this many re-sends are missed
NOT_IDENTITY = {"event"}  # incident labels that are not part of the alert's identity


class AlertmanagerUnavailable(RuntimeError):
    """No Alertmanager accepted the alerts; the message says which failed and why."""


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
    if incident.get("symptoms"):
        annotations["symptoms"] = ", ".join(s["family"] for s in incident["symptoms"])
    if incident_url:
        annotations["incident_url"] = incident_url.format(incident_id=incident["incident_id"])
    alert = {"labels": alert_labels(incident), "annotations": annotations,
             "startsAt": _iso(incident["opened_at"]), "endsAt": _iso(ends_at_ms)}
    if incident_url:
        alert["generatorURL"] = annotations["incident_url"]
    return alert


@dataclass
class AlertBook:
    """The open incidents by id, and the alerts each incident event means."""

    resend_interval_s: float
    incident_url: str | None = None
    open: dict[str, dict] = field(default_factory=dict)

    def _open_until(self, now_ms: int) -> int:
        return now_ms + int(ENDS_AFTER_RESENDS * self.resend_interval_s * 1000)

    def apply(self, incident: dict, now_ms: int) -> list[dict]:
        """Record one incident event; the alerts to send for it (none for an event out of order)."""
        incident_id = incident["incident_id"]
        previous = self.open.get(incident_id)
        alerts = []
        if previous is not None and previous["severity"] != incident["severity"]:
            # The old severity's alert ends where the new one starts (see the module's doc).
            alerts.append(to_alert(previous, incident["updated_at"], self.incident_url))
        if incident["event"] == "resolved":
            self.open.pop(incident_id, None)
            alerts.append(to_alert(incident, incident.get("resolved_at") or incident["updated_at"], self.incident_url))
        else:
            self.open[incident_id] = incident
            alerts.append(to_alert(incident, self._open_until(now_ms), self.incident_url))
        return alerts

    def open_alerts(self, now_ms: int) -> list[dict]:
        return [to_alert(incident, self._open_until(now_ms), self.incident_url) for incident in self.open.values()]


def _collapse(alerts: Sequence[dict]) -> list[dict]:
    """The last alert of each label set: a backlog sends each alert's final state once."""
    last: dict[tuple, dict] = {}
    for alert in alerts:
        last[tuple(sorted(alert["labels"].items()))] = alert
    return list(last.values())


class Alertmanagers:
    """Alertmanager's v2 API at one or more URLs (an HA pair gets every alert)."""

    def __init__(self, urls: Sequence[str], timeout_s: float = 10.0):
        if not urls:
            raise ValueError("no Alertmanager URL: pass --alertmanager URL (repeatable) or set "
                             "alert.alertmanager_urls (SENTINEL_ALERT__ALERTMANAGER_URLS)")
        self.urls = [url.rstrip("/") for url in urls]
        self.timeout_s = timeout_s

    def _request(self, url: str, data: bytes | None = None) -> bytes:
        request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return response.read()

    def check_reachable(self) -> None:
        """Fail when no URL answers Alertmanager's readiness endpoint (a wrong URL is a config error)."""
        problems = {}
        for url in self.urls:
            try:
                self._request(f"{url}/-/ready")
                return
            except (urllib.error.URLError, OSError) as exc:
                problems[url] = str(getattr(exc, "reason", exc))
        raise AlertmanagerUnavailable(
            "no Alertmanager is reachable (" + "; ".join(f"{u}: {p}" for u, p in problems.items()) + "). Check "
            "--alertmanager / alert.alertmanager_urls (the base URL, e.g. http://alertmanager:9093) and that it runs.")

    def post(self, alerts: Sequence[dict]) -> list[str]:
        """Post ``alerts`` to every URL; the URLs that accepted them. Raises when none did."""
        if not alerts:
            return list(self.urls)
        body = json.dumps(list(alerts)).encode()
        accepted, problems = [], {}
        for url in self.urls:
            try:
                self._request(f"{url}/api/v2/alerts", body)
                accepted.append(url)
            except urllib.error.HTTPError as exc:
                problems[url] = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
            except (urllib.error.URLError, OSError) as exc:
                problems[url] = str(getattr(exc, "reason", exc))
        for url, problem in problems.items():
            log.warning("Alertmanager %s did not take %d alert(s): %s", url, len(alerts), problem)
        if not accepted:
            raise AlertmanagerUnavailable("no Alertmanager accepted the alerts: " +
                                          "; ".join(f"{u}: {p}" for u, p in problems.items()))
        return accepted


@dataclass
class RelayStats:
    events: int = 0
    posts: int = 0
    alerts_sent: int = 0
    failed_tries: int = 0


class AlertRelay:
    """Consumes the incident topic and keeps Alertmanager in step with it (see the module's doc)."""

    def __init__(self, config: SentinelConfig, urls: Sequence[str] | None = None,
                 clock: Callable[[], float] = time.time):
        self.config = config
        settings = config.alert
        self.alertmanagers = Alertmanagers(list(urls or settings.alertmanager_urls), settings.request_timeout_s)
        self.book = AlertBook(settings.resend_interval_s, settings.incident_url)
        self.clock = clock
        self.stats = RelayStats()
        self._consumer = None
        self._tps: list[TopicPartition] = []

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _connect(self) -> dict[TopicPartition, int]:
        """Assign every partition; rebuild the book up to the committed offsets; the committed offsets."""
        kafka, topic = self.config.kafka, self.config.topics.incidents
        kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)
        consumer = kafka_clients.make_consumer(kafka.bootstrap_servers, kafka.client_kwargs(),
                                               group_id=self.config.alert.group_id, enable_auto_commit=False)
        partitions = kafka_clients.partitions_of(consumer, topic, kafka.connect_timeout_s)
        earliest = kafka_clients.earliest_offsets(consumer, topic, partitions)
        self._tps = [TopicPartition(topic, p) for p in partitions]
        committed = {tp: consumer.committed(tp) for tp in self._tps}
        committed = {tp: earliest[tp.partition] if offset is None else offset for tp, offset in committed.items()}
        kafka_clients.assign_from(consumer, topic, earliest)
        self._consumer = consumer
        # Replay what was delivered before: it only rebuilds the book.
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < committed[tp] for tp in self._tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} up to the committed offsets of {self.config.alert.group_id}")
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    tp = TopicPartition(record.topic, record.partition)
                    if record.offset < committed[tp]:
                        self._apply(record, deliver=False)
                    else:
                        consumer.seek(tp, record.offset)  # undelivered: the main loop takes it from here
                        break
        for tp in self._tps:
            consumer.seek(tp, committed[tp])
        return committed

    def _apply(self, record, deliver: bool) -> list[dict]:
        try:
            incident = json.loads(record.value)
            alerts = self.book.apply(incident, self._now_ms())
        except (ValueError, KeyError, TypeError) as exc:
            # Not an incident event this relay can read: the detection job owns the topic's contract.
            log.warning("skipping %s[%d]@%d: not an incident event (%s)", record.topic, record.partition,
                        record.offset, exc)
            return []
        self.stats.events += 1
        return alerts if deliver else []

    def _deliver(self, alerts: list[dict], stop: threading.Event) -> bool:
        """Post until an Alertmanager takes them (or ``stop``); backoff doubles up to alert.max_backoff_s."""
        backoff = 0.5
        while not stop.is_set():
            try:
                self.alertmanagers.post(alerts)
                self.stats.posts += 1
                self.stats.alerts_sent += len(alerts)
                return True
            except AlertmanagerUnavailable as exc:
                self.stats.failed_tries += 1
                log.warning("%s; retrying in %.1fs", exc, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, self.config.alert.max_backoff_s)
        return False

    def _commit(self) -> None:
        offsets = {tp: OffsetAndMetadata(self._consumer.position(tp), "", -1) for tp in self._tps}
        self._consumer.commit(offsets)

    def run(self, stop: threading.Event | None = None) -> RelayStats:
        """Relay until ``stop`` is set."""
        stop = stop or threading.Event()
        self.alertmanagers.check_reachable()
        self._connect()
        try:
            pending: list[dict] = self.book.open_alerts(self._now_ms())  # re-sent at once after a restart
            next_resend = time.monotonic() + self.config.alert.resend_interval_s
            while not stop.is_set():
                batch = self._consumer.poll(timeout_ms=500)
                records = sorted((r for rs in batch.values() for r in rs), key=lambda r: (r.timestamp, r.partition, r.offset))
                for record in records:
                    pending.extend(self._apply(record, deliver=True))
                if time.monotonic() >= next_resend:
                    pending.extend(self.book.open_alerts(self._now_ms()))
                    next_resend = time.monotonic() + self.config.alert.resend_interval_s
                if pending or records:
                    if not self._deliver(_collapse(pending), stop):
                        break  # stopped before delivery: nothing committed, the next start sends it
                    pending = []
                    self._commit()
        finally:
            self._consumer.close(autocommit=False)
        return self.stats
