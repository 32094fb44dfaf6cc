"""The rules that watch the watcher, checked and unit-tested by Prometheus's own promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import PROJECT_ROOT

RULES = PROJECT_ROOT / "infra" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    """Debian's promtool (package prometheus), installed here when the machine has none."""
    found = shutil.which("promtool")
    if found is None:
        env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, env=env, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"], check=True,
                       capture_output=True, env=env, timeout=900)
        found = shutil.which("promtool")
    assert found, "promtool is not on the PATH after installing Debian's prometheus package"
    return found


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
