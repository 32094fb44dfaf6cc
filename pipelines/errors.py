"""The errors a user fixes in their setup, not in the code: the CLI prints their message as one line
and exits with their code, without a traceback.

Imports nothing: every layer subclasses :class:`SetupError`, and the CLI recognises one without
importing the module that raises it (MLflow, scikit-learn or Spark would make a setup error slow
to report).
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_USAGE = 2


class SetupError(Exception):
    """Something outside the code is missing, unreachable or wrong; the message says what to fix,
    naming the config key when one would fix it."""

    exit_code = EXIT_FAILED


class UsageError(SetupError, ValueError):
    """A command called with arguments, or a config, that cannot work together."""

    exit_code = EXIT_USAGE


class DependencyUnreachable(SetupError, ConnectionError):
    """A service the config names (MLflow, Alertmanager, a Flink cluster) did not answer."""

    def __init__(self, service: str, where: str, key: str, reason: str, hint: str = ""):
        self.service, self.where, self.key, self.reason = service, where, key, reason
        super().__init__(f"{service} at {where} is unreachable ({reason}); check {key}" + (f" {hint}" if hint else ""))
