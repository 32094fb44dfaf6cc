"""The collector against real Flink 2.3: eight jobs running side by side on one local cluster
(the lab's Flink virtualenv; a cluster of the test's own, on free ports, in its own folder),
collected with the concurrent client into the real broker, across a restart of the collector:
every event keeps the input contract, every checkpoint is published once and none is missed."""

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from infra.embedded_stack import free_port
from pipelines.collector import run_collector
from pipelines.config import FlinkClusterEndpoint
from pipelines.contracts import INPUT
from pipelines.io import kafka_clients
from tests.helpers.waiting import wait_for

PROJECT_ROOT = Path(__file__).resolve().parents[3]
JOB_SCRIPT = Path(__file__).parent / "flink_jobs" / "fleet_sql.py"
JOBS = 8


def collect(config, endpoint, polls: int) -> list:
    """Run the collector service (one event loop, publishing to the broker) for ``polls`` polls."""
    stop, reports = threading.Event(), []

    def report(result):
        reports.append(result)
        if len(reports) >= polls:
            stop.set()

    thread = threading.Thread(target=run_collector, args=(config, [endpoint]), kwargs={"stop": stop, "report": report})
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the collector did not stop"
    return reports


@pytest.mark.slow
def test_eight_real_flink_jobs_are_collected_once_each_across_a_collector_restart(config, tmp_path):
    from infra.flink_cluster import LocalFlinkCluster, ensure_flink_runtime

    config.state_dir = tmp_path / "state"
    config.lab.flink_venv = PROJECT_ROOT / ".venv-flink"
    # The lab creates the Flink virtualenv (another process may be doing so right now): wait for it.
    marker = Path(config.lab.flink_venv) / f".installed-apache-flink-{config.lab.flink_version}"
    wait_for(marker.is_file, 1200, every_s=5)
    config.lab.rest_port, config.lab.rpc_port = free_port(), free_port()
    config.lab.taskmanager_slots = JOBS
    config.lab.taskmanager_memory = "2048m"
    config.collector.state_dir = tmp_path / "collector"
    config.collector.interval_s = 1.0
    config.collector.max_concurrent_requests = 8
    cluster = LocalFlinkCluster(config, ensure_flink_runtime(config))
    cluster.start()
    try:
        cluster.submit_python(JOB_SCRIPT, ["--jobs", str(JOBS), "--prefix", "fleet", "--checkpoint-interval-ms", "1000"])

        def all_running() -> bool:
            with urllib.request.urlopen(f"{cluster.rest_url}/jobs/overview", timeout=5) as answer:
                jobs = json.load(answer)["jobs"]
            return sum(job["state"] == "RUNNING" for job in jobs) == JOBS

        wait_for(all_running, 120, every_s=1)
        endpoint = FlinkClusterEndpoint(name="real", rest_url=cluster.rest_url)
        first = collect(config, endpoint, polls=4)
        restart_at = int(time.time() * 1000)
        time.sleep(4)  # the collector is down: the jobs' checkpoints go on
        second = collect(config, endpoint, polls=4)  # a new process: only the ledger remembers
    finally:
        cluster.stop()

    assert all(r.reachable for r in first + second), [r.errors for r in first + second]
    consumer = kafka_clients.make_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    try:
        events = [json.loads(r.value) for r in kafka_clients.read_records(consumer, config.topics.input, timeout_s=30)]
    finally:
        consumer.close()
    events = [e for e in events if e["cluster"] == "real"]
    assert events and all(INPUT.errors(e) == [] for e in events)
    jobs = {e["job_id"] for e in events}
    assert len(jobs) == JOBS
    for job in jobs:
        mine = [e for e in events if e["job_id"] == job]
        ids = [e["checkpoint_id"] for e in mine if e["kind"] == "checkpoint"]
        assert len(ids) == len(set(ids)), f"job {job}: a checkpoint published twice: {sorted(ids)}"
        assert sorted(ids) == list(range(1, max(ids) + 1)), f"job {job}: checkpoints missed: {sorted(ids)}"
        last_status = max((e for e in mine if e["kind"] == "job_status"), key=lambda e: e["ts"])
        assert max(ids) >= last_status["checkpoints_completed_total"]
        # Some of the job's checkpoints finished while the collector was down, and were published after.
        assert any(e["ts"] > restart_at for e in mine if e["kind"] == "checkpoint")
        samples = [e for e in mine if e["kind"] == "vertex_metrics"]
        assert samples and {e["vertex_name"] for e in samples}  # the running job's vertices were sampled
        completed = [e for e in mine if e["kind"] == "checkpoint" and e["status"] == "COMPLETED"]
        assert completed and all(e["vertices"] for e in completed)  # each with its vertices' details
