"""`sentinel alert` against a real Alertmanager (Debian's prometheus-alertmanager) and the real broker.

Alertmanager runs with the shipped ``infra/alertmanager/alertmanager.yml``, its receivers pointed at
a webhook in this test, so what on-call would be paged with is what the test reads.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pipelines.alerting import AlertRelay, alert_labels
from tests.helpers.alert_relay import committed_offsets, end_offsets
from tests.helpers.alertmanager import SHIPPED_CONFIG, alertmanager_binary, of_incident
from tests.helpers.incidents import skew_incident
from tests.helpers.metrics import sample_key, scrape, totals
from tests.helpers.topics import publish_incidents
from tests.helpers.waiting import wait_for

POLL_S = 0.2  # Alertmanager and the relay answer at once: a test waits no longer than it must


class RunningRelay:
    def __init__(self, config, urls):
        config.alert.metrics_port = 0  # any free port: tests run side by side
        self.relay = AlertRelay(config, urls)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.relay.run(self.stop_event)
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def stop(self):
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive() and self.error is None, self.error


def test_an_incident_opened_escalated_and_resolved_is_one_alert_active_then_resolved(config, alertmanager):
    config.alert.resend_interval_s = 1.0
    opened, escalated, resolved = skew_incident()
    relay = RunningRelay(config, [alertmanager.url])
    try:
        publish_incidents(config.kafka, config.topics.incidents, [opened])
        (alert,) = wait_for(lambda: of_incident(alertmanager.alerts(), opened), every_s=POLL_S, what="the opened alert")
        assert alert["labels"] == {"alertname": "FlinkSkew", "cluster": "c", "job_name": "orders", "job_id": "j1",
                                   "vertex_id": "v1", "vertex": "Window", "family": "skew", "severity": "warning"}
        assert alert["startsAt"].startswith("1970-01-01T00:01:00")  # opened_at, event time
        assert alert["annotations"]["summary"] == opened["summary"]
        assert alert["annotations"]["runbook"].startswith("1. ")
        assert alert["status"]["state"] == "active"

        publish_incidents(config.kafka, config.topics.incidents, [escalated])
        wait_for(lambda: [a["labels"]["severity"] for a in of_incident(alertmanager.alerts(), opened)] == ["critical"], every_s=POLL_S,
                 what="the escalated alert, alone")
        wait_for(lambda: ("firing", "critical") in alertmanager.webhook.statuses("FlinkSkew"), every_s=POLL_S,
                 what="on-call paged with the critical alert")

        publish_incidents(config.kafka, config.topics.incidents, [resolved])
        wait_for(lambda: of_incident(alertmanager.alerts(), opened) == [], every_s=POLL_S, what="the alert to end")
        # On-call was paged for the warning, then the critical, and told when each ended.
        statuses = wait_for(lambda: (s := alertmanager.webhook.statuses("FlinkSkew"))
                            and ("resolved", "critical") in s and s, every_s=POLL_S, what="the resolved notification")
        assert statuses[0] == ("firing", "warning")
        assert ("firing", "critical") in statuses and ("resolved", "warning") in statuses
        assert statuses.index(("firing", "critical")) < statuses.index(("resolved", "critical"))
    finally:
        relay.stop()
    assert relay.relay.stats.events == 3 and relay.relay.stats.failed_tries == 0


def test_alerts_survive_an_alertmanager_outage_and_a_relay_restart(config, alertmanager):
    config.alert.resend_interval_s = 1.0
    first, _, first_resolved = skew_incident(job="j1")
    second, _, _ = skew_incident(job="j2")
    relay = RunningRelay(config, [alertmanager.url])
    try:
        publish_incidents(config.kafka, config.topics.incidents, [first])
        wait_for(lambda: of_incident(alertmanager.alerts(), first), every_s=POLL_S, what="the first alert")
        # Alertmanager goes away (and forgets every alert: they are not persisted) ...
        alertmanager.stop()
        publish_incidents(config.kafka, config.topics.incidents, [second])
        wait_for(lambda: relay.relay.stats.failed_tries >= 2, every_s=POLL_S, what="the relay to retry")
        # ... and comes back: the undelivered alert arrives, the open one is re-sent.
        alertmanager.start()
        wait_for(lambda: of_incident(alertmanager.alerts(), first) and of_incident(alertmanager.alerts(), second), every_s=POLL_S,
                 what="both alerts after the restart")
    finally:
        relay.stop()

    # While no relay runs, the first incident resolves; a new relay (same consumer group) delivers
    # that, keeps the second one alive, and sends nothing twice that was delivered before.
    publish_incidents(config.kafka, config.topics.incidents, [first_resolved])
    relay = RunningRelay(config, [alertmanager.url])
    try:
        wait_for(lambda: not of_incident(alertmanager.alerts(), first), every_s=POLL_S, what="the first alert to end")
        (still_open,) = of_incident(alertmanager.alerts(), second)
        assert alert_labels(second) == still_open["labels"]
        wait_for(lambda: relay.relay.stats.posts >= 2, every_s=POLL_S, what="a re-send")
    finally:
        relay.stop()
    assert relay.relay.stats.events == 3  # two rebuilt from the topic, one delivered
    assert of_incident(alertmanager.alerts(), second)


def test_an_unreachable_alertmanager_stops_the_command_with_what_to_fix(config, tmp_path):
    from tests.helpers.cli import run_sentinel

    result = run_sentinel("alert", "--alertmanager", "http://127.0.0.1:9", env={
        "SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "SENTINEL_TOPICS__INCIDENTS": config.topics.incidents, "SENTINEL_ALERT__METRICS_PORT": "0"}, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no Alertmanager is reachable (http://127.0.0.1:9:" in result.stderr
    assert "--alertmanager" in result.stderr


def test_the_shipped_alertmanager_config_is_valid():
    checked = subprocess.run([alertmanager_binary("amtool"), "check-config", str(SHIPPED_CONFIG)], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout and "1 inhibit rules" in checked.stdout


# --- Poison isolated: what Alertmanager cannot take never holds back the rest.

def an_alert(incident: dict, ends_at_ms: int) -> dict:
    from pipelines.alerting import to_alert

    return to_alert(incident, ends_at_ms)


def test_check_alert_fixes_what_has_one_fix_and_rejects_the_rest():
    from pipelines.alerting import MAX_LABEL_VALUE_CHARS, check_alert

    opened, _, resolved = skew_incident()
    # Resolved before it opened: it ends where it starts, said in the fixes.
    backwards = an_alert(opened, opened["opened_at"] - 5_000)
    checked = check_alert(backwards)
    assert checked.alert["endsAt"] == checked.alert["startsAt"] == backwards["startsAt"]
    assert checked.reason is None and "before startsAt" in checked.fixes[0]
    # A label name Prometheus would not take has no single right fix.
    dashed = {**an_alert(opened, resolved["resolved_at"]), "labels": {**alert_labels(opened), "job-name": "x"}}
    checked = check_alert(dashed)
    assert (checked.alert, checked.reason) == (None, "invalid_label_name") and "job-name" in checked.detail
    assert check_alert({**dashed, "labels": {"alertname": "A"}, "annotations": {"1x": "y"}}).reason == \
        "invalid_annotation_name"
    # Invalid UTF-8 (a lone surrogate from a JSON escape) is replaced; a long name is shortened,
    # two long names stay two labels; a non-string annotation is sent as JSON.
    long_a, long_b = "Calc(select=[" + "a, " * 2000 + "x])", "Calc(select=[" + "a, " * 2000 + "y])"
    odd = {**an_alert(opened, resolved["resolved_at"]),
           "labels": {**alert_labels(opened), "vertex": long_a, "job_name": "orders\ud800"},
           "annotations": {"summary": None, "score": 0.5}}
    checked = check_alert(odd)
    labels = checked.alert["labels"]
    assert labels["job_name"] == "orders\ufffd" and len(labels["vertex"]) <= MAX_LABEL_VALUE_CHARS
    assert labels["vertex"].startswith("Calc(select=[a, ")
    other = check_alert({**odd, "labels": {**odd["labels"], "vertex": long_b}}).alert["labels"]["vertex"]
    assert other != labels["vertex"]
    assert checked.alert["annotations"] == {"score": "0.5"} and len(checked.fixes) == 3
    json.dumps(checked.alert).encode("utf-8")  # strict UTF-8 now


def test_an_open_alert_outlives_an_hour_of_relay_outage_and_one_stamped_ahead_is_still_open(config, alertmanager):
    from pipelines.alerting import AlertBook

    opened, _, _ = skew_incident()
    relay = RunningRelay(config, [alertmanager.url])
    try:
        publish_incidents(config.kafka, config.topics.incidents, [opened])
        (alert,) = wait_for(lambda: of_incident(alertmanager.alerts(), opened), every_s=POLL_S, what="the opened alert")
    finally:
        relay.stop()
    ends_in_s = (datetime.fromisoformat(alert["endsAt"].replace("Z", "+00:00")).timestamp() - time.time())
    assert ends_in_s > 3600, alert["endsAt"]
    assert ends_in_s <= config.alert.open_alert_ttl_s
    # An incident stamped by a clock ahead of the relay's (opened in an hour) ends a TTL after it opens.
    book = AlertBook(open_alert_ttl_s=3900)
    ahead = {**opened, "opened_at": 10_000_000}
    (sent,) = book.apply(ahead, now_ms=6_400_000)
    assert sent["endsAt"] == "1970-01-01T03:51:40.000Z"  # 10,000 s + 3,900 s


def test_a_batch_alertmanager_refuses_is_split_until_the_refused_alert_is_alone(config, alertmanager):
    """What the relay's own check lets through and Alertmanager still refuses (400): the halves of
    the batch are posted until the refused alert is alone; the others all arrive."""
    config.alert.resend_interval_s = 1.0
    incidents = [skew_incident(job=f"j{i}")[0] for i in range(7)]
    alerts = [an_alert(incident, int(time.time() * 1000) + 3_600_000) for incident in incidents]  # active
    refused = dict(alerts[4], endsAt=an_alert(incidents[4], incidents[4]["opened_at"] - 1_000)["endsAt"])
    batch = alerts[:4] + [refused] + alerts[5:]
    config.alert.metrics_port = 0
    relay = AlertRelay(config, [alertmanager.url])
    assert relay.deliver(batch, threading.Event()) is True
    ids = {a["annotations"]["incident_id"] for a in alertmanager.alerts()}
    assert ids == {i["incident_id"] for n, i in enumerate(incidents) if n != 4}
    assert relay.stats.rejected == 1 and relay.stats.alerts_sent == 6
    assert relay.metrics.rejected.labels("refused_by_alertmanager")._value.get() == 1
    assert relay.metrics.delivered._value.get() == 6
    # 7 refused -> 3 taken + 4 refused -> 2 refused + 2 taken -> 1 taken + 1 refused: 7 posts, no retries.
    assert relay.stats.posts == 7 and relay.stats.failed_tries == 0


def test_poison_on_the_topic_is_counted_and_the_next_incident_still_reaches_alertmanager(config, alertmanager):
    config.alert.resend_interval_s = 1.0
    first, _, first_resolved = skew_incident(job="j1")
    valid, _, _ = skew_incident(job="j2")
    dashed = {**skew_incident(job="j3")[0]}
    dashed["labels"] = {**dashed["labels"], "team-name": "streaming"}
    # The incident resolved 5 s before it opened (a policy before its times were ordered).
    backwards = {**first_resolved, "resolved_at": first["opened_at"] - 5_000, "updated_at": first["opened_at"] - 5_000}
    started = time.time()
    relay = RunningRelay(config, [alertmanager.url])
    try:
        publish_incidents(config.kafka, config.topics.incidents, [first])
        wait_for(lambda: of_incident(alertmanager.alerts(), first), every_s=POLL_S, what="the first alert")
        publish_incidents(config.kafka, config.topics.incidents, [b"\xff{not json"])
        publish_incidents(config.kafka, config.topics.incidents, [dashed, backwards])
        # The relay has read the poison before the valid incident is published.
        wait_for(lambda: relay.relay.stats.events >= 3, every_s=POLL_S, what="the relay to read the poison")
        publish_incidents(config.kafka, config.topics.incidents, [valid])
        (alert,) = wait_for(lambda: of_incident(alertmanager.alerts(), valid), every_s=POLL_S, what="the valid incident after poison")
        assert alert["labels"]["job_id"] == "j2"
        wait_for(lambda: not of_incident(alertmanager.alerts(), first), every_s=POLL_S, what="the backwards incident to end")
        assert not of_incident(alertmanager.alerts(), dashed)
        wait_for(lambda: committed_offsets(config) == end_offsets(config), every_s=POLL_S, what="the offsets committed past it all")
        metrics = scrape(relay.relay.metrics_server.url)
        assert relay.thread.is_alive()
    finally:
        relay.stop()
    prefix = "checkpoint_sentinel_alert_relay"
    assert metrics[sample_key(f"{prefix}_rejected_total", reason="invalid_label_name")] == 1
    assert metrics[sample_key(f"{prefix}_rejected_total", reason="unreadable_incident")] == 1
    assert metrics[sample_key(f"{prefix}_rejected_total", reason="refused_by_alertmanager")] == 0
    assert metrics[sample_key(f"{prefix}_delivered_total")] >= 3  # first, backwards (fixed), valid
    assert metrics[sample_key(f"{prefix}_retries_total")] == 0
    assert started <= metrics[sample_key(f"{prefix}_last_success_timestamp_seconds")] <= time.time()
    assert relay.relay.stats.fixed >= 1 and relay.relay.stats.rejected == 2
    # A restarted relay rebuilds its book past the poison: it neither counts nor sends it again.
    relay = RunningRelay(config, [alertmanager.url])
    try:
        wait_for(lambda: relay.relay.stats.posts >= 2, every_s=POLL_S, what="the restarted relay's re-sends")
        assert of_incident(alertmanager.alerts(), valid) and not of_incident(alertmanager.alerts(), dashed)
        assert relay.relay.stats.rejected == 0 and relay.relay.stats.events == 4  # every readable event, rebuilt
    finally:
        relay.stop()


class FailingFront:
    """A proxy in front of a real Alertmanager that answers its first ``failures`` posts with 503
    (an Alertmanager behind a load balancer with no healthy member yet)."""

    def __init__(self, target: str, failures: int):
        self.failures, self.posts = failures, 0
        front = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self, body: bytes | None):
                request = urllib.request.Request(target + self.path, data=body, method=self.command,
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=5) as response:
                        status, payload = response.status, response.read()
                except urllib.error.HTTPError as exc:
                    status, payload = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                front.posts += 1
                if front.posts <= front.failures:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self._forward(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_a_5xx_is_retried_with_backoff_and_counted_and_nothing_is_rejected(config, alertmanager):
    opened, _, _ = skew_incident()
    front = FailingFront(alertmanager.url, failures=2)
    relay = RunningRelay(config, [front.url])
    try:
        publish_incidents(config.kafka, config.topics.incidents, [opened])
        wait_for(lambda: of_incident(alertmanager.alerts(), opened), every_s=POLL_S, what="the alert after two 503s")
        metrics = scrape(relay.relay.metrics_server.url)
    finally:
        relay.stop()
        front.server.shutdown()
    assert metrics[sample_key("checkpoint_sentinel_alert_relay_retries_total")] == 2
    assert metrics[sample_key("checkpoint_sentinel_alert_relay_delivered_total")] >= 1
    assert totals(metrics).get("checkpoint_sentinel_alert_relay_rejected_total", 0) == 0


def test_an_incident_url_names_the_page_sentinel_report_writes_for_the_id():
    from pipelines.alerting import to_alert
    from pipelines.reports.incident_view import page_file

    url = "https://sentinel.example/incidents/{incident_id}.html"
    plain = {"incident_id": "state_leak-0a1b2c", "summary": "s", "score": 0.9, "severity": "warning",
             "family": "state_leak", "cluster": "c", "job_id": "j" * 32, "opened_at": 0}
    assert to_alert(plain, 1, url)["annotations"]["incident_url"] == \
        "https://sentinel.example/incidents/state_leak-0a1b2c.html"
    hostile = {**plain, "incident_id": "../../etc/x?y#z"}
    link = to_alert(hostile, 1, url)["annotations"]["incident_url"]
    assert link == f"https://sentinel.example/incidents/{page_file('../../etc/x?y#z')}"
    assert "/../" not in link and "?" not in link and "#" not in link


TIMEOUT_FORECAST = {"metric": "checkpoint_duration_ms", "limit": 3000, "limit_source": "job", "eta_ms": 240_000,
                    "eta_low_ms": 180_000, "eta_high_ms": 360_000, "fitted_over_ms": 300_000, "method": "linear_trend"}


def test_an_alert_carries_the_soonest_forecast_s_eta_band_and_limit_for_notification_templates():
    from pipelines.alerting import to_alert

    state = {"metric": "state_size_bytes", "limit": 5 * 2**20, "limit_source": "config", "eta_ms": 900_000}
    incident = {"incident_id": "state_leak-0a1b2c", "event": "updated", "summary": "s", "score": 0.9,
                "severity": "warning", "family": "state_leak", "cluster": "c", "job_id": "j1", "opened_at": 0,
                "updated_at": 60_000, "forecast": TIMEOUT_FORECAST, "forecasts": [TIMEOUT_FORECAST, state]}
    annotations = to_alert(incident, 1)["annotations"]
    assert annotations["eta"] == "~4 min (3 min-6 min)"
    assert annotations["limit"] == "the 3s checkpoint timeout"
    assert annotations["eta_at"] == "1970-01-01T00:05:00.000Z"  # updated_at + 4 min
    assert json.loads(annotations["forecasts"]) == [TIMEOUT_FORECAST, state]
    resolved = to_alert({**incident, "event": "resolved", "forecast": None, "forecasts": []}, 1)["annotations"]
    assert "eta" not in resolved and "limit" not in resolved


def test_the_relay_counts_the_open_incidents_by_family_and_severity_from_its_book():
    from prometheus_client import generate_latest

    from pipelines.alerting import AlertBook, RelayMetrics
    from tests.helpers.metrics import samples

    book = AlertBook(open_alert_ttl_s=3900)
    metrics = RelayMetrics(open_incidents=lambda: book.open.values())
    name = "checkpoint_sentinel_open_incidents"
    skew_warning, skew_critical = (name, (("family", "skew"), ("severity", "warning"))), \
        (name, (("family", "skew"), ("severity", "critical")))
    (a_opened, a_escalated, a_resolved), (b_opened, _, _) = skew_incident("j1"), skew_incident("j2")
    for event in (a_opened, b_opened):
        book.apply(event, now_ms=event["opened_at"])
    seen = samples(generate_latest(metrics.registry).decode())
    assert (seen[skew_warning], seen[skew_critical]) == (2, 0)
    assert seen[(name, (("family", "backpressure"), ("severity", "info")))] == 0  # every pair from the start
    book.apply(a_escalated, now_ms=a_escalated["updated_at"])
    seen = samples(generate_latest(metrics.registry).decode())
    assert (seen[skew_warning], seen[skew_critical]) == (1, 1)
    book.apply(a_resolved, now_ms=a_resolved["updated_at"])
    seen = samples(generate_latest(metrics.registry).decode())
    assert (seen[skew_warning], seen[skew_critical]) == (1, 0)
    assert sum(v for (n, _), v in seen.items() if n == name) == 1
