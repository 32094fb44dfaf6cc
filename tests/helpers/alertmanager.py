"""A real Alertmanager (Debian's prometheus-alertmanager) with the shipped config, its receivers
pointed at a webhook the test reads: what on-call would be paged with."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from infra.embedded_stack import free_port
from tests import debian
from tests.champions import PROJECT_ROOT

SHIPPED_CONFIG = PROJECT_ROOT / "infra" / "alertmanager" / "alertmanager.yml"


def alertmanager_binary(name: str) -> str:
    """``prometheus-alertmanager`` or ``amtool`` (installed from Debian when missing)."""
    if name == "amtool":  # shipped beside prometheus-alertmanager, by the same package
        found = shutil.which("amtool", path=str(Path(debian.binary("prometheus-alertmanager")).parent))
        assert found, "amtool is missing although prometheus-alertmanager is installed"
        return found
    return debian.binary(name)


class Webhook:
    """The receiver Alertmanager notifies: what on-call would be paged with."""

    def __init__(self):
        self.notifications: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                hook.notifications.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def statuses(self, alertname: str) -> list[tuple[str, str]]:
        """(status, severity) of each notified alert named ``alertname``, in order."""
        return [(a["status"], a["labels"]["severity"]) for n in self.notifications for a in n["alerts"]
                if a["labels"]["alertname"] == alertname]


class Alertmanager:
    """``web_config``: a ``--web.config.file`` (TLS, basic auth); then ``client`` is how the test
    itself reaches it (an SSL context and an Authorization header)."""

    def __init__(self, folder: Path, webhook: Webhook, web_config: Path | None = None,
                 client: tuple[ssl.SSLContext, dict[str, str]] | None = None):
        self.binary = alertmanager_binary("prometheus-alertmanager")
        self.folder, self.port, self.webhook = folder, free_port(), webhook
        self.web_config, self.client = web_config, client
        self.url = f"{'https' if web_config else 'http'}://127.0.0.1:{self.port}"
        settings = yaml.safe_load(SHIPPED_CONFIG.read_text())
        settings["route"].update(group_wait="0s", group_interval="1s")  # notify at once, for the test
        for receiver in settings["receivers"]:
            for hook in receiver["webhook_configs"]:
                hook["url"] = f"{webhook.url}/{receiver['name']}"
        (folder / "alertmanager.yml").write_text(yaml.safe_dump(settings))
        self.process = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, f"--config.file={self.folder / 'alertmanager.yml'}", f"--storage.path={self.folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=",
             *([f"--web.config.file={self.web_config}"] if self.web_config else [])],
            stdout=open(self.folder / "alertmanager.log", "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self._get("/-/ready", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise AssertionError("Alertmanager did not become ready: " + (self.folder / "alertmanager.log").read_text())

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)

    def alerts(self) -> list[dict]:
        """The active alerts in Alertmanager's v2 API."""
        return json.loads(self._get("/api/v2/alerts", timeout=5))

    def _get(self, path: str, timeout: float) -> bytes:
        context, headers = self.client or (None, {})
        request = urllib.request.Request(self.url + path, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.read()


def of_incident(alerts: list[dict], incident: dict) -> list[dict]:
    """The alerts of one incident (by the ``incident_id`` annotation the relay sets)."""
    return [a for a in alerts if a["annotations"].get("incident_id") == incident["incident_id"]]
