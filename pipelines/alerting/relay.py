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
  is checked before it is sent (:func:`~pipelines.alerting.checks.check_alert`): what has one
  right fix is fixed and logged (an end before the start ends at the start; invalid UTF-8
  replaced; an over-long value shortened with a hash of the whole), what has none is rejected.
  When Alertmanager still answers a batch with 400 (or 422), the batch is split in halves until
  the alerts it refuses are alone; those are rejected, the rest delivered, and the offsets move on.
  Every rejection is logged with the incident id and the reason and counted in
  ``..._alert_relay_rejected_total{reason}``.
- **HA.** Every URL gets every alert (members of an Alertmanager cluster deduplicate by labels);
  one acceptance is a delivery, as for Prometheus. Two relays are safe side by side for the same
  reason.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from pipelines import telemetry
from pipelines.alerting.alertmanager import AlertmanagerUnavailable, Alertmanagers, AlertsRefused
from pipelines.alerting.alerts import AlertBook, last_of_each_alert
from pipelines.alerting.checks import REFUSED, UNREADABLE, check_alert, incident_of
from pipelines.alerting.metrics import RelayMetrics
from pipelines.config import SentinelConfig
from pipelines.io import kafka_clients

log = logging.getLogger(__name__)


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
                    log.warning("fixed the alert of incident %s: %s", incident_of(alert), "; ".join(checked.fixes))
                continue
            if incident_of(alert) == str(incident["incident_id"]):
                self.book.open.pop(incident["incident_id"], None)  # never re-sent: it would be rejected again
            if deliver:
                log.error("rejected the alert of incident %s (reason %s): %s", incident_of(alert), checked.reason,
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
                log.error("rejected the alert of incident %s (reason %s): %s", incident_of(alert), checked.reason,
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
                      incident_of(alerts[0]), REFUSED, refusal, alerts[0]["labels"], alerts[0].get("startsAt"),
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
                    alerts = self._checked(last_of_each_alert(pending))
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
