"""`sentinel alert` fed poison, black box: incidents published to the topic, the relay run as the
`sentinel` command, Alertmanager (Debian's prometheus-alertmanager, the shipped config) read through
its v2 API and the relay through its /metrics.

The poison is what the incident topic can carry: an incident resolved before it opened (what the
policy published before its times were ordered; Alertmanager answers 400 "start time must be before
end time"), a label name Prometheus does not allow, bytes that are not JSON, and JSON nested deeper
than a parser recurses. Each must cost only itself: the next valid incident reaches Alertmanager,
the relay keeps running and commits past the poison, and every poison is counted by reason.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime

import pytest

from tests.conftest import PROJECT_ROOT
from tests.helpers.alert_relay import committed_offsets, end_offsets
from tests.helpers.alertmanager import of_incident
from tests.helpers.cli import environment_without_settings
from tests.helpers.incidents import skew_incident
from tests.helpers.metrics import Samples, sample_key, scrape
from tests.helpers.topics import publish_incidents
from tests.helpers.waiting import wait_for

RELAY = "checkpoint_sentinel_alert_relay"
POLL_S = 0.2  # Alertmanager and the relay answer at once: a test waits no longer than it must


class RelayCommand:
    """`sentinel alert --alertmanager URL` as a process, on the test's topic and consumer group."""

    def __init__(self, config, url: str, folder):
        config.alert.group_id = f"sentinel-alert-{uuid.uuid4().hex[:8]}"
        env = environment_without_settings()
        env.update({"SENTINEL_STATE_DIR": str(folder),
                    "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
                    "SENTINEL_TOPICS__INCIDENTS": config.topics.incidents,
                    "SENTINEL_ALERT__GROUP_ID": config.alert.group_id,
                    "SENTINEL_ALERT__METRICS_PORT": "0", "SENTINEL_ALERT__RESEND_INTERVAL_S": "1"})
        self.out, self.err = folder / "relay.out", folder / "relay.err"
        self.process = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "alert", "--alertmanager", url],
                                        cwd=PROJECT_ROOT, env=env, stdout=open(self.out, "wb"),
                                        stderr=open(self.err, "wb"))
        try:
            wait_for(lambda: self.process.poll() is not None or "delivering" in self.out.read_text(), timeout_s=60, every_s=POLL_S,
                     what="the relay to start")
            assert self.process.poll() is None, self.out.read_text() + self.err.read_text()
        except BaseException:
            self.process.kill()
            self.process.wait(10)
            raise

    def metrics(self) -> Samples:
        served = re.search(r"/metrics at (http://\S+/metrics)", self.out.read_text())
        assert served, "the relay does not say where it serves /metrics: " + self.out.read_text()
        return scrape(served.group(1))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError("sentinel alert did not stop within 30 s of SIGTERM") from None


@pytest.fixture
def relay_command(config, alertmanager, tmp_path):
    commands = []

    def start() -> RelayCommand:
        commands.append(RelayCommand(config, alertmanager.url, tmp_path))
        return commands[-1]

    yield start
    for command in commands:
        command.stop()


def test_poison_on_the_incident_topic_costs_only_itself(config, alertmanager, relay_command):
    backwards, _, backwards_resolved = skew_incident(job="j1")
    # Resolved 5 s before it opened: the 400 that held every later alert back.
    backwards_resolved = {**backwards_resolved, "resolved_at": backwards["opened_at"] - 5_000,
                          "updated_at": backwards["opened_at"] - 5_000}
    dashed, _, _ = skew_incident(job="j3")
    dashed = {**dashed, "labels": {**dashed["labels"], "team-name": "streaming"}}
    valid, _, _ = skew_incident(job="j2")
    started = time.time()
    relay = relay_command()
    publish_incidents(config.kafka, config.topics.incidents, [backwards])
    wait_for(lambda: of_incident(alertmanager.alerts(), backwards), every_s=POLL_S, what="the first incident's alert")
    publish_incidents(config.kafka, config.topics.incidents, [backwards_resolved, dashed])
    publish_incidents(config.kafka, config.topics.incidents, [b"\xff\xfe not json", b"[" * 200_000 + b"]" * 200_000])
    time.sleep(3)  # the relay polls every 0.5 s: it has read the poison before the next incident comes
    publish_incidents(config.kafka, config.topics.incidents, [valid])

    # The valid incident arrives, open, and stays firing through an hour without its relay.
    (alert,) = wait_for(lambda: of_incident(alertmanager.alerts(), valid), every_s=POLL_S, what="the valid incident after the poison")
    ends_in_s = datetime.fromisoformat(alert["endsAt"].replace("Z", "+00:00")).timestamp() - time.time()
    assert ends_in_s > 3600, alert["endsAt"]
    # The incident resolved before it opened ended (at its start), the one Alertmanager cannot take never came.
    wait_for(lambda: not of_incident(alertmanager.alerts(), backwards), every_s=POLL_S, what="the backwards incident to end")
    assert of_incident(alertmanager.alerts(), dashed) == []
    # The relay runs on, past everything it read, and says what it rejected and why.
    wait_for(lambda: committed_offsets(config) == end_offsets(config), every_s=POLL_S, what="offsets committed past the poison")
    assert relay.process.poll() is None
    metrics = relay.metrics()
    assert metrics[sample_key(f"{RELAY}_rejected_total", reason="invalid_label_name")] == 1
    assert metrics[sample_key(f"{RELAY}_rejected_total", reason="unreadable_incident")] == 2
    assert metrics[sample_key(f"{RELAY}_delivered_total")] >= 3  # the first incident, its (fixed) resolve, the valid one
    assert metrics[sample_key(f"{RELAY}_retries_total")] == 0
    assert started <= metrics[sample_key(f"{RELAY}_last_success_timestamp_seconds")] <= time.time()
    # Still in step a few re-sends later: the rejected incident is not re-sent (and re-counted).
    time.sleep(3)
    again = relay.metrics()
    assert again[sample_key(f"{RELAY}_rejected_total", reason="invalid_label_name")] == 1
    assert again[sample_key(f"{RELAY}_delivered_total")] > metrics[sample_key(f"{RELAY}_delivered_total")]  # the open alert, re-sent

    assert relay.stop() == 0
    err, out = relay.err.read_text(), relay.out.read_text()
    assert f"incident {dashed['incident_id']} (reason invalid_label_name)" in err
    assert f"fixed the alert of incident {backwards['incident_id']}: endsAt" in err
    assert "Traceback" not in err
    assert "3 rejected, 1 fixed" in out.splitlines()[-1]
