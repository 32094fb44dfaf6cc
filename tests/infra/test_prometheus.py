"""The rules that watch the watcher, checked and unit-tested by Prometheus's own promtool."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import PROJECT_ROOT, debian_binary

RULES = PROJECT_ROOT / "infra" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    """Debian's promtool (package prometheus), installed here when the machine has none."""
    return debian_binary("promtool", "prometheus")


def test_the_alerting_rules_are_valid(promtool):
    checked = subprocess.run([promtool, "check", "rules", str(RULES / "sentinel-alerts.yml")], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout


def test_the_alerting_rules_fire_when_the_watcher_is_down_behind_or_blind(promtool):
    tested = subprocess.run([promtool, "test", "rules", "sentinel-alerts.test.yml"], cwd=RULES, capture_output=True,
                            text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
