"""``sentinel``'s entry point: parse, set up the log, load the config, run the command's handler,
and end every way a command can end with a clear last line and exit code.

Exit codes: 0 done; 1 a service, file or model to fix (:class:`~pipelines.errors.SetupError`,
a missing file, a timeout); 2 a bad config or usage; 130 interrupted. A closed pipe
(``sentinel features list | head -1``) ends quietly with 0, as a filter's reader expects.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Sequence

from pipelines.errors import EXIT_FAILED, EXIT_USAGE, SetupError  # noqa: F401  (EXIT_* are this module's API)

# No internet here or on many production hosts: never let a library phone home.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TQDM_DISABLE", "1")  # Great Expectations' per-validation progress bars

LOG_LEVELS = (logging.WARNING, logging.INFO, logging.DEBUG)


class JsonFormatter(logging.Formatter):
    """One JSON object a line, for log shippers: time, level, logger, message (and the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
                 "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class LogfmtFormatter(logging.Formatter):
    """``time=... level=info logger=... msg="..."``: one line of key=value pairs."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        stamp = self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z"
        return (f"time={stamp} level={record.levelname.lower()} logger={record.name} "
                f"msg={json.dumps(message, ensure_ascii=False)}")


def setup_logging(verbosity: int, log_format: str) -> None:
    """``-v`` INFO, ``-vv`` DEBUG (the project's loggers; libraries stay at INFO), in UTC."""
    level = LOG_LEVELS[min(verbosity, len(LOG_LEVELS) - 1)]
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    elif log_format == "logfmt":
        handler.setFormatter(LogfmtFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.formatter.converter = time.gmtime
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # A library's DEBUG (py4j's every socket read, kafka-python's every fetch) drowns the project's own.
    root.setLevel(min(level, logging.INFO))
    for name in ("pipelines", "models", "feature_store", "infra"):
        logging.getLogger(name).setLevel(level)
    logging.getLogger("great_expectations").setLevel(max(level, logging.INFO) if verbosity else logging.WARNING)
    if level > logging.INFO:
        root.setLevel(level)


def _quiet_pipe() -> int:
    # The reader went away: stdout now points at /dev/null, so Python's flush at exit finds no
    # closed pipe to raise about either.
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from pipelines.cli.parser import build_parser
    from pipelines.config import load_config

    try:
        args = build_parser().parse_args(argv)
    except BrokenPipeError:  # `sentinel --help | head -1`
        return _quiet_pipe()
    args.config = getattr(args, "config", None)
    args.verbose = getattr(args, "verbose", 0) or 0
    args.log_format = getattr(args, "log_format", "text")
    setup_logging(args.verbose, args.log_format)
    name = " ".join(filter(None, (args.command, getattr(args, "action", None))))
    try:
        config = load_config(args.config)
        return args.handler(config, args)
    except BrokenPipeError:
        return _quiet_pipe()
    except SetupError as exc:
        return _fail(name, exc, exc.exit_code)
    except (FileNotFoundError, TimeoutError) as exc:
        return _fail(name, exc, EXIT_FAILED)
    except KeyboardInterrupt:
        print("sentinel: interrupted", file=sys.stderr)
        return 130


def _fail(command: str, exc: BaseException, code: int) -> int:
    logging.getLogger("pipelines.cli").debug("sentinel %s failed", command, exc_info=exc)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_pipe()
    print(f"sentinel {command}: {exc}", file=sys.stderr)
    return code
