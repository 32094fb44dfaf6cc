"""The `sentinel` command as a user runs it: a process of its own, in the project's folder."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.champions import PROJECT_ROOT


def environment_without_settings() -> dict[str, str]:
    """This process's environment without any ``SENTINEL_*`` variable (a developer's own settings
    must not leak into the command a test runs)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}


def run_sentinel(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``sentinel ARGS`` to its end with the settings in ``env`` only: its exit code, stdout, stderr."""
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=PROJECT_ROOT,
                          env={**environment_without_settings(), **env}, capture_output=True, text=True,
                          timeout=timeout)
