"""The lab's Flink cluster with its REST API behind mutual TLS (``security.ssl.rest.*``): its own
ports, its own state folder, and a watchdog that stops it if the test process dies first (another
cluster may be recording lab runs on the default ports meanwhile)."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from infra.embedded_stack import free_port
from infra.flink_cluster import LocalFlinkCluster, ensure_flink_runtime
from pipelines.config import SentinelConfig
from tests.champions import PROJECT_ROOT
from tests.helpers.certificates import STORE_PASSWORD, Certificates, java_stores
from tests.helpers.waiting import wait_for

# Kills the process groups named on the command line once the given parent is gone.
_WATCHDOG = """
import os, sys, time
parent, groups = int(sys.argv[1]), [int(g) for g in sys.argv[2:]]
while os.getppid() == parent:
    time.sleep(2)
for group in groups:
    try:
        os.killpg(group, 9)
    except OSError:
        pass
"""


class TlsFlinkCluster(LocalFlinkCluster):
    """A :class:`~infra.flink_cluster.LocalFlinkCluster` whose REST endpoint requires a client
    certificate signed by the test CA; the cluster's own calls use the server's certificate."""

    def __init__(self, config: SentinelConfig, certificates: Certificates):
        super().__init__(config, ensure_flink_runtime(config))
        self.certificates = certificates
        self.keystore, self.truststore = java_stores(certificates)
        self.client_context = ssl.create_default_context(cafile=str(certificates.path("ca.pem")))
        self.client_context.load_cert_chain(str(certificates.path("client.pem")), str(certificates.path("client.key")))
        self.watchdog: subprocess.Popen | None = None

    @property
    def rest_url(self) -> str:
        return f"https://127.0.0.1:{self.config.lab.rest_port}"

    def write_conf(self) -> Path:
        path = super().write_conf()
        tls = {"security.ssl.rest.enabled": "true", "security.ssl.rest.authentication-enabled": "true",
               "security.ssl.rest.keystore": str(self.keystore), "security.ssl.rest.keystore-type": "PKCS12",
               "security.ssl.rest.keystore-password": STORE_PASSWORD, "security.ssl.rest.key-password": STORE_PASSWORD,
               "security.ssl.rest.truststore": str(self.truststore), "security.ssl.rest.truststore-type": "PKCS12",
               "security.ssl.rest.truststore-password": STORE_PASSWORD}
        with open(path, "a") as conf:
            conf.writelines(f"{key}: {json.dumps(value)}\n" for key, value in tls.items())
        return path

    def _request(self, method: str, path: str, timeout: float = 5.0) -> dict | None:
        request = urllib.request.Request(self.rest_url + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.client_context) as response:
                body = response.read()
        except (urllib.error.URLError, OSError):
            return None
        return json.loads(body) if body else {}

    def start(self) -> str:
        started = super().start()
        self.watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()),
                                          *map(str, self.pids().values())], start_new_session=True)
        return started

    def stop(self) -> list[str]:
        stopped = super().stop()
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait(10)
            self.watchdog = None
        return stopped


def tls_flink_config(config: SentinelConfig, folder: Path) -> SentinelConfig:
    """``config`` with a state folder and REST and RPC ports of its own, and the smallest cluster
    that serves the REST API (no job runs on it)."""
    config = config.model_copy(deep=True)
    config.state_dir = folder
    config.lab.flink_venv = PROJECT_ROOT / ".venv-flink"
    # A virtualenv without its marker is being made by another test (the lab's): wait for it. None
    # at all: TlsFlinkCluster makes it (ensure_flink_runtime), as the lab's test would.
    marker = Path(config.lab.flink_venv) / f".installed-apache-flink-{config.lab.flink_version}"
    if Path(config.lab.flink_venv).exists():
        wait_for(marker.is_file, 1200, every_s=5, what="the Flink virtualenv")
    config.lab.rest_port, config.lab.rpc_port = free_port(), free_port()
    config.lab.taskmanager_slots = 2
    config.lab.jobmanager_memory, config.lab.taskmanager_memory = "1024m", "1024m"
    config.lab.taskmanager_metaspace = "256m"
    config.lab.startup_timeout_s = 300  # a loaded machine: the JobManager alone took a minute
    return config
