"""The embedded-stack launcher: start, start again, status, port conflicts, stop."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.request

import pytest

from infra.embedded_stack import EmbeddedStack, StackError, free_port, port_in_use, stop_process_group
from tests.conftest import config_for


@pytest.mark.slow
def test_up_twice_is_harmless_status_reports_and_down_stops(tmp_path):
    broker_port, mlflow_port = free_port(), free_port()
    config = config_for(tmp_path, kafka__bootstrap_servers=f"127.0.0.1:{broker_port}",
                        stack__mlflow_port=str(mlflow_port), kafka__topic_partitions="2")
    stack = EmbeddedStack(config)
    try:
        first = stack.up()
        assert first[0].startswith(f"broker started at 127.0.0.1:{broker_port}")
        assert ("created topics flink.metrics, flink.incidents, flink.metrics.dlq, flink.incidents.feedback "
                "(2 partitions)") in first[0]
        assert first[1].startswith(f"MLflow UI started at http://127.0.0.1:{mlflow_port}")
        with urllib.request.urlopen(f"http://127.0.0.1:{mlflow_port}/health", timeout=5) as response:
            assert response.status == 200

        statuses = {s.name: s for s in stack.status()}
        assert statuses["broker"].running and statuses["mlflow"].running
        pids = {name: s.pid for name, s in statuses.items()}

        second = stack.up()
        assert second[0] == f"broker already running at 127.0.0.1:{broker_port} (pid {pids['broker']})"
        assert second[1] == f"MLflow UI already running at http://127.0.0.1:{mlflow_port} (pid {pids['mlflow']})"
        # The sqlite store and the artifact root live in the project state folder.
        assert (tmp_path / "mlflow" / "mlflow.db").is_file()
    finally:
        stopped = stack.down()
    assert stopped == [f"mlflow: stopped (pid {pids['mlflow']})", f"broker: stopped (pid {pids['broker']})"]
    assert not port_in_use("127.0.0.1", broker_port)
    assert not port_in_use("127.0.0.1", mlflow_port)
    assert not any(s.running for s in stack.status())
    assert stack.down() == ["mlflow: not started by sentinel up", "broker: not started by sentinel up"]


def test_a_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        stack = EmbeddedStack(config_for(tmp_path, kafka__bootstrap_servers=f"127.0.0.1:{port}"))
        with pytest.raises(StackError, match=f"port {port} on 127.0.0.1 is already in use by a process that"):
            stack.up(mlflow=False)
    assert not (tmp_path / "run" / "broker.json").exists()


def test_an_external_cluster_is_not_started(tmp_path):
    stack = EmbeddedStack(config_for(tmp_path, kafka__bootstrap_servers="kafka-1.prod:9092"))
    with pytest.raises(StackError, match="only starts a broker on a single loopback address"):
        stack.up()
    assert stack.status()[0].address == "kafka-1.prod:9092 (external)"


def test_a_stale_pid_record_is_cleaned_up(tmp_path):
    stack = EmbeddedStack(config_for(tmp_path))
    stack.run_dir.mkdir(parents=True)
    # PID 1 exists but is not our broker: never signal it.
    (stack.run_dir / "broker.json").write_text('{"pid": 1, "address": "127.0.0.1:1", "log": "x"}')
    assert stack.down()[1] == "broker: was not running (stale record removed)"
    assert not (stack.run_dir / "broker.json").exists()


def test_a_stopped_process_group_this_process_started_leaves_no_zombie_in_its_group():
    # A Flink cluster the lab started in this process: its leader, once stopped, must be reaped here,
    # or its group (which the lab waits to see gone) lives on as a zombie.
    leader = subprocess.Popen(["bash", "-c", "sleep 300 & exec sleep 300"], start_new_session=True)
    stop_process_group(leader.pid)
    with pytest.raises(ChildProcessError):
        os.waitpid(leader.pid, os.WNOHANG)  # already reaped
    leader.poll()
