"""Every Kafka client of checkpoint-sentinel over mutual TLS, its secrets never in its words.

The embedded broker (Tansu 0.6.0, the build this project can install) cannot serve TLS itself:
``--cert`` and ``--key`` exclude each other and its listener stays plaintext. So TLS is
terminated in front of it by stunnel, a real TLS server (OpenSSL) that requires a client
certificate signed by the test's CA, the way a TLS proxy or a cloud load balancer fronts Kafka.
The broker advertises the TLS address, so every connection a client makes goes through TLS.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.embedded_stack import free_port, port_in_use, stop_process_group, tansu_binary
from pipelines.config import SentinelConfig, TopicsConfig, load_config
from pipelines.io import kafka_clients
from tests.conftest import debian_binary
from tests.helpers.cli import run_sentinel
from tests.pipelines.collector.flink_replay import RecordedFlink, recorded_polls
from tests.helpers.detection_job import fleet, fleet_events, publish, read_topic

# Unique, so that finding it anywhere can only mean it leaked.
KEY_PASSWORD = f"tls-key-password-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class TlsKafka:
    bootstrap_servers: str
    folder: Path

    def path(self, name: str) -> str:
        return str(self.folder / name)


def _certificates(openssl: str, folder: Path) -> None:
    """A CA, the broker's certificate for 127.0.0.1, and a client certificate whose key is encrypted."""
    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=sentinel-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (folder / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    (folder / "key-password").write_text(KEY_PASSWORD + "\n")
    run("req", "-newkey", "rsa:2048", "-keyout", "client.key", "-passout", "file:key-password",
        "-out", "client.csr", "-subj", "/CN=checkpoint-sentinel")
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "client.pem", "-days", "2")


@pytest.fixture(scope="module")
def tls_kafka(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls-kafka")
    _certificates(debian_binary("openssl", "openssl"), folder)
    stunnel = debian_binary("stunnel4", "stunnel4")
    plain_port, tls_port = free_port(), free_port()
    (folder / "stunnel.conf").write_text(
        "foreground = yes\npid =\n"
        "[kafka]\n"
        f"accept = 127.0.0.1:{tls_port}\nconnect = 127.0.0.1:{plain_port}\n"
        f"cert = {folder / 'server.pem'}\nkey = {folder / 'server.key'}\n"
        f"CAfile = {folder / 'ca.pem'}\nverifyChain = yes\nrequireCert = yes\n")
    with open(folder / "broker.log", "wb") as broker_log, open(folder / "stunnel.log", "wb") as stunnel_log:
        broker = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", f"tcp://127.0.0.1:{plain_port}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{tls_port}", "--storage-engine", "memory://tansu/"],
            stdout=broker_log, stderr=subprocess.STDOUT, start_new_session=True)
        proxy = subprocess.Popen([stunnel, str(folder / "stunnel.conf")], stdout=stunnel_log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (port_in_use("127.0.0.1", plain_port) and port_in_use("127.0.0.1", tls_port)):
            assert time.monotonic() < deadline, (folder / "broker.log").read_text() + (folder / "stunnel.log").read_text()
            assert broker.poll() is None and proxy.poll() is None, (folder / "stunnel.log").read_text()
            time.sleep(0.2)
        yield TlsKafka(f"127.0.0.1:{tls_port}", folder)
    finally:
        stop_process_group(proxy.pid)
        stop_process_group(broker.pid)


def _tls_environment(kafka: TlsKafka, state_dir: Path, **extra: str) -> dict[str, str]:
    """The settings a user gives for a broker that wants mutual TLS; the key's password from a file."""
    return {"SENTINEL_STATE_DIR": str(state_dir), "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "SENTINEL_KAFKA__CONNECT_TIMEOUT_S": "10",
            "SENTINEL_KAFKA__SECURITY__PROTOCOL": "SSL",
            "SENTINEL_KAFKA__SECURITY__SSL_CAFILE": kafka.path("ca.pem"),
            "SENTINEL_KAFKA__SECURITY__SSL_CERTFILE": kafka.path("client.pem"),
            "SENTINEL_KAFKA__SECURITY__SSL_KEYFILE": kafka.path("client.key"),
            "SENTINEL_KAFKA__SECURITY__SSL_KEY_PASSWORD_FILE": kafka.path("key-password"),
            "SENTINEL_DETECTION__METRICS_PORT": "0", "SENTINEL_COLLECTOR__METRICS_PORT": "0", **extra}


def _config(kafka: TlsKafka, state_dir: Path, **extra: str) -> SentinelConfig:
    """The same settings, for the test's own clients."""
    return load_config(environ=_tls_environment(kafka, state_dir, **extra), base_dir=state_dir)


def _assert_no_secret(outputs: list[subprocess.CompletedProcess], state_dir: Path) -> None:
    for result in outputs:
        assert KEY_PASSWORD not in result.stdout + result.stderr, result.args
    for path in state_dir.rglob("*"):
        if path.is_file():
            assert KEY_PASSWORD.encode() not in path.read_bytes(), f"the key's password is in {path}"


def test_selfcheck_and_the_collector_work_over_mutual_tls(tls_kafka, tmp_path):
    env = _tls_environment(tls_kafka, tmp_path, SENTINEL_TOPICS__INPUT=f"metrics-{uuid.uuid4().hex[:8]}")
    selfcheck = run_sentinel("selfcheck", "--events", "300", env=env, timeout=300)
    assert selfcheck.returncode == 0, selfcheck.stdout[-2000:] + selfcheck.stderr[-3000:]  # its verdict is on stdout
    assert "round trip OK: sent 300 events" in selfcheck.stdout

    with RecordedFlink(recorded_polls("leak")) as flink:
        collect = run_sentinel("collect", "--once", "--flink-rest", flink.url, "--cluster", "prod-eu", env=env,
                               timeout=300)
    assert collect.returncode == 0, collect.stderr[-3000:]
    assert "prod-eu: 1 jobs" in collect.stdout
    config = _config(tls_kafka, tmp_path, SENTINEL_TOPICS__INPUT=env["SENTINEL_TOPICS__INPUT"])
    published = read_topic(config, config.topics.input)
    assert {event["kind"] for event in published} == {"checkpoint", "vertex_metrics", "job_status"}
    assert {event["cluster"] for event in published} == {"prod-eu"}
    _assert_no_secret([selfcheck, collect], tmp_path)


def test_the_detection_job_and_the_incident_table_work_over_mutual_tls(tls_kafka, trained_store, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    topics = {"SENTINEL_TOPICS__INPUT": f"metrics-{suffix}", "SENTINEL_TOPICS__INCIDENTS": f"incidents-{suffix}",
              "SENTINEL_TOPICS__DEAD_LETTER": f"dlq-{suffix}"}
    config = _config(tls_kafka, tmp_path, **topics)
    assert config.topics == TopicsConfig(input=f"metrics-{suffix}", incidents=f"incidents-{suffix}",
                                         dead_letter=f"dlq-{suffix}")
    kafka_clients.ensure_topics(config.kafka.bootstrap_servers, config.kafka.client_kwargs(),
                                [config.topics.input, config.topics.incidents, config.topics.dead_letter], 3)
    publish(config, fleet_events(fleet(["skew_hot_key"], seed=7, minutes=30)))

    # This time the password comes from the environment, as a secret store's injector gives it.
    env = _tls_environment(tls_kafka, tmp_path, **topics, SENTINEL_KAFKA__SECURITY__SSL_KEY_PASSWORD_FILE="",
                           SENTINEL_KAFKA__SECURITY__SSL_KEY_PASSWORD=KEY_PASSWORD,
                           SENTINEL_MLFLOW__TRACKING_URI=trained_store.mlflow.tracking_uri,
                           SENTINEL_MLFLOW__REGISTRY_URI=trained_store.mlflow.registry_uri,
                           SENTINEL_SPARK__TRIGGER_INTERVAL="1 second")
    run = run_sentinel("run", "--available-now", env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    table = run_sentinel("incidents", "--from-beginning", "--output", "json", "--timeout", "10", env=env,
                         timeout=300)
    assert table.returncode == 0, table.stderr[-3000:]
    incidents = [json.loads(line) for line in table.stdout.splitlines() if line.startswith("{")]
    opened = [i for i in incidents if i["event"] == "opened" and i["cluster"] == "e2e"]
    assert "skew" in {i["family"] for i in opened}, incidents
    _assert_no_secret([run, table], tmp_path)


@pytest.mark.parametrize("leave_out, protocol, reasons", [
    # No client certificate. In TLS 1.3 the broker checks it after the client's side of the
    # handshake is done: the client reads the broker's alert, or, when the broker has already
    # closed the connection, an EOF (seen in a fresh clone's run). Either is the broker's refusal.
    (("SENTINEL_KAFKA__SECURITY__SSL_CERTFILE", "SENTINEL_KAFKA__SECURITY__SSL_KEYFILE",
      "SENTINEL_KAFKA__SECURITY__SSL_KEY_PASSWORD_FILE"), "SSL",
     ("certificate required", "EOF occurred in violation of protocol")),
    (("SENTINEL_KAFKA__SECURITY__SSL_CAFILE", "SENTINEL_KAFKA__SECURITY__SSL_CERTFILE",
      "SENTINEL_KAFKA__SECURITY__SSL_KEYFILE", "SENTINEL_KAFKA__SECURITY__SSL_KEY_PASSWORD_FILE"), "PLAINTEXT",
     ("Connection reset by peer",)),
])
def test_a_client_the_broker_does_not_accept_stops_with_what_to_set(tls_kafka, tmp_path, leave_out, protocol, reasons):
    env = {k: v for k, v in _tls_environment(tls_kafka, tmp_path, SENTINEL_KAFKA__CONNECT_TIMEOUT_S="3").items()
           if k not in leave_out}
    result = run_sentinel("incidents", "--timeout", "1", env={**env, "SENTINEL_KAFKA__SECURITY__PROTOCOL": protocol},
                       timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    # One message, with the broker's reason from kafka-python's last try, not a traceback per retry.
    assert f"Kafka at {tls_kafka.bootstrap_servers} is unreachable (tries failed with: KafkaConnectionError:" in result.stderr
    assert any(reason in result.stderr for reason in reasons), result.stderr
    assert "kafka.security" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""  # not even the table's header before the error
