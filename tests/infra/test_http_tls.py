"""The sentinel's HTTP clients against servers that require TLS and authentication, as production
runs them: Alertmanager 0.25 (Debian's) with a ``--web.config.file`` requiring a client
certificate and basic auth, and a lab Flink cluster whose REST API has ``security.ssl.rest.enabled``
with mutual TLS. Each client is configured from the typed config only (secrets from files), and a
client without what the server requires is refused with an error naming the key to set.
"""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
import uuid

import bcrypt
import pytest
import yaml

from pipelines.collector import ClusterCollector
from pipelines.config import FlinkClusterEndpoint, load_config
from tests.conftest import PROJECT_ROOT, config_for
from tests.helpers.alertmanager import Alertmanager, Webhook, of_incident
from tests.helpers.certificates import make_certificates
from tests.helpers.cli import environment_without_settings
from tests.helpers.flink_tls import TlsFlinkCluster, tls_flink_config
from tests.helpers.incidents import skew_incident
from tests.helpers.topics import publish_incidents
from tests.helpers.waiting import wait_for

# Unique, so that finding it in an output can only mean it leaked.
PASSWORD = f"am-password-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture(scope="module")
def secured_alertmanager(certificates, tmp_path_factory):
    folder = tmp_path_factory.mktemp("secured-alertmanager")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    web_config = folder / "web.yml"
    web_config.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(certificates.path("server.pem")),
                              "key_file": str(certificates.path("server.key")),
                              "client_auth_type": "RequireAndVerifyClientCert",
                              "client_ca_file": str(certificates.path("ca.pem"))},
        "basic_auth_users": {"sentinel": hashed}}))
    context = ssl.create_default_context(cafile=str(certificates.path("ca.pem")))
    context.load_cert_chain(str(certificates.path("client.pem")), str(certificates.path("client.key")))
    header = {"Authorization": "Basic " + base64.b64encode(f"sentinel:{PASSWORD}".encode()).decode()}
    webhook = Webhook()
    manager = Alertmanager(folder, webhook, web_config=web_config, client=(context, header))
    manager.start()
    yield manager
    manager.stop()
    webhook.server.shutdown()


def relay_env(config, certificates, folder, **security: str) -> dict[str, str]:
    """`sentinel alert`'s environment: the test's topic and group, and ``alert.security.<key>``."""
    (folder / "am-password").write_text(PASSWORD + "\n")
    env = {**environment_without_settings(), "SENTINEL_STATE_DIR": str(folder),
           "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
           "SENTINEL_TOPICS__INCIDENTS": config.topics.incidents,
           "SENTINEL_ALERT__GROUP_ID": f"sentinel-alert-{uuid.uuid4().hex[:8]}",
           "SENTINEL_ALERT__METRICS_PORT": "0", "SENTINEL_ALERT__RESEND_INTERVAL_S": "1"}
    return env | {f"SENTINEL_ALERT__SECURITY__{key.upper()}": value for key, value in security.items()}


def full_security(certificates, folder) -> dict[str, str]:
    return {"ca_file": str(certificates.path("ca.pem")), "cert_file": str(certificates.path("client.pem")),
            "key_file": str(certificates.path("client.key")), "username": "sentinel",
            "password_file": str(folder / "am-password")}


def run_alert(env: dict[str, str], url: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "alert", "--alertmanager", url], cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout_s)


def test_the_relay_delivers_over_mutual_tls_with_basic_auth_from_the_config(config, certificates,
                                                                             secured_alertmanager, tmp_path):
    opened, _, _ = skew_incident("tls-j1")
    publish_incidents(config.kafka, config.topics.incidents, [opened])
    env = relay_env(config, certificates, tmp_path, **full_security(certificates, tmp_path))
    relay = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "alert", "--alertmanager", secured_alertmanager.url],
                             cwd=PROJECT_ROOT, env=env, stdout=open(tmp_path / "relay.out", "wb"),
                             stderr=subprocess.STDOUT)
    try:
        (alert,) = wait_for(lambda: relay.poll() is None and of_incident(secured_alertmanager.alerts(), opened)
                            or (relay.poll() is not None and pytest.fail((tmp_path / "relay.out").read_text())),
                            timeout_s=90, every_s=0.5, what="the incident's alert in the secured Alertmanager")
        assert alert["labels"]["alertname"] == "FlinkSkew" and alert["labels"]["job_id"] == "tls-j1"
    finally:
        relay.terminate()
        relay.wait(30)
    assert PASSWORD not in (tmp_path / "relay.out").read_text()


@pytest.mark.parametrize("missing, named", [
    ("cert_file", "alert.security.cert_file"),
    ("username", "alert.security.username and alert.security.password"),
    ("ca_file", "alert.security.ca_file"),
])
def test_a_relay_without_what_alertmanager_requires_is_refused_naming_the_key(config, certificates,
                                                                               secured_alertmanager, tmp_path,
                                                                               missing, named):
    security = full_security(certificates, tmp_path)
    del security[missing]
    if missing == "cert_file":
        del security["key_file"]
    if missing == "username":
        del security["password_file"]
    result = run_alert(relay_env(config, certificates, tmp_path, **security), secured_alertmanager.url)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no Alertmanager is reachable" in result.stderr and named in result.stderr, result.stderr
    assert PASSWORD not in result.stdout + result.stderr


@pytest.fixture(scope="module")
def tls_flink(certificates, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls-flink")
    cluster = TlsFlinkCluster(tls_flink_config(config_for(folder), folder), certificates)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def collector_for(url: str, folder, **security) -> ClusterCollector:
    config = load_config(environ={"SENTINEL_STATE_DIR": str(folder), "SENTINEL_COLLECTOR__RETRIES": "0",
                                  **{f"SENTINEL_COLLECTOR__SECURITY__{k.upper()}": v for k, v in security.items()}})
    return ClusterCollector(FlinkClusterEndpoint(name="tls", rest_url=url), config.collector, lambda events: None)


def test_the_collector_polls_flink_over_mutual_tls(tls_flink, certificates, tmp_path):
    collector = collector_for(tls_flink.rest_url, tmp_path, ca_file=str(certificates.path("ca.pem")),
                              cert_file=str(certificates.path("client.pem")),
                              key_file=str(certificates.path("client.key")))
    result = collector.poll()
    assert result.reachable and result.errors == [], result.errors
    assert result.requests >= 1 and result.jobs == 0  # the REST API answered: a cluster with no job yet
    # The same cluster in plain HTTP does not answer: the REST API is TLS only.
    plain = collector_for(tls_flink.rest_url.replace("https:", "http:"), tmp_path).poll()
    assert not plain.reachable and "use an https:// rest_url" in plain.errors[0], plain.errors


@pytest.mark.parametrize("given, named", [
    ({"ca_file": "ca.pem"}, "collector.security.cert_file"),
    ({"cert_file": "client.pem", "key_file": "client.key"}, "collector.security.ca_file"),
    ({"ca_file": "other.pem", "cert_file": "client.pem", "key_file": "client.key"}, "collector.security.ca_file"),
])
def test_a_collector_without_what_flink_requires_is_refused_naming_the_key(tls_flink, certificates, tmp_path,
                                                                            given, named):
    collector = collector_for(tls_flink.rest_url, tmp_path,
                              **{key: str(certificates.path(name)) for key, name in given.items()})
    result = collector.poll()
    assert not result.reachable
    assert named in result.errors[0], result.errors
