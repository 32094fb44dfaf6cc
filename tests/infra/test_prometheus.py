"""The rules that watch the watcher, checked and unit-tested by Prometheus's own promtool."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from pipelines.alerting import RelayMetrics
from pipelines.telemetry import CollectorMetrics, DetectionMetrics
from tests.conftest import PROJECT_ROOT, debian_binary

RULES = PROJECT_ROOT / "infra" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    """Debian's promtool (package prometheus), installed here when the machine has none."""
    return debian_binary("promtool", "prometheus")


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load((RULES / "sentinel-alerts.yml").read_text())["groups"]
            for rule in group["rules"]]


def test_the_alerting_rules_are_valid(promtool):
    checked = subprocess.run([promtool, "check", "rules", str(RULES / "sentinel-alerts.yml")], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout


def test_the_alerting_rules_fire_on_faults_and_stay_quiet_on_healthy_runs(promtool):
    tested = subprocess.run([promtool, "test", "rules", "sentinel-alerts.test.yml"], cwd=RULES, capture_output=True,
                            text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
    # Every alert has a unit test, and every one says what to fix.
    tests = yaml.safe_load((RULES / "sentinel-alerts.test.yml").read_text())["tests"]
    firing = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert firing == {rule["alert"] for rule in rules()}
    assert all(rule["annotations"]["summary"] and rule["annotations"]["runbook"] for rule in rules())


def test_the_rules_read_metrics_the_sentinel_s_processes_export():
    exported = {sample_name for metrics in (DetectionMetrics(), CollectorMetrics(), RelayMetrics())
                for family in metrics.registry.collect() for sample_name in _sample_names(family)}
    named = {name for rule in rules() for name in re.findall(r"checkpoint_sentinel_\w+", rule["expr"])}
    assert named <= exported


def _sample_names(family) -> set[str]:
    if family.type == "counter":
        return {family.name + "_total"}
    return {family.name}
