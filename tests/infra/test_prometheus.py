"""The rules that watch the watcher, checked and unit-tested by Prometheus's own promtool."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

import doctest

from infra import alert_rules
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
    assert all(rule["annotations"]["summary"] and rule["annotations"]["description"] for rule in rules())


def test_each_alert_links_to_its_runbook_section_which_says_what_the_rule_says():
    operations = (PROJECT_ROOT / "docs" / "OPERATIONS.md").read_text()
    headings = {"#" + line[4:].strip().lower() for line in operations.splitlines() if line.startswith("### ")}
    for rule in rules():
        base, anchor = rule["annotations"]["runbook_url"].split("#")
        assert base == "docs/OPERATIONS.md" and "#" + anchor in headings, rule["alert"]
    # The section is the rules' own text, regenerated: `python -m infra.alert_rules --runbooks`.
    section = operations[operations.index("## Alert runbooks"):]
    assert section.strip() == alert_rules.runbooks_markdown(alert_rules.load()).strip()


def test_every_up_rule_has_an_absent_twin_for_a_target_gone_from_discovery():
    ups = {m.group(1) for rule in rules() if (m := re.fullmatch(r'up\{job="([^"]+)"\} == 0', rule["expr"]))}
    absents = {m.group(1) for rule in rules() if (m := re.fullmatch(r'absent\(up\{job="([^"]+)"\}\)', rule["expr"]))}
    assert ups == absents == set(alert_rules.DEFAULT_JOBS.values())


def test_the_rules_render_for_other_job_names_and_stay_valid(promtool, tmp_path):
    jobs = {"detection": "sentinel/detection", "collector": "sentinel/collector", "alert": "monitoring/relay"}
    rendered = alert_rules.render(alert_rules.load(), jobs, "https://wiki.internal/sentinel/ops")
    text = yaml.safe_dump(rendered, sort_keys=False)
    assert not any(default in text for default in alert_rules.DEFAULT_JOBS.values())
    exprs = {rule["alert"]: rule["expr"] for rule in alert_rules.alerts(rendered)}
    assert exprs["SentinelAlertRelayDown"] == 'up{job="monitoring/relay"} == 0'
    assert exprs["SentinelCollectorAbsent"] == 'absent(up{job="sentinel/collector"})'
    assert all(rule["annotations"]["runbook_url"].startswith("https://wiki.internal/sentinel/ops#")
               for rule in alert_rules.alerts(rendered))
    (tmp_path / "rendered.yml").write_text(text)
    checked = subprocess.run([promtool, "check", "rules", str(tmp_path / "rendered.yml")], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with pytest.raises(ValueError, match="unknown part"):
        alert_rules.render(alert_rules.load(), {"relay": "x"})
    assert doctest.testmod(alert_rules).failed == 0


def test_the_rules_read_metrics_the_sentinel_s_processes_export():
    exported = {sample_name for metrics in (DetectionMetrics(), CollectorMetrics(), RelayMetrics())
                for family in metrics.registry.collect() for sample_name in _sample_names(family)}
    named = {name for rule in rules() for name in re.findall(r"checkpoint_sentinel_\w+", rule["expr"])}
    assert named <= exported


def _sample_names(family) -> set[str]:
    if family.type == "counter":
        return {family.name + "_total"}
    return {family.name}
