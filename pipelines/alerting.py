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
  ``alert.resend_interval_s`` (a restarted Alertmanager has it back within one interval) with
  ``endsAt`` ``alert.open_alert_ttl_s`` ahead: long enough that a relay down for an hour does not
  make on-call read a firing incident as resolved, and an alert whose relay is gone for good still
  ends by itself. A resolved incident is sent once more with ``endsAt`` = ``resolved_at``.
- **Nothing dropped.** Offsets are committed to the consumer group only after an Alertmanager
  accepted the alerts; while none answers (connection errors, 5xx), the relay retries with backoff
  and reads nothing new. On start it rebuilds the open incidents from the topic (events before the
  committed offsets change its book without being sent again), then sends what was not delivered
  and every open alert.
- **Poison isolated.** One alert Alertmanager cannot take must not hold back the others. Each alert
  is checked before it is sent (:func:`check_alert`): what has one right fix is fixed and logged
  (an end before the start ends at the start; invalid UTF-8 replaced; an over-long value shortened
  with a hash of the whole), what has none is rejected. When Alertmanager still answers a batch
  with 400 (or 422), the batch is split in halves until the alerts it refuses are alone; those are
  rejected, the rest delivered, and the offsets move on. Every rejection is logged with the
  incident id and the reason and counted in ``..._alert_relay_rejected_total{reason}``.
- **HA.** Every URL gets every alert (members of an Alertmanager cluster deduplicate by labels);
  one acceptance is a delivery, as for Prometheus. Two relays are safe side by side for the same
  reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterable, Sequence

from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pipelines import telemetry
from pipelines.config import HttpClientSecurity, SentinelConfig
from pipelines.contracts import SEVERITIES
from pipelines.errors import SetupError
from pipelines.families import ALERTNAMES, FAMILIES
from pipelines.families.base import eta_text, limit_text
from pipelines.io import http_security, kafka_clients
from pipelines.reports.incident_view import page_file, soonest_forecast

log = logging.getLogger(__name__)

NOT_IDENTITY = {"event"}  # incident labels that are not part of the alert's identity
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")  # Prometheus's, which Alertmanager enforces
MAX_LABEL_VALUE_CHARS = 1024  # identity and routing, not content: a Flink SQL operator name can be far longer
MAX_ANNOTATION_CHARS = 16384
REFUSED_STATUSES = (400, 422)  # Alertmanager refuses the content: another try would be refused again
# Why an incident event did not become an alert (the ``reason`` of the rejected counter).
UNREADABLE = "unreadable_incident"  # not an incident event the relay can turn into an alert
INVALID_LABEL_NAME = "invalid_label_name"
INVALID_ANNOTATION_NAME = "invalid_annotation_name"
INVALID_TIME = "invalid_time"
REFUSED = "refused_by_alertmanager"
REJECT_REASONS = (UNREADABLE, INVALID_LABEL_NAME, INVALID_ANNOTATION_NAME, INVALID_TIME, REFUSED)


class AlertmanagerUnavailable(SetupError, RuntimeError):
    """No Alertmanager accepted the alerts; the message says which failed and why."""


class AlertsRefused(RuntimeError):
    """No Alertmanager accepted the alerts and at least one refused their content (HTTP 400/422)."""


class _OpenIncidents(Collector):
    """``checkpoint_sentinel_open_incidents{family, severity}``, counted from the relay's book when
    read. The relay rebuilds the book from the incident topic on start, so the count survives its
    restarts (the detection job's open incidents live in its executors' state, not its driver)."""

    def __init__(self, incidents: Callable[[], Iterable[dict]]):
        self.incidents = incidents

    def describe(self):
        return [GaugeMetricFamily(f"{telemetry.PREFIX}_open_incidents", "")]

    def collect(self):
        # Every family and severity from the start: a panel or rule sees 0, not no data.
        counts = {(family, severity): 0 for family in FAMILIES for severity in SEVERITIES}
        for incident in list(self.incidents()):
            key = (incident.get("family"), incident.get("severity"))
            counts[key] = counts.get(key, 0) + 1
        gauge = GaugeMetricFamily(f"{telemetry.PREFIX}_open_incidents", "Incidents open now, by family and "
                                  "severity, as the incident topic says", labels=["family", "severity"])
        for (family, severity), count in sorted(counts.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            gauge.add_metric([str(family), str(severity)], count)
        return [gauge]


class RelayMetrics:
    """What ``sentinel alert`` reports on ``/metrics`` (scrape job ``checkpoint-sentinel-alert``);
    ``open_incidents`` gives the incidents open now (the relay's book)."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 open_incidents: Callable[[], Iterable[dict]] = lambda: ()):
        self.registry = registry or telemetry.part_registry("alert")
        r, prefix = self.registry, f"{telemetry.PREFIX}_alert_relay"
        self.delivered = Counter(f"{prefix}_delivered", "Alerts an Alertmanager accepted", registry=r)
        self.rejected = Counter(f"{prefix}_rejected", "Incident events that did not become an alert: unreadable, "
                                "invalid with no single right fix, or refused by Alertmanager", ["reason"], registry=r)
        self.retries = Counter(f"{prefix}_retries", "Posts retried because no Alertmanager answered (connection "
                               "error, timeout, 5xx)", registry=r)
        self.last_success = Gauge(f"{prefix}_last_success_timestamp_seconds",
                                  "When the relay last was in step with an Alertmanager: a batch taken (or its "
                                  "poison rejected), or, with nothing to send, a readiness check answered",
                                  registry=r)
        for reason in REJECT_REASONS:  # present from the start, so a rule's increase() sees the first one
            self.rejected.labels(reason)
        self.registry.register(_OpenIncidents(open_incidents))


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


@dataclass(frozen=True)
class CheckedAlert:
    """An alert as it will be sent (``None`` when rejected), what was fixed in it, and why it was
    rejected."""

    alert: dict | None
    fixes: tuple[str, ...] = ()
    reason: str | None = None
    detail: str = ""


def _valid_utf8(value: str) -> str:
    """``value`` with lone surrogates (what JSON's ``\\ud800`` escapes decode to) replaced by U+FFFD,
    as Alertmanager's JSON decoder would."""
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)


def _shortened(value: str, limit: int) -> str:
    """At most ``limit`` characters, the whole value's hash at the end so two long values stay apart."""
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return value[:limit - len(digest) - 1] + "\u2026" + digest


def _sane(value: str, limit: int, what: str, fixes: list[str]) -> str:
    fixed = _valid_utf8(value)
    if fixed != value:
        fixes.append(f"{what} was not valid UTF-8 (replaced with U+FFFD)")
    if len(fixed) > limit:
        fixes.append(f"{what} had {len(fixed)} characters (shortened to {limit})")
        fixed = _shortened(fixed, limit)
    return fixed


def _parse_time(text) -> datetime:
    return datetime.fromisoformat(str(text).replace("Z", "+00:00"))


def check_alert(alert: dict) -> CheckedAlert:
    """The alert Alertmanager's v2 API will take, or why there is none: label and annotation names
    as Prometheus's, values valid UTF-8 of sane length, annotations strings, and ``startsAt <=
    endsAt`` (an end before the start, as a resolve stamped before the open, ends at the start)."""
    fixes: list[str] = []
    bad = sorted(str(name) for name in alert.get("labels", {}) if not LABEL_NAME.match(str(name)))
    if bad:
        return CheckedAlert(None, (), INVALID_LABEL_NAME, f"label names {bad!r} are not [a-zA-Z_][a-zA-Z0-9_]*")
    if not alert.get("labels"):
        return CheckedAlert(None, (), INVALID_LABEL_NAME, "no labels")
    bad = sorted(str(name) for name in alert.get("annotations", {}) if not LABEL_NAME.match(str(name)))
    if bad:
        return CheckedAlert(None, (), INVALID_ANNOTATION_NAME,
                            f"annotation names {bad!r} are not [a-zA-Z_][a-zA-Z0-9_]*")
    labels = {name: _sane(str(value), MAX_LABEL_VALUE_CHARS, f"label {name}", fixes)
              for name, value in alert["labels"].items()}
    annotations = {}
    for name, value in alert.get("annotations", {}).items():
        if value is None:
            continue
        if not isinstance(value, str):
            fixes.append(f"annotation {name} was not a string (sent as JSON)")
            value = json.dumps(value, sort_keys=True, default=str)
        annotations[name] = _sane(value, MAX_ANNOTATION_CHARS, f"annotation {name}", fixes)
    try:
        starts, ends = _parse_time(alert["startsAt"]), _parse_time(alert["endsAt"])
    except (KeyError, ValueError) as exc:
        return CheckedAlert(None, (), INVALID_TIME, f"startsAt/endsAt unreadable ({exc})")
    fixed = {**alert, "labels": labels, "annotations": annotations}
    if ends < starts:
        fixes.append(f"endsAt {alert['endsAt']} was before startsAt {alert['startsAt']} (ends at startsAt)")
        fixed["endsAt"] = alert["startsAt"]
    return CheckedAlert(fixed, tuple(fixes))


def _incident_of(alert: dict) -> str:
    return str(alert.get("annotations", {}).get("incident_id", "?"))


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
            # The old severity's alert ends where the new one starts (see the module's doc).
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


class Alertmanagers:
    """Alertmanager's v2 API at one or more URLs (an HA pair gets every alert)."""

    def __init__(self, urls: Sequence[str], timeout_s: float = 10.0, security: HttpClientSecurity | None = None):
        if not urls:
            raise ValueError("no Alertmanager URL: pass --alertmanager URL (repeatable) or set "
                             "alert.alertmanager_urls (SENTINEL_ALERT__ALERTMANAGER_URLS)")
        self.urls = [url.rstrip("/") for url in urls]
        self.timeout_s = timeout_s
        self.security = security or HttpClientSecurity()
        # Made once: a context loads its CA and certificate files when built.
        self._tls = http_security.ssl_context(self.security, "alert") \
            if any(url.startswith("https:") for url in self.urls) else None

    def _request(self, url: str, data: bytes | None = None) -> bytes:
        # The credentials are read for each request: a rotated password file is used at once.
        headers = {"Content-Type": "application/json", **http_security.authorization(self.security, "alert")}
        request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET", headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout_s,
                                    context=self._tls if url.startswith("https:") else None) as response:
            return response.read()

    def _problem(self, exc: BaseException) -> str:
        """What went wrong, and for a refusal of this client's TLS or credentials, what to set."""
        status = exc.code if isinstance(exc, urllib.error.HTTPError) else None
        # A TLS alert read after the handshake comes as a bare SSLError, whose reason is a code.
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        said = f"HTTP {status}" if status is not None else str(reason)
        hint = http_security.refusal_hint(f"{reason} {getattr(reason, 'reason', '')}", status, self.security, "alert")
        return f"{said}: {hint}" if hint else said

    def check_reachable(self) -> None:
        """Fail when no URL answers Alertmanager's readiness endpoint (a wrong URL is a config error)."""
        problems = {}
        for url in self.urls:
            try:
                self._request(f"{url}/-/ready")
                return
            except (urllib.error.URLError, OSError) as exc:
                problems[url] = self._problem(exc)
        raise AlertmanagerUnavailable(
            "no Alertmanager is reachable (" + "; ".join(f"{u}: {p}" for u, p in problems.items()) + "). Check "
            "--alertmanager / alert.alertmanager_urls (the base URL, e.g. http://alertmanager:9093) and that it runs.")

    def post(self, alerts: Sequence[dict]) -> list[str]:
        """Post ``alerts`` to every URL; the URLs that accepted them. Raises :class:`AlertsRefused`
        when none accepted and one refused their content (400, 422), :class:`AlertmanagerUnavailable`
        when none answered (connection errors, timeouts, any other status)."""
        if not alerts:
            return list(self.urls)
        body = json.dumps(list(alerts)).encode()
        accepted, refused, problems = [], {}, {}
        for url in self.urls:
            try:
                self._request(f"{url}/api/v2/alerts", body)
                accepted.append(url)
            except urllib.error.HTTPError as exc:
                problem = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace').strip()}"
                if exc.code in (401, 403):  # retried: a rotated secret may fix it, and nothing is dropped
                    problem = self._problem(exc)
                (refused if exc.code in REFUSED_STATUSES else problems)[url] = problem
            except (urllib.error.URLError, OSError) as exc:
                problems[url] = self._problem(exc)
        for url, problem in {**refused, **problems}.items():
            log.warning("Alertmanager %s did not take %d alert(s): %s", url, len(alerts), problem)
        if not accepted:
            described = "; ".join(f"{u}: {p}" for u, p in {**refused, **problems}.items())
            if refused:
                raise AlertsRefused(described)
            raise AlertmanagerUnavailable("no Alertmanager accepted the alerts: " + described)
        return accepted


@dataclass
class RelayStats:
    events: int = 0
    posts: int = 0
    alerts_sent: int = 0
    failed_tries: int = 0
    rejected: int = 0
    fixed: int = 0


class AlertRelay:
    """Consumes the incident topic and keeps Alertmanager in step with it (see the module's doc)."""

    def __init__(self, config: SentinelConfig, urls: Sequence[str] | None = None,
                 clock: Callable[[], float] = time.time):
        self.config = config
        settings = config.alert
        if settings.open_alert_ttl_s <= 2 * settings.resend_interval_s:
            raise ValueError(f"alert.open_alert_ttl_s ({settings.open_alert_ttl_s:g}s) must be more than twice the "
                             f"resend interval ({settings.resend_interval_s:g}s): an open alert would end between "
                             "two re-sends")
        self.alertmanagers = Alertmanagers(list(urls or settings.alertmanager_urls), settings.request_timeout_s,
                                           settings.security)
        self.book = AlertBook(settings.open_alert_ttl_s, settings.incident_url)
        self.clock = clock
        self.stats = RelayStats()
        self.metrics = RelayMetrics(open_incidents=lambda: self.book.open.values())
        self.metrics_server: telemetry.MetricsServer | None = None
        self._consumer = None
        self._tps: list[TopicPartition] = []

    def serve_metrics(self) -> telemetry.MetricsServer | None:
        """Serve ``/metrics`` at alert.metrics_host:metrics_port (None when the port is null)."""
        settings = self.config.alert
        if self.metrics_server is None and settings.metrics_port is not None:
            self.metrics_server = telemetry.serve(self.metrics.registry, settings.metrics_host, settings.metrics_port)
        return self.metrics_server

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
        incident = None
        try:
            incident = json.loads(record.value)
            alerts = self.book.apply(incident, self._now_ms())
        except (ValueError, KeyError, TypeError, OverflowError, OSError, RecursionError) as exc:
            # Not an incident event this relay can read: the detection job owns the topic's contract.
            if deliver:  # logged and counted once: a restart's rebuild reads it again
                incident_id = incident.get("incident_id", "?") if isinstance(incident, dict) else "?"
                log.error("rejected %s[%d]@%d (incident %s, reason %s): not an incident event this relay can "
                          "read (%s: %s)", record.topic, record.partition, record.offset, incident_id, UNREADABLE,
                          type(exc).__name__, str(exc)[:300])
                self._rejected(UNREADABLE)
            return []
        self.stats.events += 1
        sendable = []
        for alert in alerts:
            checked = check_alert(alert)
            if checked.alert is not None:
                sendable.append(alert)
                if checked.fixes and deliver:
                    self.stats.fixed += 1
                    log.warning("fixed the alert of incident %s: %s", _incident_of(alert), "; ".join(checked.fixes))
                continue
            if _incident_of(alert) == str(incident["incident_id"]):
                self.book.open.pop(incident["incident_id"], None)  # never re-sent: it would be rejected again
            if deliver:
                log.error("rejected the alert of incident %s (reason %s): %s", _incident_of(alert), checked.reason,
                          checked.detail)
                self._rejected(checked.reason)
        return sendable if deliver else []

    def _rejected(self, reason: str, count: int = 1) -> None:
        self.stats.rejected += count
        self.metrics.rejected.labels(reason).inc(count)

    def _checked(self, alerts: list[dict]) -> list[dict]:
        """The alerts as :func:`check_alert` fixes them (their incident's event was checked, logged
        and counted when it was read: a re-send fixes silently)."""
        sendable = []
        for alert in alerts:
            checked = check_alert(alert)
            if checked.alert is None:  # unreachable for alerts that passed when read; never sent unchecked
                log.error("rejected the alert of incident %s (reason %s): %s", _incident_of(alert), checked.reason,
                          checked.detail)
                self._rejected(checked.reason)
                continue
            sendable.append(checked.alert)
        return sendable

    def _post(self, alerts: list[dict], stop: threading.Event) -> tuple[bool | None, str]:
        """Post until an Alertmanager answers: (True, "") when one took the alerts, (False, why) when
        they were refused, (None, "") when ``stop`` came first. Backoff doubles up to alert.max_backoff_s."""
        backoff = 0.5
        while not stop.is_set():
            try:
                self.alertmanagers.post(alerts)
                self.stats.posts += 1
                return True, ""
            except AlertsRefused as exc:
                self.stats.posts += 1
                return False, str(exc)
            except AlertmanagerUnavailable as exc:
                self.stats.failed_tries += 1
                self.metrics.retries.inc()
                log.warning("%s; retrying in %.1fs", exc, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, self.config.alert.max_backoff_s)
        return None, ""

    def deliver(self, alerts: list[dict], stop: threading.Event) -> bool:
        """Every alert (as given: see :func:`check_alert`) taken by an Alertmanager or, when refused,
        isolated by halving the batch and rejected; False when ``stop`` came first (nothing may be
        committed then)."""
        if not alerts:
            return True
        taken, refusal = self._post(alerts, stop)
        if taken is None:
            return False
        if taken:
            self.stats.alerts_sent += len(alerts)
            self.metrics.delivered.inc(len(alerts))
            return True
        if len(alerts) == 1:
            log.error("rejected the alert of incident %s (reason %s): %s; labels %s, startsAt %s, endsAt %s",
                      _incident_of(alerts[0]), REFUSED, refusal, alerts[0]["labels"], alerts[0].get("startsAt"),
                      alerts[0].get("endsAt"))
            self._rejected(REFUSED)
            return True
        # Alertmanager keeps a batch's valid alerts and answers 400 for the rest; the halves find them.
        half = len(alerts) // 2
        return self.deliver(alerts[:half], stop) and self.deliver(alerts[half:], stop)

    def _in_step(self) -> None:
        self.metrics.last_success.set(self.clock())

    def _check_in(self) -> None:
        """With nothing to send: is an Alertmanager still there (keeps the last-success time honest)?"""
        try:
            self.alertmanagers.check_reachable()
            self._in_step()
        except AlertmanagerUnavailable as exc:
            log.warning("%s", exc)

    def _commit(self) -> None:
        offsets = {tp: OffsetAndMetadata(self._consumer.position(tp), "", -1) for tp in self._tps}
        self._consumer.commit(offsets)

    def run(self, stop: threading.Event | None = None, started: Callable[[], None] | None = None) -> RelayStats:
        """Relay until ``stop`` is set; ``started`` is called once Alertmanager answered, /metrics is
        served and the book is rebuilt."""
        stop = stop or threading.Event()
        self.alertmanagers.check_reachable()
        self.serve_metrics()
        self._in_step()
        try:
            self._connect()
            if started is not None:
                started()
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
                    if not pending and not records:
                        self._check_in()
                if pending or records:
                    alerts = self._checked(_collapse(pending))
                    if not self.deliver(alerts, stop):
                        break  # stopped before delivery: nothing committed, the next start sends it
                    if alerts:
                        self._in_step()
                    pending = []
                    self._commit()
        finally:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
            if self.metrics_server is not None:
                self.metrics_server.close()
                self.metrics_server = None
        return self.stats
