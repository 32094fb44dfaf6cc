"""The detection job on a Spark standalone cluster, submitted as users deploy it.

A master and two workers are started from the pyspark distribution on loopback; the job goes in
with ``spark-submit --master spark://...`` (``infra/spark_submit_main.py run``), whose master must
win over the config's ``local[...]``. Events in, incidents out; a worker is killed mid-run and the
job goes on with the other: every incident a replay of the same events publishes is published.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest

from infra.embedded_stack import free_port
from pipelines import simulator
from pipelines.detection.champions import ChampionCache
from pipelines.detection.flink_job import replay
from tests.helpers.detection_job import (MINUTE, detection_config_for, fleet, fleet_events, job_environment, opened,
                                         publish, read_topic, write_jsonl)
from tests.helpers.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SPARK_HOME = str(Path(pyspark.__file__).parent)  # the distribution pip installed: bin/, jars/


def http_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@dataclass
class StandaloneCluster:
    url: str
    ui: str
    workers: list[subprocess.Popen]

    def status(self) -> dict:
        return http_json(f"{self.ui}/json/")

    def alive_workers(self) -> list[dict]:
        return [w for w in self.status()["workers"] if w["state"] == "ALIVE"]


def _reachable(url: str) -> bool:
    try:
        http_json(url)
        return True
    except OSError:
        return False


@pytest.fixture
def standalone_cluster(tmp_path):
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(tmp_path / "logs"), "PYSPARK_PYTHON": sys.executable}
    port, ui_port = free_port(), free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    started = [subprocess.Popen(
        [BIN / "spark-class", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(ui_port)],
        env=env, stdout=open(logs / "master.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)]
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", [])
    try:
        wait_for(lambda: _reachable(f"{cluster.ui}/json/"), 60, every_s=0.5)
        for i in range(2):
            worker = subprocess.Popen(
                [BIN / "spark-class", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--cores", "1", "--memory", "1536m", "--work-dir", str(tmp_path / f"worker-{i}"),
                 "--webui-port", str(free_port()), cluster.url],
                env=env, stdout=open(logs / f"worker-{i}.log", "wb"), stderr=subprocess.STDOUT,
                start_new_session=True)  # its own process group: the worker and the executors it starts
            started.append(worker)
            cluster.workers.append(worker)
        wait_for(lambda: len(cluster.alive_workers()) == 2, 60, every_s=0.5)
        yield cluster
    finally:
        for process in reversed(started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_the_job_runs_on_a_standalone_cluster_and_survives_losing_a_worker(spark, broker_config, trained_store,
                                                                          tmp_path, standalone_cluster):
    config = detection_config_for(broker_config, trained_store, tmp_path / "job")
    # Two fleets one after the other in event time: the first before the worker is lost, the
    # second after it, each with incidents of its own.
    before = fleet(["leak_linear", "skew_hot_key", "healthy_steady"], 23, 45)
    first_events = list(simulator.merged_events(before))
    after = [simulator.simulate_job("checkpoint_storage_errors", 23, 3, 45 * MINUTE, cluster="e2e",
                                    start_ts=first_events[-1]["ts"] + MINUTE)]
    second_events = fleet_events(after)
    events = first_events + second_events
    expected = replay(config, [write_jsonl(tmp_path / "all.jsonl", events)], ChampionCache(config).require())
    expected_ids = {i["incident_id"] for i in opened(expected.incidents)}
    after_ids = {i["incident_id"] for i in opened(expected.incidents) if i["job_id"] in {j.truth["job_id"] for j in after}}
    assert after_ids and expected_ids - after_ids, "each fleet must raise incidents for this test to mean anything"

    env = job_environment(config, SENTINEL_SPARK__MASTER="local[1]",  # spark-submit's --master must win
                          SPARK_HOME=SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYSPARK_PYTHON", None)  # the cluster's Python comes from spark-submit's settings alone
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    command = [BIN / "spark-submit", "--master", standalone_cluster.url, "--deploy-mode", "client",
               "--conf", f"spark.pyspark.python={sys.executable}",
               "--conf", f"spark.pyspark.driver.python={sys.executable}",
               "--driver-memory", "1g", "--executor-memory", "1g", "--executor-cores", "1",
               "--total-executor-cores", "2", ROOT / "infra" / "spark_submit_main.py", "run"]
    log_path = tmp_path / "submit.log"
    submitted = subprocess.Popen(command, env=env, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,
                                 start_new_session=True)

    def published_ids() -> set[str]:
        return {i["incident_id"] for i in opened(read_topic(config, config.topics.incidents))}

    try:
        def running_on_both_workers() -> bool:
            assert submitted.poll() is None, log_path.read_text()[-3000:]
            status = standalone_cluster.status()
            return (len(status["activeapps"]) == 1
                    and [w["coresused"] for w in status["workers"] if w["state"] == "ALIVE"] == [1, 1])
        wait_for(running_on_both_workers, 240, every_s=1)
        app = standalone_cluster.status()["activeapps"][0]
        assert app["name"].startswith(config.spark.app_name)

        publish(config, first_events)

        def first_fleet_published() -> bool:
            assert submitted.poll() is None, log_path.read_text()[-3000:]
            return expected_ids - after_ids <= published_ids()
        wait_for(first_fleet_published, 300)

        lost = standalone_cluster.workers[0]
        os.killpg(lost.pid, signal.SIGKILL)  # the worker and its executor, mid-run
        lost.wait()
        publish(config, second_events)

        def all_published() -> bool:
            assert submitted.poll() is None, log_path.read_text()[-3000:]
            return expected_ids <= published_ids()
        wait_for(all_published, 420)
        assert published_ids() == expected_ids  # and no incident the events do not call for
        assert len(standalone_cluster.status()["activeapps"]) == 1  # the same application, one worker down
    finally:
        if submitted.poll() is None:
            os.killpg(submitted.pid, signal.SIGKILL)
        submitted.wait()
