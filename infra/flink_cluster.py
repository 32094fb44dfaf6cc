"""A local Apache Flink standalone cluster for the lab: its own virtualenv, its own configuration.

PyFlink's dependencies (apache-beam, an older protobuf and pyarrow) clash with the main
environment, so the Flink distribution that the ``apache-flink`` wheel ships (``pyflink/bin``,
``conf``, ``lib``) lives in a second virtualenv that this module creates (``lab.flink_venv``,
``.venv-flink`` by default). The cluster runs from a configuration this project writes under
``<state_dir>/flink/conf`` (REST and RPC on loopback, checkpoints, logs and temporary folders
under the state folder), one JobManager and one TaskManager started in the foreground as
detached processes, and stopped by their PIDs. Nothing is read from or written to ``/tmp`` or
the wheel's own ``conf/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from infra.embedded_stack import _pid_alive, _pid_matches, _tail, port_in_use, stop_process_group
from pipelines.config import SentinelConfig
from pipelines.errors import SetupError


class FlinkClusterError(SetupError, RuntimeError):
    """The lab cluster cannot be set up, started or used; the message says what to do."""


@dataclass(frozen=True)
class FlinkRuntime:
    """An installed Flink: the virtualenv's python and the distribution inside its pyflink package."""

    venv: Path
    python: Path
    home: Path

    @property
    def bin(self) -> Path:
        return self.home / "bin"


def ensure_flink_runtime(config: SentinelConfig, log=print) -> FlinkRuntime:
    """Create ``lab.flink_venv`` with ``apache-flink==lab.flink_version`` unless it is there already."""
    lab = config.lab
    venv = Path(lab.flink_venv)
    python = venv / "bin" / "python"
    stamp = venv / f".installed-apache-flink-{lab.flink_version}"
    if not stamp.is_file():
        log(f"setting up {venv} with apache-flink=={lab.flink_version} (once; about a minute, ~850 MB)")
        if not python.is_file():
            _run([sys.executable, "-m", "venv", str(venv)], "create the Flink virtualenv")
        _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              f"apache-flink=={lab.flink_version}"],
             f"install apache-flink=={lab.flink_version} into {venv} (needs the PyPI registry)")
        stamp.touch()
    home = _pyflink_home(python)
    if not (home / "bin" / "jobmanager.sh").is_file():
        raise FlinkClusterError(f"{home} has no bin/jobmanager.sh: the apache-flink install in {venv} is "
                                f"incomplete; delete {venv} and run the command again")
    return FlinkRuntime(venv=venv, python=python, home=home)


def _pyflink_home(python: Path) -> Path:
    found = subprocess.run([str(python), "-c", "import os, pyflink; print(os.path.dirname(pyflink.__file__))"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise FlinkClusterError(f"pyflink cannot be imported by {python}: {found.stderr.strip()[-500:]}")
    return Path(found.stdout.strip())


def _wait_for_group(pgid: int, timeout_s: float = 15.0) -> None:
    """Wait until no process of the group the lab started is left (Flink 1.20's start script
    runs the JVM as its child: the script ends at once, the JVM holds the ports while it shuts
    down); SIGKILL what outlives the timeout, and wait as long again at most."""
    for last_resort in (signal.SIGKILL, None):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)
        if last_resort is not None:
            try:
                os.killpg(pgid, last_resort)
            except ProcessLookupError:
                return


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise FlinkClusterError(f"could not {what}:\n{(done.stderr or done.stdout).strip()[-2000:]}")


def cluster_root(config: SentinelConfig) -> Path:
    """The cluster's folder: one per Flink version, so clusters of two versions can run side by side
    (on other ports: ``lab.rest_port``, ``lab.rpc_port``)."""
    default = type(config.lab).model_fields["flink_version"].default
    version = config.lab.flink_version
    return Path(config.state_dir) / ("flink" if version == default else f"flink-{version}")


class LocalFlinkCluster:
    """Start, use and stop the lab's standalone cluster (one JobManager, one TaskManager)."""

    def __init__(self, config: SentinelConfig, runtime: FlinkRuntime):
        self.config = config
        self.runtime = runtime
        self.root = cluster_root(config)
        self.conf_dir = self.root / "conf"
        self.log_dir = self.root / "log"
        self.run_dir = self.root / "run"
        self.checkpoint_dir = self.root / "checkpoints"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.config.lab.rest_port}"

    # --- configuration -------------------------------------------------------------------------

    def write_conf(self) -> Path:
        """The project's own Flink configuration; the wheel's log4j files are copied beside it."""
        lab = self.config.lab
        for folder in (self.conf_dir, self.log_dir, self.run_dir, self.checkpoint_dir, self.root / "tmp"):
            folder.mkdir(parents=True, exist_ok=True)
        for name in ("log4j.properties", "log4j-console.properties", "log4j-cli.properties"):
            shutil.copyfile(self.runtime.home / "conf" / name, self.conf_dir / name)
        # Flink 2 reads a nested or flat YAML; flat keys are the ones its documentation lists.
        settings = {
            "jobmanager.rpc.address": "127.0.0.1",
            "jobmanager.bind-host": "127.0.0.1",
            "jobmanager.rpc.port": lab.rpc_port,
            "jobmanager.memory.process.size": lab.jobmanager_memory,
            "taskmanager.host": "127.0.0.1",
            "taskmanager.bind-host": "127.0.0.1",
            "taskmanager.numberOfTaskSlots": lab.taskmanager_slots,
            "taskmanager.memory.process.size": lab.taskmanager_memory,
            "taskmanager.memory.jvm-metaspace.size": lab.taskmanager_metaspace,
            "rest.address": "127.0.0.1",
            "rest.bind-address": "127.0.0.1",
            "rest.port": lab.rest_port,
            "parallelism.default": 1,
            "io.tmp.dirs": str(self.root / "tmp"),
            "web.tmpdir": str(self.root / "tmp" / "web"),
            "blob.storage.directory": str(self.root / "tmp" / "blob"),
            "state.checkpoints.dir": self.checkpoint_dir.as_uri(),
            "execution.checkpointing.dir": self.checkpoint_dir.as_uri(),
            # Enough history that a collector polling every few seconds never misses one.
            "web.checkpoints.history": 50,
            "python.executable": str(self.runtime.python),
            "python.client.executable": str(self.runtime.python),
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 1000,
            "restart-strategy.fixed-delay.delay": "2 s",
            "metrics.fetcher.update-interval": "2000",
            # Java 17 module openings that Flink needs, as the distribution's own configuration has them.
            "env.java.opts.all": self._distribution_java_opts(),
            "env.java.opts.client": f"-Djava.io.tmpdir={self.root / 'tmp'}",
        }
        path = self.conf_dir / "config.yaml"
        path.write_text("".join(f"{key}: {json.dumps(value) if isinstance(value, str) else value}\n"
                                for key, value in settings.items()))
        return path

    def _distribution_java_opts(self) -> str:
        shipped = yaml.safe_load((self.runtime.home / "conf" / "config.yaml").read_text()) or {}
        opts = shipped.get("env.java.opts.all") or (((shipped.get("env") or {}).get("java") or {}).get("opts") or {}).get("all")
        return str(opts or "")

    def _env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("PYSPARK_", "SPARK_", "VIRTUAL_ENV", "PYTHONPATH"))}
        env.update(FLINK_CONF_DIR=str(self.conf_dir), FLINK_LOG_DIR=str(self.log_dir),
                   FLINK_PID_DIR=str(self.run_dir), FLINK_HOME=str(self.runtime.home),
                   PATH=f"{self.runtime.venv / 'bin'}:{os.environ.get('PATH', '')}",
                   PYFLINK_CLIENT_EXECUTABLE=str(self.runtime.python))
        return env

    # --- processes -----------------------------------------------------------------------------

    def _record_path(self, name: str) -> Path:
        return self.run_dir / f"{name}.json"

    def _running(self, name: str) -> dict | None:
        path = self._record_path(name)
        if not path.is_file():
            return None
        record = json.loads(path.read_text())
        alive = _pid_alive(record["pid"]) and _pid_matches(record["pid"], record["needle"])
        return record if alive else None

    def _spawn(self, name: str, script: str, needle: str) -> dict:
        log_path = self.log_dir / f"{name}.out"
        with open(log_path, "ab") as out:
            process = subprocess.Popen([str(self.runtime.bin / script), "start-foreground"], stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, env=self._env(), cwd=self.root)
        record = {"pid": process.pid, "needle": needle, "log": str(log_path), "started_at": time.time()}
        self._record_path(name).write_text(json.dumps(record))
        return record

    def start(self) -> str:
        """Start the cluster (or reuse the one this state folder already runs) and wait for a free slot."""
        if self._running("jobmanager") and self._running("taskmanager") and self.overview() is not None:
            return f"Flink cluster already running, REST {self.rest_url}"
        self.stop()
        lab = self.config.lab
        for port, key in ((lab.rest_port, "lab.rest_port"), (lab.rpc_port, "lab.rpc_port")):
            if port_in_use("127.0.0.1", port):
                raise FlinkClusterError(f"port {port} on 127.0.0.1 is in use by something the lab did not start; "
                                        f"stop it or set {key} (SENTINEL_{key.upper().replace('.', '__')})")
        self.write_conf()
        started = time.monotonic()
        records = [self._spawn("jobmanager", "jobmanager.sh", "StandaloneSessionClusterEntrypoint"),
                   self._spawn("taskmanager", "taskmanager.sh", "TaskManagerRunner")]
        deadline = started + lab.startup_timeout_s
        while time.monotonic() < deadline:
            for name, record in zip(("jobmanager", "taskmanager"), records):
                if not _pid_alive(record["pid"]):
                    self.stop()
                    raise FlinkClusterError(f"the Flink {name} exited during start-up; see {self.log_dir}:\n"
                                            f"{_tail(record['log'])}")
            overview = self.overview()
            if overview and overview.get("slots-available", 0) >= 1:
                return (f"Flink {overview.get('flink-version', '')} cluster started in "
                        f"{time.monotonic() - started:.0f}s, REST {self.rest_url}, "
                        f"{overview['slots-total']} slots, logs {self.log_dir}")
            time.sleep(0.5)
        self.stop()
        raise FlinkClusterError(f"the Flink cluster was not ready within {lab.startup_timeout_s:.0f}s; "
                                f"see the logs in {self.log_dir}")

    def taskmanager_alive(self) -> bool:
        """False once the TaskManager process has died (it can, under a job: a native crash). A
        JobManager too busy to answer says nothing about it: the process is what counts."""
        return self._running("taskmanager") is not None

    def restart_taskmanager(self, timeout_s: float = 60.0) -> str:
        """Start a new TaskManager after the old one died; waits until its slots are offered."""
        record = self._running("taskmanager")
        if record is not None:
            stop_process_group(record["pid"])
        self._record_path("taskmanager").unlink(missing_ok=True)
        record = self._spawn("taskmanager", "taskmanager.sh", "TaskManagerRunner")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _pid_alive(record["pid"]):
                raise FlinkClusterError(f"the restarted Flink taskmanager exited; see {self.log_dir}:\n{_tail(record['log'])}")
            overview = self.overview()
            if overview and overview.get("taskmanagers"):
                return f"Flink taskmanager restarted (pid {record['pid']})"
            time.sleep(0.5)
        raise FlinkClusterError(f"the restarted Flink taskmanager did not register within {timeout_s:.0f}s")

    def pids(self) -> dict[str, int]:
        """The PIDs of the running JobManager and TaskManager (the Python workers are their children)."""
        return {name: record["pid"] for name in ("jobmanager", "taskmanager") if (record := self._running(name))}

    def stop(self) -> list[str]:
        messages = []
        for name in ("taskmanager", "jobmanager"):
            record = self._running(name)
            self._record_path(name).unlink(missing_ok=True)
            if record is None:
                continue
            stop_process_group(record["pid"])
            _wait_for_group(record["pid"])
            messages.append(f"Flink {name} stopped (pid {record['pid']})")
        return messages

    # --- REST ----------------------------------------------------------------------------------

    def _request(self, method: str, path: str, timeout: float = 5.0) -> dict | None:
        request = urllib.request.Request(self.rest_url + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body = response.read()
        except (urllib.error.URLError, OSError):
            return None
        return json.loads(body) if body else {}

    def overview(self) -> dict | None:
        return self._request("GET", "/overview", timeout=2.0)

    def job_state(self, job_id: str) -> str | None:
        job = self._request("GET", f"/jobs/{job_id}")
        return job.get("state") if job else None

    def cancel(self, job_id: str) -> None:
        self._request("PATCH", f"/jobs/{job_id}?mode=cancel")

    def stop_with_savepoint(self, job_id: str) -> bool:
        """Stop a job the way a deployment does: sources stop, a savepoint is taken, tasks finish.
        Unlike a cancel, no task is torn down while its Python worker still uses its state
        (cancelling a PyFlink job on RocksDB can crash the TaskManager). False if Flink refused."""
        body = json.dumps({"targetDirectory": (self.root / "savepoints").as_uri(), "drain": False}).encode()
        request = urllib.request.Request(f"{self.rest_url}/jobs/{job_id}/stop", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5.0) as response:
                return response.status < 300
        except (urllib.error.URLError, OSError):
            return False

    def running_jobs(self) -> list[str]:
        """The ids of the jobs that have not ended."""
        overview = self._request("GET", "/jobs/overview") or {}
        return [job["jid"] for job in overview.get("jobs", [])
                if job.get("state") not in ("CANCELED", "FINISHED", "FAILED")]

    # --- jobs ----------------------------------------------------------------------------------

    def submit_python(self, script: Path, args: list[str], timeout_s: float = 120.0) -> str:
        """Submit a PyFlink job detached; returns its JobID."""
        log_path = self.log_dir / f"submit-{script.stem}.log"
        argv = [str(self.runtime.bin / "flink"), "run", "--detached", "--jobmanager", f"127.0.0.1:{self.config.lab.rest_port}",
                "--python", str(script.resolve()), "--pyExecutable", str(self.runtime.python),
                "--pyClientExecutable", str(self.runtime.python), *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=self._env(), cwd=self.root,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise FlinkClusterError(f"submitting {script.name} took over {timeout_s:.0f}s") from exc
        log_path.write_text(done.stdout + done.stderr)
        found = re.search(r"JobID ([0-9a-f]{32})", done.stdout + done.stderr)
        if done.returncode != 0 or not found:
            raise FlinkClusterError(f"Flink refused the job {script.name} (exit {done.returncode}); see {log_path}:\n"
                                    + "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:]))
        return found.group(1)
