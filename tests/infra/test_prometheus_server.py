"""A real Prometheus (Debian's) scraping the three long-running commands as they run in production,
`sentinel collect` (polling a fleet served from a real Flink job's recorded answers), `sentinel run`
(reading what the collector publishes, scoring with the run's champions) and `sentinel alert`
(in step with a real Alertmanager), and evaluating the shipped rules on what it scrapes.

What on-call relies on: every shipped rule loads and evaluates without error on the real
exposition; a healthy sentinel fires nothing; the relay stopped fires `SentinelAlertRelayDown`
while its twins (the other parts down, the relay's target gone) stay quiet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import alert_rules, grafana_dashboard, render_dashboard
from infra.embedded_stack import free_port
from tests.conftest import PROJECT_ROOT
from tests.helpers.alertmanager import Alertmanager, Webhook
from tests.helpers.cli import environment_without_settings
from tests.helpers.detection_job import detection_config_for, job_environment, publish
from tests.helpers.incidents import skew_incident
from tests.helpers.prometheus import PrometheusServer
from tests.helpers.topics import publish_incidents
from tests.helpers.waiting import wait_for

DASHBOARD = PROJECT_ROOT / "infra" / "grafana" / "checkpoint-sentinel.json"
JOBS = alert_rules.DEFAULT_JOBS  # the scrape job names the shipped rules select
FLEET_JOBS = 3
# docs/OPERATIONS.md's picture wants a few minutes of the job running; the relay's test, after it,
# needs the fixture's dead letter still pending (for 10 min from the job's first batches).
PICTURE_DATA_S = 240


class Command:
    """A long-running command of its own (its process group), its output in ``log``."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log = log
        self.process = subprocess.Popen(argv, cwd=PROJECT_ROOT, env=env, stdout=open(log, "wb"),
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout_s: float = 90) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def sentinel(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", *args]


@pytest.fixture(scope="module")
def stack(broker_config, trained_store, tmp_path_factory):
    """The three commands, a real Alertmanager, and Prometheus scraping them with the shipped rules."""
    folder = tmp_path_factory.mktemp("prometheus-server")
    config = detection_config_for(broker_config, trained_store, folder)
    ports = {part: free_port() for part in JOBS}
    commands: dict[str, Command] = {}
    webhook = Webhook()
    manager, prometheus, fleet = Alertmanager(folder, webhook), None, None
    try:
        fleet_port = free_port()
        fleet = subprocess.Popen([sys.executable, "-m", "benchmarks.flink_fleet_replay", "--jobs", str(FLEET_JOBS),
                                  "--port", str(fleet_port), "--checkpoint-interval", "2", "--metrics-refresh", "1000"],
                                 cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True)
        assert fleet.stdout.readline().strip() == "ready"
        manager.start()
        # An incident open before the relay starts: it rebuilds its book from the topic. And a record
        # off the input contract: a dead letter to count.
        opened, _, _ = skew_incident("prometheus-j1")
        publish_incidents(config.kafka, config.topics.incidents, [opened])
        publish(config, [], raw=[b"not json"])

        base = {**environment_without_settings(), "SENTINEL_STATE_DIR": str(folder),
                "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
                "SENTINEL_TOPICS__INPUT": config.topics.input, "SENTINEL_TOPICS__INCIDENTS": config.topics.incidents,
                "SENTINEL_TOPICS__DEAD_LETTER": config.topics.dead_letter}
        commands["collector"] = Command(
            sentinel("collect", "--flink-rest", f"http://127.0.0.1:{fleet_port}", "--cluster", "lab", "--interval", "2s"),
            {**base, "SENTINEL_COLLECTOR__METRICS_PORT": str(ports["collector"])}, folder / "collect.log")
        commands["alert"] = Command(
            sentinel("alert", "--alertmanager", manager.url),
            {**base, "SENTINEL_ALERT__METRICS_PORT": str(ports["alert"]), "SENTINEL_ALERT__RESEND_INTERVAL_S": "5"},
            folder / "alert.log")
        commands["detection"] = Command(
            sentinel("run"), job_environment(config, SENTINEL_DETECTION__METRICS_PORT=str(ports["detection"])),
            folder / "run.log")
        prometheus = PrometheusServer(folder, {JOBS[part]: [f"127.0.0.1:{port}"] for part, port in ports.items()},
                                      [alert_rules.RULES_FILE]).start()

        def all_up() -> bool:
            for part, command in commands.items():
                assert command.process.poll() is None, f"sentinel {part} exited:\n{command.output()[-4000:]}"
            up = {sample["metric"]["job"]: sample["value"][1] for sample in prometheus.query("up")}
            # The detection job has read what the collector published: its first batches are done.
            read = prometheus.query('checkpoint_sentinel_input_rows_total{query="detection"} > 0')
            return up == {job: "1" for job in JOBS.values()} and bool(read)

        wait_for(all_up, timeout_s=900, every_s=2, what="Prometheus to scrape the three commands, the job reading")
        time.sleep(5)  # a few scrapes and rule evaluations of the running parts
        reading_since = time.time()
        yield {"prometheus": prometheus, "commands": commands, "alertmanager": manager, "ports": ports,
               "reading_since": reading_since}
    finally:
        for command in commands.values():
            command.stop()
        if prometheus is not None:
            prometheus.stop()
        if manager.process is not None and manager.process.poll() is None:
            manager.stop()
        webhook.server.shutdown()
        if fleet is not None:
            fleet.terminate()
            fleet.communicate(timeout=30)


def values(prometheus: PrometheusServer, promql: str, label: str) -> dict[str, float]:
    return {sample["metric"].get(label, ""): float(sample["value"][1]) for sample in prometheus.query(promql)}


def test_prometheus_scrapes_each_part_s_process_build_and_own_metrics(stack):
    prometheus = stack["prometheus"]
    assert {job: [t["health"] for t in targets] for job, targets in prometheus.targets().items()} == \
        {job: ["up"] for job in JOBS.values()}
    builds = {sample["metric"]["job"]: sample["metric"]["component"]
              for sample in prometheus.query("checkpoint_sentinel_build_info == 1")}
    assert builds == {JOBS[part]: part for part in JOBS}
    # Each part's resident memory: a Python process with its libraries, under 2 GiB.
    memory = values(prometheus, "process_resident_memory_bytes", "job")
    assert set(memory) == set(JOBS.values()) and all(20 * 2**20 < m < 2 * 2**30 for m in memory.values())
    # sentinel run started its Spark JVM: that is watched too, and holds more than the driver's Python.
    jvm = values(prometheus, "checkpoint_sentinel_jvm_process_resident_memory_bytes", "job")
    assert jvm[JOBS["detection"]] > 200 * 2**20
    # The collector reached the fleet and published; the job read it, in batches a histogram counts.
    assert values(prometheus, "checkpoint_sentinel_collector_cluster_reachable", "cluster") == {"lab": 1.0}
    assert values(prometheus, "checkpoint_sentinel_collector_jobs", "cluster") == {"lab": float(FLEET_JOBS)}
    batches = values(prometheus, 'checkpoint_sentinel_batch_duration_seconds_count{query="detection"}', "query")
    assert batches["detection"] >= 1
    # The relay rebuilt the incident open before it started from the topic (the job may open more).
    open_now = values(prometheus, 'checkpoint_sentinel_open_incidents{family="skew", severity="warning"}', "family")
    assert open_now["skew"] >= 1


def test_every_shipped_rule_evaluates_on_the_real_exposition_and_a_healthy_sentinel_fires_nothing(stack):
    prometheus = stack["prometheus"]
    loaded = {rule["name"]: rule for rule in prometheus.rules()}
    assert set(loaded) == {rule["alert"] for rule in alert_rules.alerts(alert_rules.load())}
    assert {name: rule["health"] for name, rule in loaded.items() if rule["health"] != "ok"} == {}
    assert {name: rule["lastError"] for name, rule in loaded.items() if rule.get("lastError")} == {}
    # The one record off the contract is a dead letter, counted from zero: its rule is pending (for
    # 10 min), nothing fires.
    wait_for(lambda: "SentinelDeadLetters" in prometheus.alerts(), timeout_s=60, every_s=2,
             what="SentinelDeadLetters to be pending on the dead letter")
    states = {name: {a["state"] for a in alerts} for name, alerts in prometheus.alerts().items()}
    assert states == {"SentinelDeadLetters": {"pending"}}
    (letter,) = prometheus.alerts()["SentinelDeadLetters"]
    assert letter["labels"]["reason"] == "malformed_json"


def test_every_dashboard_query_is_valid_promql_and_returns_series_for_the_running_sentinel(stack):
    prometheus = stack["prometheus"]
    model = json.loads(DASHBOARD.read_text())
    empty = []
    for title, expr in grafana_dashboard.queries(model):
        # Grafana's variables as it sends them, the jobs at their defaults; a bad query raises here.
        result = prometheus.query(grafana_dashboard.rendered(expr, rate_interval="1m"))
        if not result:
            empty.append((title, expr))
    assert empty == []
    if os.environ.get("PYTEST_DASHBOARD_SCREENSHOT"):  # docs/OPERATIONS.md's picture, from this run
        time.sleep(max(0.0, stack["reading_since"] + PICTURE_DATA_S - time.time()))
        # From a minute before the job's first batches: the parts starting, then running.
        drawn = render_dashboard.render(prometheus.url, Path(os.environ["PYTEST_DASHBOARD_SCREENSHOT"]),
                                        stack["reading_since"] - 60, time.time(), model)
        assert {panel_id for panel_id, series in drawn.items() if series} == set(drawn)
    # What the panels show is the running sentinel's: the relay's open incident, every part up.
    open_now = prometheus.query(grafana_dashboard.rendered(
        dict(grafana_dashboard.queries(model))["Open incidents"]) + " > 0")
    assert ("skew", "warning") in [(s["metric"]["family"], s["metric"]["severity"]) for s in open_now]
    up = prometheus.query(grafana_dashboard.rendered(dict(grafana_dashboard.queries(model))["Parts up"]))
    assert {s["metric"]["job"]: s["value"][1] for s in up} == {job: "1" for job in JOBS.values()}


def test_the_relay_stopped_fires_its_down_rule_while_its_twins_stay_quiet(stack):
    """Runs last: it stops the relay."""
    prometheus, relay = stack["prometheus"], stack["commands"]["alert"]
    relay.stop()
    assert relay.process.returncode == 0, relay.output()[-3000:]
    wait_for(lambda: values(prometheus, "up", "job").get(JOBS["alert"]) == 0.0, timeout_s=30, every_s=1,
             what="Prometheus to see the relay down")
    down_rule = next(r for r in alert_rules.alerts(alert_rules.load()) if r["alert"] == "SentinelAlertRelayDown")
    assert down_rule["for"] == "2m"  # what the wait below is for

    def firing() -> list[dict]:
        return [a for a in prometheus.alerts().get("SentinelAlertRelayDown", []) if a["state"] == "firing"]

    (alert,) = wait_for(firing, timeout_s=200, every_s=5, what="SentinelAlertRelayDown to fire")
    assert alert["labels"] == {"alertname": "SentinelAlertRelayDown", "severity": "critical", "job": JOBS["alert"],
                               "instance": f"127.0.0.1:{stack['ports']['alert']}"}
    assert alert["annotations"]["runbook_url"] == "docs/OPERATIONS.md#sentinelalertrelaydown"
    assert f"127.0.0.1:{stack['ports']['alert']} is down" in alert["annotations"]["summary"]
    # Its twins: the other parts run, and the relay's target is still discovered (down, not gone);
    # the fixture's dead letter keeps SentinelDeadLetters pending (for 10 min), not firing.
    states = {name: {a["state"] for a in alerts} for name, alerts in prometheus.alerts().items()}
    assert states == {"SentinelAlertRelayDown": {"firing"}, "SentinelDeadLetters": {"pending"}}
    assert values(prometheus, "up", "job") == {JOBS["detection"]: 1.0, JOBS["collector"]: 1.0, JOBS["alert"]: 0.0}
