"""What a `sentinel` command costs to say that the setup is wrong: the CPU and the time it takes
to report an unreachable broker (`sentinel selfcheck` against a port nothing listens on), and the
heavy libraries it imported on the way.

Each run is a fresh process, as a user starts it; its CPU comes from the kernel's accounting of
the child (user and system), so other work on the machine changes the wall time, not the CPU.

Usage: ``.venv/bin/python benchmarks/cli_setup_error.py [--repeat 3] [--project DIR]`` (``--project``:
another checkout's code, to compare with it).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("mlflow", "sklearn", "great_expectations", "pyspark")
COMMAND = [sys.executable, "-m", "pipelines.cli", "selfcheck"]


def imported_heavy(importtime_log: str) -> list[str]:
    """The heavy libraries a ``python -X importtime`` run imported (its log on stderr)."""
    names = {line.rsplit("|", 1)[-1].strip() for line in importtime_log.splitlines() if line.startswith("import time:")}
    return [name for name in HEAVY if name in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--project", type=Path, default=PROJECT_ROOT)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as state:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")},
               "SENTINEL_STATE_DIR": state, "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9",
               "SENTINEL_KAFKA__CONNECT_TIMEOUT_S": "2", "PYTHONPATH": str(args.project),
               "MLFLOW_DISABLE_TELEMETRY": "true", "GX_ANALYTICS_ENABLED": "false"}
        cpu, wall = [], []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            done = subprocess.run(COMMAND, cwd=args.project, env=env, capture_output=True, text=True, timeout=300)
            wall.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if done.returncode != 1 or "is unreachable" not in done.stderr:
                sys.exit(f"the command did not report the unreachable broker:\n{done.stderr[-2000:]}")
        # Once more, not timed, for what it imported.
        traced = subprocess.run([COMMAND[0], "-X", "importtime", *COMMAND[1:]], cwd=args.project, env=env,
                                capture_output=True, text=True, timeout=300)
        imported = imported_heavy(traced.stderr)

    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"project: {args.project}")
    print(f"sentinel selfcheck, broker unreachable: {min(cpu):.2f} CPU s, {min(wall):.2f} s "
          f"(best of {args.repeat}); heavy libraries imported: {', '.join(imported) or 'none'}")


if __name__ == "__main__":
    main()
