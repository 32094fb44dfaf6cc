"""A real Prometheus server (Debian's ``prometheus``) scraping the test's targets and evaluating
rule files, read through its HTTP API as Grafana and on-call read it."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from infra.embedded_stack import free_port
from tests import debian

# Seconds, not Prometheus's default minute: a test sees a target go down, and a rule's `for` start,
# within a second or two.
SCRAPE_INTERVAL = "1s"


class PrometheusServer:
    """``prometheus`` on a free loopback port with a TSDB in ``folder``; ``jobs`` maps each
    scrape job's name to its ``host:port`` targets."""

    def __init__(self, folder: Path, jobs: dict[str, list[str]], rule_files: list[Path]):
        self.binary = debian.binary("prometheus")
        self.folder, self.port = folder, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        settings = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL,
                       "scrape_timeout": SCRAPE_INTERVAL},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{"job_name": name, "static_configs": [{"targets": targets}]}
                               for name, targets in jobs.items()],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
        self.log = folder / "prometheus.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> PrometheusServer:
        self.process = subprocess.Popen(
            [self.binary, f"--config.file={self.folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.folder / 'prometheus-data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "prometheus exited: " + self.log.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1)
                return self
            except OSError:
                time.sleep(0.3)
        raise AssertionError("prometheus did not become ready: " + self.log.read_text()[-3000:])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def api(self, path: str, **params: str) -> dict:
        """The ``data`` of ``/api/v1/<path>``; a failed query raises with Prometheus's error."""
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            answer = json.loads(exc.read())
        if answer.get("status") != "success":
            raise PromQLError(f"{path} {params}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, promql: str) -> list[dict]:
        """The instant vector (or scalar, as one sample) ``promql`` evaluates to now."""
        data = self.api("query", query=promql)
        return data["result"] if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]

    def targets(self) -> dict[str, list[dict]]:
        """The active targets by scrape job."""
        by_job: dict[str, list[dict]] = {}
        for target in self.api("targets")["activeTargets"]:
            by_job.setdefault(target["labels"]["job"], []).append(target)
        return by_job

    def rules(self) -> list[dict]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def alerts(self) -> dict[str, list[dict]]:
        """The pending and firing alerts by name."""
        by_name: dict[str, list[dict]] = {}
        for alert in self.api("alerts")["alerts"]:
            by_name.setdefault(alert["labels"]["alertname"], []).append(alert)
        return by_name


class PromQLError(AssertionError):
    """Prometheus refused a query (bad PromQL, an unknown function, a type error)."""
