"""Degraded dependencies, black box against the real stack (real Spark, real MLflow, real Tansu).

- The model registry down while the job's Python workers start afresh (after a crash, or Spark's
  stop of an idle one): the job scores on with the champions it held.
- A family's champion that fails to load (its artifacts gone) or gives NaN scores: that family is
  blind, the metrics and the log name it, and every other family publishes its incidents.
- The broker cut mid-run and back: the metric says so within a minute, and every record sent
  before, during and after is processed by the same running query.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from infra.embedded_stack import free_port, mlflow_healthy, port_in_use, stop_process_group, tansu_binary
from pipelines.contracts import input_event_key
from pipelines.detection.champions import ChampionCache
from pipelines.detection.flink_job import replay
from pipelines.detection.job import start_detection
from pipelines.io import kafka_clients
from tests.helpers.detection_job import detection_config_for, fleet, fleet_events, key, publish, read_topic, write_jsonl
from tests.helpers.waiting import wait_for
from tests.helpers.metrics import sample_key, scrape

SEED = 7


def metric(job, name: str, **labels: str) -> float | None:
    """One sample of the running job's /metrics, None while it has none."""
    return scrape(job.metrics_server.url).get(sample_key(f"checkpoint_sentinel_{name}", **labels))


def records_committed(config) -> int:
    """How many input records the detection query's committed batches have read (their end
    offsets, summed over the partitions), from its checkpoint."""
    folder = Path(config.checkpoint_dir("detection").uri)
    commits = [int(p.name) for p in (folder / "commits").iterdir() if p.name.isdigit()] \
        if (folder / "commits").is_dir() else []
    if not commits:
        return 0
    lines = (folder / "offsets" / str(max(commits))).read_text().splitlines()
    return sum(json.loads(lines[-1]).values())


def expected_incidents(config, champions, events, folder: Path):
    """What replaying ``events`` with ``champions`` publishes (the live job must publish the same)."""
    return replay(config, [write_jsonl(folder / "events.jsonl", events)], champions).incidents


# --- the registry down, Python workers started afresh ----------------------------------------------


def python_workers() -> set[int]:
    """The Python workers of this test process's Spark (forked by the daemons its JVM started; a
    worker's command line is its daemon's): their process ids."""
    processes: dict[int, tuple[int, bytes]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                processes[int(entry.name)] = parent, (entry / "cmdline").read_bytes()
            except (OSError, IndexError, ValueError):
                continue
    jvms = {pid for pid, (parent, command) in processes.items() if parent == os.getpid() and b"java" in command}
    daemons = {pid for pid, (parent, command) in processes.items() if parent in jvms and b"pyspark.daemon" in command}
    return {pid for pid, (parent, _) in processes.items() if parent in daemons}


@pytest.fixture
def registry_server(trained_store, tmp_path):
    """``mlflow server`` over the session's champions' store: ``(url, process)``; the test kills it."""
    port, log = free_port(), tmp_path / "mlflow-server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", trained_store.mlflow.tracking_uri,
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while not mlflow_healthy(url):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield url, server
    finally:
        stop_process_group(server.pid)


def test_with_the_registry_down_fresh_python_workers_score_with_the_champions_the_job_holds(
        spark, broker_config, trained_store, registry_server, tmp_path, monkeypatch):
    from pipelines import simulator

    url, server = registry_server
    config = detection_config_for(broker_config, trained_store, tmp_path)
    config.mlflow.tracking_uri = config.mlflow.registry_uri = url
    config.detection.keep_workers_warm_s = None  # Spark stops the idle Python workers after a minute
    job_a = simulator.simulate_job("leak_seed000", SEED, 0, 4 * 60_000, cluster="e2e")
    job_b = simulator.simulate_job("leak_seed000", SEED, 1, 4 * 60_000, cluster="e2e",
                                   start_ts=job_a.events[-1]["ts"] + 60_000)

    def leak_published(job) -> bool:
        return any(i["job_id"] == job.truth["job_id"] and i["family"] == "state_leak"
                   for i in read_topic(config, config.topics.incidents))

    running = start_detection(spark, config, ChampionCache(config))
    try:
        publish(config, job_a.events)
        wait_for(lambda: leak_published(job_a), 240)
        scored_before = python_workers()
        assert scored_before

        os.killpg(server.pid, signal.SIGKILL)  # the registry is gone: the server and its workers
        server.wait()
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=5)
        # Spark stops a Python worker idle for a minute: the next micro-batch's are started afresh,
        # with the registry down.
        wait_for(lambda: not (scored_before & python_workers()), 150, every_s=5)

        publish(config, job_b.events)
        wait_for(lambda: leak_published(job_b) or not running.query.isActive, 240)
        assert running.query.isActive, f"the query stopped: {running.query.exception()}"
        assert leak_published(job_b)
    finally:
        running.stop()
    champion = ChampionCache(trained_store).require()["state_leak"].version
    leaks = [i for i in read_topic(config, config.topics.incidents) if i["job_id"] == job_b.truth["job_id"]]
    assert {i["model"]["version"] for i in leaks} == {champion}  # the champion the job held, not another

    # `sentinel run` itself restarted while the registry is still down resumes with the held champions.
    from pipelines.cli import _require_champions

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    restarted = _require_champions(config, held=True)
    assert restarted.models["state_leak"].version == champion and restarted.registry_error is not None
    assert restarted.sources["state_leak"] == "held copy"


# --- a family's champion that fails to load, another's that scores NaN ------------------------------


def _model_artifacts(name: str, version: str) -> Path:
    from urllib.parse import unquote, urlparse

    from mlflow import MlflowClient

    client = MlflowClient()
    source = client.get_model_version(name, version).source  # models:/<model id>
    return Path(unquote(urlparse(client.get_logged_model(source.rsplit("/", 1)[-1]).artifact_location).path))


def _register_copy(config, family: str, detector, suffix: str) -> str:
    """``detector`` (with the family champion's post-rule) registered as this test's own model of
    ``family`` and made its champion; returns the registered name."""
    import mlflow
    import pandas as pd

    from models import registry

    champion = registry.load_detector(getattr(config.mlflow.models, family), "champion")
    name = f"faults-{family}-{suffix}"
    rows = pd.DataFrame([[0.0] * len(champion.config.features)], columns=list(champion.config.features))
    registry.ensure_experiment(config)
    with mlflow.start_run():
        version = registry.log_detector(detector, champion.post_rule, rows, name)
    registry.set_alias(name, "champion", version)
    setattr(config.mlflow.models, family, name)
    return name


def test_a_champion_that_fails_to_load_or_scores_nan_blinds_its_family_alone_loudly(
        spark, broker_config, trained_store, tmp_path, caplog):
    import logging

    from models import registry

    config = detection_config_for(broker_config, trained_store, tmp_path)
    jobs = fleet(["leak_linear", "checkpoint_storage_errors", "backpressure_slow_operator"], SEED + 1, 60)
    events = fleet_events(jobs)
    expected = expected_incidents(config, ChampionCache(config).require(), events, tmp_path)
    assert {"state_leak", "checkpoint_failure", "backpressure"} <= {i["family"] for i in expected}

    suffix = config.topics.input
    registry.use_config(config)
    # State leak: a champion whose artifacts are gone (a cleaned-up bucket, a lost volume).
    leak = registry.load_detector(config.mlflow.models.state_leak, "champion")
    leak_name = _register_copy(config, "state_leak", leak.detector, suffix)
    import shutil
    shutil.rmtree(_model_artifacts(leak_name, registry.alias_version(leak_name, "champion")))
    # Backpressure: a corrupted champion whose every score is NaN.
    backpressure = copy.deepcopy(registry.load_detector(config.mlflow.models.backpressure, "champion").detector)
    backpressure.model._baseline_prediction = np.full_like(backpressure.model._baseline_prediction, np.nan)
    _register_copy(config, "backpressure", backpressure, suffix)

    publish(config, events)
    with caplog.at_level(logging.ERROR):
        running = start_detection(spark, config, ChampionCache(config), available_now=True)
        try:
            running.await_termination(900)
            scraped = scrape(running.metrics_server.url)
        finally:
            running.stop()

    published = read_topic(config, config.topics.incidents)
    healthy = [i for i in expected if i["family"] not in ("state_leak", "backpressure")]
    assert healthy and set(map(key, healthy)) <= set(map(key, published))  # the others go on, all of it
    assert {i["family"] for i in published} <= {i["family"] for i in healthy}  # the blind ones publish nothing

    def value(name: str, family: str) -> float | None:
        return scraped.get(sample_key(f"checkpoint_sentinel_{name}", family=family))

    assert value("model_load_failures_total", "state_leak") >= 1
    assert value("model_scoring", "state_leak") == 0
    assert value("model_nan_scores_total", "backpressure") > 0
    assert value("model_scoring", "backpressure") == 0
    assert value("model_scoring", "checkpoint_failure") == 1
    assert not value("model_load_failures_total", "checkpoint_failure")
    said = caplog.text
    assert "state_leak is NOT scored" in said and "backpressure is NOT scored" in said


# --- the broker cut mid-run and restored -------------------------------------------------------------


class TcpProxy:
    """Forwards ``127.0.0.1:listen_port`` to ``127.0.0.1:target_port``. ``cut()`` closes every
    connection and stops listening (a client is refused, as with a broker gone); ``restore()``
    listens again. The broker behind it keeps running, and its in-memory topics with it."""

    def __init__(self, listen_port: int, target_port: int):
        self.listen_port, self.target_port = listen_port, target_port
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._server: socket.socket | None = None

    def start(self) -> "TcpProxy":
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.listen_port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()
        return self

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way
        except OSError:
            pass
        self._server.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for end in sockets:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()

    def restore(self) -> None:
        self.start()


@pytest.fixture
def broker_behind_proxy(tmp_path):
    """A Tansu broker of this test's own listening on one port and advertising another, where a
    :class:`TcpProxy` forwards to it: ``(the address clients use, the proxy)``."""
    listen, advertised = free_port(), free_port()
    log = tmp_path / "tansu.log"
    with open(log, "wb") as out:
        broker = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", f"tcp://127.0.0.1:{listen}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{advertised}", "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not port_in_use("127.0.0.1", listen):
            assert broker.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        proxy = TcpProxy(advertised, listen).start()
        yield f"127.0.0.1:{advertised}", proxy
        proxy.cut()
    finally:
        stop_process_group(broker.pid)


def test_a_broker_cut_mid_run_is_seen_within_a_minute_and_the_job_reads_on_without_loss(
        spark, broker_config, trained_store, broker_behind_proxy, tmp_path):
    address, proxy = broker_behind_proxy
    behind_proxy = broker_config.model_copy(deep=True)
    behind_proxy.kafka.bootstrap_servers = address
    config = detection_config_for(behind_proxy, trained_store, tmp_path)
    jobs = fleet(["leak_linear", "checkpoint_storage_errors", "skew_hot_key"], SEED + 1, 40)
    events = fleet_events(jobs)
    expected = expected_incidents(config, ChampionCache(config).require(), events, tmp_path)
    assert expected, "the fleet must raise incidents for this test to mean anything"
    before, during, after = events[:len(events) // 3], events[len(events) // 3:2 * len(events) // 3], \
        events[2 * len(events) // 3:]

    running = start_detection(spark, config, ChampionCache(config))
    try:
        publish(config, before)
        wait_for(lambda: records_committed(config) == len(before), 240)
        assert metric(running, "broker_reachable") == 1
        contact = metric(running, "broker_last_contact_timestamp_seconds")
        assert contact is not None and time.time() - contact < 30
        # A producer made while the broker is there, as the collector's is: what it sends during
        # the cut waits in it and goes out when the broker is back.
        producer = kafka_clients.make_producer(address, {}, delivery_timeout_ms=600_000, max_block_ms=600_000,
                                               request_timeout_ms=10_000)

        proxy.cut()
        cut_at = time.monotonic()
        for event in during:
            producer.send(config.topics.input, key=input_event_key(event), value=json.dumps(event).encode())
        wait_for(lambda: metric(running, "broker_reachable") == 0, 60, every_s=1)
        seen_after_s = time.monotonic() - cut_at
        time.sleep(max(0.0, 75 - (time.monotonic() - cut_at)))
        assert running.query.isActive, f"the query stopped during the cut: {running.query.exception()}"

        proxy.restore()
        restored_at = time.monotonic()
        wait_for(lambda: metric(running, "broker_reachable") == 1, 60, every_s=1)
        back_after_s = time.monotonic() - restored_at
        producer.flush(timeout=120)
        producer.close()
        publish(config, after)
        wait_for(lambda: records_committed(config) == len(events) or not running.query.isActive, 300)
        assert running.query.isActive, f"the query stopped after the cut: {running.query.exception()}"
        assert records_committed(config) == len(events)  # every record, before, during and after
        published = read_topic(config, config.topics.incidents)
    finally:
        running.stop()
    assert seen_after_s < 60 and back_after_s < 60
    assert set(map(key, expected)) <= set(map(key, published))  # none lost; repeats are allowed
    assert {i["incident_id"] for i in published} == {i["incident_id"] for i in expected}


def test_a_read_under_way_when_the_broker_goes_waits_for_it_and_reads_on(broker_behind_proxy):
    """A Spark task reading its offsets when the broker goes: it does not give up after the poll
    timeout (which would fail the micro-batch and stop the query), it reads on once the broker is
    back."""
    from pipelines.io.kafka_source import KafkaPartitionRange, _ClientSpec, read_ranges

    address, proxy = broker_behind_proxy
    topic = "cut-mid-read"
    kafka_clients.ensure_topics(address, {}, [topic], 1)
    spec = _ClientSpec(address, "{}")

    def produce(values: range) -> None:
        producer = kafka_clients.make_producer(address, {})
        for i in values:
            producer.send(topic, value=str(i).encode())
        producer.flush()
        producer.close()

    produce(range(10))
    warm = list(read_ranges(spec, [KafkaPartitionRange(topic, 0, 0, 10)], True, poll_timeout_s=3.0))
    assert sum(batch.num_rows for batch in warm) == 10  # the worker's consumer is connected
    produce(range(10, 500))
    proxy.cut()
    outcome: dict = {}

    def read() -> None:
        try:
            batches = read_ranges(spec, [KafkaPartitionRange(topic, 0, 10, 500)], True, poll_timeout_s=3.0,
                                  broker_wait_s=300.0)
            outcome["values"] = [int(v) for batch in batches for v in batch.column("value").to_pylist()]
        except Exception as exc:  # what today's reader does after its poll timeout
            outcome["error"] = exc

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(15)
    assert reader.is_alive() and not outcome, outcome  # still waiting, well past the 3 s poll timeout
    proxy.restore()
    reader.join(120)
    assert outcome == {"values": list(range(10, 500))}
