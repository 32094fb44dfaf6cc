"""How every `sentinel` command ends when something is wrong: a service that is down, a closed
pipe, a topic read that times out. Each as a user meets it: a process of its own, its exit
code, its last line, how long it took."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from infra.embedded_stack import free_port
from tests.conftest import PROJECT_ROOT
from tests.helpers.cli import environment_without_settings, run_sentinel

# The README's promise: an unreachable service ends the command with 1, within seconds, naming the key.
LIMIT_S = 15.0
KAFKA_KEY = "kafka.bootstrap_servers"
MLFLOW_KEY = "mlflow.tracking_uri"


def _dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


# What the commands import, imported once before any is timed: a shared machine's start-up of
# Python and its libraries is not what this measures (tests/test_cli.py runs them as processes).
WARM = ("pipelines.selfcheck", "pipelines.spark_session", "pipelines.detection.job", "pipelines.detection.flink_job",
        "pipelines.reports.backtest", "pipelines.reports.incident_page", "pipelines.reports.incident_view",
        "pipelines.reports.topic_reader", "pipelines.alerting", "pipelines.collector", "pipelines.feedback",
        "pipelines.simulator.publish", "models.training", "infra.embedded_stack")


@pytest.fixture(scope="module")
def warm():
    import importlib

    for module in WARM:
        importlib.import_module(module)


@pytest.fixture
def sentinel(warm, monkeypatch, capsys):
    """``sentinel(*args, **env)``: `main` in this process with only the given settings; returns its exit
    code, its stderr and how long it took. The signal handlers a command installs are undone after it."""
    import signal

    from pipelines.cli import main

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for name in [n for n in os.environ if n.startswith("SENTINEL_")]:
        monkeypatch.delenv(name)

    def run(*args: str, **env: str) -> tuple[int, str, float]:
        for name, value in env.items():
            monkeypatch.setenv(f"SENTINEL_{name.upper()}", value)
        capsys.readouterr()
        started = time.monotonic()
        code = main(list(args))
        seconds = time.monotonic() - started
        return code, capsys.readouterr().err, seconds

    yield run
    for number, handler in handlers.items():
        signal.signal(number, handler)


def _ends_with_what_to_fix(code: int, stderr: str, seconds: float, key: str, command: str) -> None:
    assert code == 1, stderr[-3000:]
    assert seconds < LIMIT_S, f"took {seconds:.1f}s"
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"sentinel {command}: ") and key in last, last


KAFKA_COMMANDS = {
    "selfcheck": ["selfcheck"],
    "incidents": ["incidents", "--timeout", "1s"],
    "feedback": ["feedback", "f" * 32, "--confirmed"],
    "report": ["report"],
    "run": ["run", "--available-now"],
    "collect": ["collect", "--once", "--flink-rest", "http://127.0.0.1:9"],
    "alert": ["alert", "--alertmanager", "http://127.0.0.1:9"],
    "simulate": ["simulate", "--kafka", "--scenario", "healthy_steady", "--max-speed"],
    "train": ["train", "--feedback", "--dry-run"],
    "lab": ["lab", "leak", "--duration", "1m"],  # publishes to the input topic unless --no-kafka
}


@pytest.mark.parametrize("command", sorted(KAFKA_COMMANDS))
def test_every_command_that_talks_to_kafka_stops_within_seconds_when_it_is_down(command, sentinel, tmp_path):
    """With the default connect timeout: nothing listens on the broker's port."""
    outcome = sentinel(*KAFKA_COMMANDS[command], state_dir=str(tmp_path), alert__metrics_port="0",
                       kafka__bootstrap_servers=f"127.0.0.1:{free_port()}")
    _ends_with_what_to_fix(*outcome, KAFKA_KEY, command)


@pytest.mark.parametrize("command", ["train", "evaluate", "replay", "demo", "run"])
def test_every_command_that_talks_to_mlflow_stops_within_seconds_when_the_server_is_down(
        command, sentinel, broker_config, tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text("{}\n")
    args = {"train": ["train", "--dataset", str(PROJECT_ROOT / "data" / "lab")], "evaluate": ["evaluate"],
            "replay": ["replay", str(events), "--out", str(tmp_path / "out.jsonl")],
            "demo": ["demo"], "run": ["run", "--available-now"]}[command]
    dead = _dead_url()
    # The demo starts the embedded stack only once the tracking server answered: on ports of its own.
    code, stderr, seconds = sentinel(*args, state_dir=str(tmp_path / "state"), mlflow__tracking_uri=dead,
                                     stack__mlflow_port=str(free_port()),
                                     kafka__bootstrap_servers=(f"127.0.0.1:{free_port()}" if command == "demo"
                                                               else broker_config.kafka.bootstrap_servers))
    # `run` holds no copies of champions here, so a registry that is down is a stop for it too.
    _ends_with_what_to_fix(code, stderr, seconds, MLFLOW_KEY, command)
    assert f"mlflow at {dead} is unreachable (connection refused)" in stderr
    assert not (tmp_path / "state" / "run").exists() or not list((tmp_path / "state" / "run").iterdir())


def test_alert_stops_within_seconds_when_no_alertmanager_answers(sentinel, broker_config, tmp_path):
    outcome = sentinel("alert", "--alertmanager", _dead_url(), state_dir=str(tmp_path), alert__metrics_port="0",
                       kafka__bootstrap_servers=broker_config.kafka.bootstrap_servers)
    _ends_with_what_to_fix(*outcome, "alert.alertmanager_urls", "alert")


def test_collect_once_stops_within_seconds_when_flink_is_down(sentinel, broker_config, tmp_path):
    outcome = sentinel("collect", "--once", "--flink-rest", _dead_url(), state_dir=str(tmp_path),
                       kafka__bootstrap_servers=broker_config.kafka.bootstrap_servers)
    _ends_with_what_to_fix(*outcome, "--flink-rest", "collect")


@pytest.mark.parametrize("args", [["features", "list"], ["simulate", "--list"], ["--help"], ["config", "show"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(args, tmp_path):
    """The read end is closed before the command writes its first line: every write fails."""
    process = subprocess.Popen([sys.executable, "-m", "pipelines.cli", *args], cwd=PROJECT_ROOT,
                               env={**environment_without_settings(), "SENTINEL_STATE_DIR": str(tmp_path)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 0, stderr
    assert stderr == ""


@pytest.mark.parametrize("pipeline", ["features list | head -1", "simulate --list | head -3"])
def test_piping_into_head_ends_with_status_0_and_nothing_on_stderr(pipeline, tmp_path):
    command, reader = pipeline.split(" | ")
    result = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m pipelines.cli {command} | {reader}"],
                            cwd=PROJECT_ROOT, env={**environment_without_settings(), "SENTINEL_STATE_DIR": str(tmp_path)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
    assert len(result.stdout.splitlines()) == int(reader.split()[-1].lstrip("-"))


def test_a_topic_read_that_times_out_is_one_line(config, tmp_path):
    from pipelines.io import kafka_clients

    producer = kafka_clients.make_producer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    for i in range(2000):
        producer.send(config.topics.incidents, value=b'{"x": %d}' % i)
    producer.flush()
    producer.close()
    result = run_sentinel("report", "--read-timeout", "1ms", env={
        "SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "SENTINEL_TOPICS__INCIDENTS": config.topics.incidents})
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        f"sentinel report: reading {config.topics.incidents} up to its end took longer than 0.001s (--read-timeout)"]


def test_status_says_which_configured_service_is_unreachable_and_exits_1(broker_config, tmp_path):
    dead_mlflow, dead_am, dead_flink = _dead_url(), _dead_url(), _dead_url()
    config_file = tmp_path / "sentinel.yaml"
    config_file.write_text(f"collector:\n  clusters:\n    - {{name: prod-eu, rest_url: '{dead_flink}'}}\n")
    result = run_sentinel("status", "--config", str(config_file), env={
        "SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": broker_config.kafka.bootstrap_servers,
        "SENTINEL_MLFLOW__TRACKING_URI": dead_mlflow, "SENTINEL_ALERT__ALERTMANAGER_URLS": f"[{dead_am}]"})
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "configured services:"
    kafka = next(line for line in lines if line.strip().startswith("kafka"))
    assert "reachable" in kafka and "UNREACHABLE" not in kafka and "metadata: 1 broker(s)" in kafka
    for service, url in (("mlflow", dead_mlflow), ("alertmanager", dead_am), ("flink prod-eu", dead_flink)):
        line = next(line for line in lines if line.strip().startswith(service))
        assert "UNREACHABLE" in line and url in line and "connection refused" in line, line
    assert "embedded stack (`sentinel up`):" in lines
    assert "3 configured service(s) unreachable" in result.stderr and "mlflow.tracking_uri" in result.stderr


def test_status_with_every_service_reachable_exits_0(broker_config, tmp_path):
    result = run_sentinel("status", env={"SENTINEL_STATE_DIR": str(tmp_path),
                                         "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": broker_config.kafka.bootstrap_servers})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kafka         reachable" in result.stdout
    # The default MLflow is a store opened in-process: nothing to reach, so no line for it.
    assert "mlflow" not in result.stdout.split("embedded stack")[0]


def test_run_stopped_by_lost_input_offsets_ends_with_the_reason_naming_the_key(sentinel, monkeypatch, tmp_path):
    """`sentinel run` as the user sees it when the query fails on lost offsets (the failure itself,
    on a real broker and Spark, is tests/pipelines/io/test_data_loss.py): the last line is the reason
    with this project's key; Spark's plan is not on screen, but in the log at DEBUG (-vv)."""
    from types import SimpleNamespace

    from pipelines import spark_session
    from pipelines.cli import production
    from pipelines.detection import job, spark_state

    plan = "\n".join(["=== Streaming Query ===", "Current State: ACTIVE", "Logical Plan:"]
                     + [f"+- Project [col{i}#{i}]" for i in range(100)])
    failure = Exception("[STREAM_FAILED] Query terminated with exception: org.apache.spark.SparkException: "
                        "Python worker failed\npipelines.io.kafka_source.KafkaDataLossError: flink.metrics-0 holds "
                        "offsets from 0, the job had read to 50 (set failOnDataLoss=false to skip lost offsets)\n"
                        + plan)
    stopped = []

    class Job:
        metrics_server, sinks = None, SimpleNamespace(incidents_published=0, dead_letters=0)

        def await_termination(self, timeout_s, stop):
            raise failure

        def stop(self):
            stopped.append(True)

    monkeypatch.setattr(spark_state, "check_pyspark", lambda: None)
    monkeypatch.setattr(production, "require_kafka", lambda config: None)
    monkeypatch.setattr(production, "require_champions", lambda config, held=False: None)
    monkeypatch.setattr(spark_session, "build_spark", lambda config, name="": None)
    monkeypatch.setattr(job, "start_detection", lambda spark, config, cache, available_now=False: Job())
    code, stderr, _ = sentinel("run", state_dir=str(tmp_path))
    assert code == 1 and stopped == [True]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("sentinel run: the input topic lost offsets the job had not read: flink.metrics-0 ")
    assert "kafka.fail_on_data_loss: false (SENTINEL_KAFKA__FAIL_ON_DATA_LOSS=false)" in last
    assert "Logical Plan" not in stderr and "Traceback" not in stderr and "failOnDataLoss" not in stderr

    code, stderr, _ = sentinel("-vv", "run", state_dir=str(tmp_path))
    assert code == 1 and "Logical Plan:" in stderr  # the whole message, in the log
    assert stderr.strip().splitlines()[-1] == last
