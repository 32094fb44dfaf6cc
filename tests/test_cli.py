"""The `sentinel` command as a user runs it: a separate process, its exit code and its words."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.conftest import PROJECT_ROOT


def run_sentinel(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=PROJECT_ROOT,
                          env={**clean, **env}, capture_output=True, text=True, timeout=timeout)


def test_unreachable_broker_stops_with_what_to_fix(tmp_path):
    started = time.monotonic()
    result = run_sentinel("selfcheck", env={"SENTINEL_STATE_DIR": str(tmp_path),
                                            "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9",
                                            "SENTINEL_KAFKA__CONNECT_TIMEOUT_S": "2"})
    assert result.returncode == 1
    assert "Kafka at 127.0.0.1:9 is unreachable" in result.stderr
    assert "sentinel up" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 60


def test_bad_config_names_the_key_and_exits_2(tmp_path):
    result = run_sentinel("status", env={"SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_SPARK__SHUFLE_PARTITIONS": "4"})
    assert result.returncode == 2
    assert "spark.shufle_partitions: unknown key" in result.stderr


def test_selfcheck_round_trips_through_the_real_broker(broker_config, tmp_path):
    result = run_sentinel("selfcheck", "--events", "600", env={
        "SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": broker_config.kafka.bootstrap_servers,
    }, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "round trip OK: sent 600 events" in result.stdout
    assert "wrote 600 to" in result.stdout and "(0 differ)" in result.stdout


def test_status_without_a_stack(tmp_path):
    result = run_sentinel("status", env={"SENTINEL_STATE_DIR": str(tmp_path)})
    assert result.returncode == 0
    assert "broker   stopped" in result.stdout
    assert f"state    {tmp_path}" in result.stdout


def test_features_list_shows_every_declared_feature(tmp_path):
    from feature_store.definitions import FEATURES

    result = run_sentinel("features", "list", env={"SENTINEL_STATE_DIR": str(tmp_path)})
    assert result.returncode == 0
    names = [line.split()[0] for line in result.stdout.strip().splitlines()]
    assert names == [f.name for f in FEATURES]


def test_features_backfill_without_input_says_what_it_needs(tmp_path):
    result = run_sentinel("features", "backfill", env={"SENTINEL_STATE_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "needs event files or --dataset DIR" in result.stderr
