"""The `sentinel` command as a user runs it: a separate process, its exit code and its words.

Its backtests against the test run's champions (`replay`, `evaluate`) are in test_cli_backtests.py:
those wait for the champions' training, these do not."""

from __future__ import annotations

import subprocess
import sys
import time

from infra.embedded_stack import free_port
from tests.conftest import PROJECT_ROOT
from tests.helpers.cli import environment_without_settings, run_sentinel


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


def test_a_setup_error_is_told_without_importing_what_the_command_never_used(tmp_path):
    """The command reports the unreachable broker it found, and has not imported MLflow,
    scikit-learn or Great Expectations on the way (their import took 10 of its 13 CPU s)."""
    code = ("import sys; from pipelines.cli import main; code = main(['selfcheck']); "
            "print(code, sorted(m for m in ('mlflow', 'sklearn', 'great_expectations') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
                            env={**environment_without_settings(), "SENTINEL_STATE_DIR": str(tmp_path),
                                 "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9",
                                 "SENTINEL_KAFKA__CONNECT_TIMEOUT_S": "2"})
    assert result.stdout.strip() == "1 []", result.stderr[-2000:]
    assert "Kafka at 127.0.0.1:9 is unreachable" in result.stderr


def test_every_setup_error_the_command_tells_is_one_class_s():
    """The errors a user fixes in their setup share SetupError, which imports nothing: the
    command recognises one without importing the module that raised it."""
    import importlib

    from pipelines.errors import SetupError

    for module, name in (("infra.embedded_stack", "StackError"), ("pipelines.io.kafka_clients", "KafkaUnavailable"),
                         ("pipelines.spark_session", "JavaMissing"), ("models.validation", "TrainingSetInvalid"),
                         ("models.registry", "ModelUnavailable"), ("infra.flink_cluster", "FlinkClusterError"),
                         ("pipelines.collector.ledger", "LedgerError"), ("pipelines.lab", "LabError"),
                         ("pipelines.detection.spark_state", "UnsupportedPySpark"),
                         ("pipelines.alerting", "AlertmanagerUnavailable"),
                         ("pipelines.reports.incident_page", "UnknownIncident"), ("pipelines.io.storage", "StorageError"),
                         ("pipelines.config", "ConfigError"), ("pipelines.simulator", "SimulationError"),
                         ("pipelines.io.kafka_stream", "InputDataLost")):
        assert issubclass(getattr(importlib.import_module(module), name), SetupError), (module, name)
    assert subprocess.run([sys.executable, "-c", "import sys, pipelines.errors; sys.exit(len(sys.modules) > 100)"],
                          cwd=PROJECT_ROOT, timeout=60).returncode == 0


def test_the_incident_table_prints_nothing_before_it_finds_the_broker_unreachable(tmp_path):
    result = run_sentinel("incidents", "--timeout", "1", env={"SENTINEL_STATE_DIR": str(tmp_path),
                                                              "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9",
                                                              "SENTINEL_KAFKA__CONNECT_TIMEOUT_S": "2"})
    assert result.returncode == 1
    assert "Kafka at 127.0.0.1:9 is unreachable" in result.stderr
    assert result.stdout == ""


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
    result = run_sentinel("status", env={"SENTINEL_STATE_DIR": str(tmp_path),
                                         "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"})
    assert result.returncode == 1  # the configured broker is the embedded one, which is not running
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


def test_run_without_any_model_says_to_train_first(broker_config, tmp_path):
    result = run_sentinel("run", "--available-now", env={
        "SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": broker_config.kafka.bootstrap_servers})
    assert result.returncode == 1
    assert "no model has the alias 'champion'" in result.stderr and "sentinel train" in result.stderr
    assert "Traceback" not in result.stderr


def test_replay_of_a_missing_file_says_which(tmp_path):
    result = run_sentinel("replay", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o.jsonl"),
                          env={"SENTINEL_STATE_DIR": str(tmp_path)})
    assert result.returncode == 1 and "no such events file" in result.stderr
