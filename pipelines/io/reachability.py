"""Is each configured service there? Bounded probes of MLflow, Alertmanager and Flink's REST API,
and the one place that caps MLflow's own HTTP retries.

A command probes what it needs before it starts its work, so that a service that is down ends
the command within seconds with the key to fix (:class:`~pipelines.errors.DependencyUnreachable`),
instead of after a client's minutes of retries. ``sentinel status`` reports every probe.
Standard library only: a probe must not cost the imports of the client it stands in for.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit

from pipelines.errors import DependencyUnreachable

# MLflow's HTTP client retries for minutes by default (seven tries with a growing backoff). A
# command fails within seconds instead, and the live job would rather score with what it holds.
MLFLOW_HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                      "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
PROBE_TIMEOUT_S = 5.0


def cap_mlflow_retries() -> None:
    """Set MLflow's HTTP retry and timeout limits, unless the environment sets its own. Before
    Spark starts, so its Python workers inherit them too."""
    for name, value in MLFLOW_HTTP_LIMITS.items():
        os.environ.setdefault(name, value)


@dataclass(frozen=True)
class Probe:
    """One service's answer: ``ok``, and what it said (an HTTP status) or why it did not."""

    service: str
    where: str
    key: str
    ok: bool
    detail: str
    seconds: float

    def line(self) -> str:
        return f"{self.service:<13} {'reachable' if self.ok else 'UNREACHABLE':<11} {self.where}  ({self.detail})"

    def raise_if_down(self, hint: str = "") -> None:
        if not self.ok:
            raise DependencyUnreachable(self.service, self.where, self.key, self.detail, hint)


def probe_http(service: str, url: str, key: str, path: str = "", timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """GET ``url`` + ``path``: any HTTP answer, an error status too, means something serves there."""
    started = time.monotonic()
    target = url.rstrip("/") + path
    try:
        with urllib.request.urlopen(urllib.request.Request(target, method="GET"), timeout=timeout_s) as response:
            ok, detail = True, f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        ok, detail = True, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", exc)
        ok, detail = False, _reason(reason, timeout_s)
    return Probe(service, url, key, ok, detail, time.monotonic() - started)


def probe_tcp(service: str, host_port: str, key: str, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    started = time.monotonic()
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            ok, detail = True, "accepts connections"
    except OSError as exc:
        ok, detail = False, _reason(exc, timeout_s)
    return Probe(service, host_port, key, ok, detail, time.monotonic() - started)


def _reason(exc: object, timeout_s: float) -> str:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"no answer within {timeout_s:g}s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"unknown host: {exc.strerror}"
    return str(getattr(exc, "strerror", None) or exc)[:200]


def mlflow_probes(tracking_uri: str | None, registry_uri: str | None) -> list[Probe]:
    """The tracking server and, when it is another, the registry; none for a store MLflow opens
    in-process (sqlite, a folder), which has nothing to be unreachable."""
    probes = []
    for key, uri in (("mlflow.tracking_uri", tracking_uri), ("mlflow.registry_uri", registry_uri)):
        if uri and urlsplit(uri).scheme in ("http", "https") and uri not in [p.where for p in probes]:
            env = "SENTINEL_" + key.upper().replace(".", "__")
            probes.append(probe_http("mlflow", uri, f"{key} ({env})", "/health"))
    return probes


def check_mlflow(tracking_uri: str | None, registry_uri: str | None) -> None:
    """Raise :class:`DependencyUnreachable` naming the key when a tracking or registry server does not answer."""
    cap_mlflow_retries()
    for probe in mlflow_probes(tracking_uri, registry_uri):
        probe.raise_if_down("(or start the tracking server)")


def alertmanager_probes(urls: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> list[Probe]:
    return [probe_http("alertmanager", url, "alert.alertmanager_urls (SENTINEL_ALERT__ALERTMANAGER_URLS) or "
                       "--alertmanager", "/api/v2/status", timeout_s) for url in urls]


def flink_probe(name: str, rest_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    return probe_http(f"flink {name}", rest_url, f"the rest_url of cluster {name!r} in collector.clusters",
                      "/overview", timeout_s)


def kafka_probe(bootstrap_servers: str, client_options: dict, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """A metadata request, as the job's clients make it (TLS, SASL): a port that takes connections
    is not yet a broker that answers."""
    from pipelines.io import kafka_clients

    key = "kafka.bootstrap_servers (SENTINEL_KAFKA__BOOTSTRAP_SERVERS), kafka.security"
    started = time.monotonic()
    options = {**client_options, "request_timeout_ms": int(timeout_s * 1000),
               "bootstrap_timeout_ms": int(timeout_s * 1000)}
    try:
        kafka_clients.check_reachable(bootstrap_servers, timeout_s)
        admin = kafka_clients.make_admin(bootstrap_servers, options)
        try:
            cluster = admin.describe_cluster()
        finally:
            admin.close()
        ok, detail = True, f"metadata: {len(cluster.get('brokers', []))} broker(s)"
    except Exception as exc:  # whatever the client raises, the answer is "no answer"
        text = (str(exc).splitlines() or [type(exc).__name__])[0]
        # KafkaUnavailable's own advice follows its cause; the status line keeps the cause.
        ok, detail = False, text.split(" is unreachable (", 1)[-1].split("). ", 1)[0][:200]
    return Probe("kafka", bootstrap_servers, key, ok, detail, time.monotonic() - started)


def service_probes(config) -> list[Probe]:
    """Every service the config names, probed one after the other: the broker, MLflow's servers,
    each Alertmanager, each Flink cluster of the collector."""
    probes = [kafka_probe(config.kafka.bootstrap_servers, config.kafka.client_kwargs())]
    probes += mlflow_probes(config.mlflow.tracking_uri, config.mlflow.registry_uri)
    probes += alertmanager_probes(list(config.alert.alertmanager_urls))
    probes += [flink_probe(c.name, c.rest_url) for c in config.collector.clusters]
    return probes
