"""``sentinel``: the one entry point of checkpoint-sentinel, the command line layer.

Each command parses its arguments, calls one library function and prints. ``parser`` builds the
commands, grouped by what a user does; ``app`` runs one and ends it with a clear last line and
exit code; the handlers live by group (``production``, ``model_commands``, ``lab_commands``,
``config_commands``) with what they share in ``common``. May import every layer below it.
"""

from pipelines.cli.app import EXIT_FAILED, EXIT_USAGE, main
from pipelines.cli.common import require_champions as _require_champions
from pipelines.cli.parser import build_parser

__all__ = ["EXIT_FAILED", "EXIT_USAGE", "build_parser", "main", "_require_champions"]
