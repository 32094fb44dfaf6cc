"""The ``sentinel`` command line: its commands grouped by what a user does, each with a one-line
summary, an example, and every option's help with its default.

argparse, not a CLI library: the standard library is always there (the job's lean install too),
its help formatter shows the defaults, and the tests parse with the same parser users run.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from pipelines.durations import DurationError, format_seconds, seconds

# The groups in the order `sentinel --help` lists them: the production path first.
GROUPS = ("production", "models", "development and lab", "configuration")


@dataclass(frozen=True)
class Command:
    """One command: where it is listed, what it does in a line, how it is run, and its handler
    (``handler(config, args) -> exit code``)."""

    name: str
    group: str
    summary: str
    examples: tuple[str, ...]
    handler: Callable | None
    arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    description: str = ""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's own line breaks and adds ``(default: X)`` to every option that has
    one and does not say it already; a flag (default False) or an unset value (None) says nothing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default == argparse.SUPPRESS
                or action.const is not None or not action.option_strings):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        if getattr(action, "type", None) is duration and isinstance(default, (int, float)):
            shown = format_seconds(default)
        return f"{text} (default: {shown})"


def duration(text: str) -> float:
    """argparse's type for a time option: ``30s``, ``5m``, ``1h30m``, or a number of seconds."""
    try:
        return seconds(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return value


def common_options() -> argparse.ArgumentParser:
    # --config, -v and --log-format work before or after the command; SUPPRESS keeps a command
    # that does not repeat them from resetting what was given before it.
    common = argparse.ArgumentParser(add_help=False)
    options = common.add_argument_group("options of every command")
    options.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                         help="YAML config file (default: $SENTINEL_CONFIG, else ./sentinel.yaml if present)")
    options.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                         help="more log: -v INFO, -vv DEBUG (default: warnings only)")
    options.add_argument("--log-format", choices=("text", "json", "logfmt"), default=argparse.SUPPRESS,
                         help="log lines on stderr as text, one JSON object, or logfmt key=value pairs "
                              "(default: text)")
    return common


def _overview(commands: list[Command]) -> str:
    width = max(len(c.name) for c in commands) + 2
    lines = ["Catch Apache Flink jobs before their checkpoints fail.", ""]
    for group in GROUPS:
        members = [c for c in commands if c.group == group]
        if members:
            lines.append(f"{group} commands:")
            lines += [f"  {c.name:<{width}}{c.summary}" for c in members]
            lines.append("")
    lines += ["`sentinel COMMAND --help` shows a command's options and an example.",
              "Durations: 30s, 5m, 1h30m, 500ms, or a number of seconds.",
              "Exit codes: 0 done, 1 a service or file to fix (the message names the key), 2 a bad config or usage."]
    return "\n".join(lines)


def build_parser(commands: list[Command] | None = None) -> argparse.ArgumentParser:
    if commands is None:
        from pipelines.cli.commands import COMMANDS as commands
    common = common_options()
    parser = argparse.ArgumentParser(prog="sentinel", description=_overview(commands), parents=[common],
                                     formatter_class=HelpFormatter,
                                     usage="sentinel [--config FILE] [-v] [--log-format F] COMMAND ...")
    parser.add_argument("--version", action="version", version=f"sentinel (checkpoint-sentinel) {_version()}")
    # No help= per command: the overview above lists them by group instead of one flat list.
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS)
    for command in commands:
        sub = subcommands.add_parser(command.name, parents=[common], formatter_class=HelpFormatter,
                                     prog=f"sentinel {command.name}",
                                     description=command.summary + (f"\n\n{command.description}"
                                                                    if command.description else ""),
                                     epilog="example" + ("s" if len(command.examples) > 1 else "") + ":\n" +
                                            "\n".join(f"  {line}" for line in command.examples))
        command.arguments(sub)
        _action_examples(sub, command)
        if command.handler is not None:
            sub.set_defaults(handler=command.handler)
    return parser


def _action_examples(parser: argparse.ArgumentParser, command: Command) -> None:
    """Each action's --help (``sentinel config show --help``) ends with the command's examples of it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                mine = [e for e in command.examples if e.split()[:3] == ["sentinel", command.name, name]]
                if mine:
                    sub.epilog = ("examples" if len(mine) > 1 else "example") + ":\n" + \
                                 "\n".join(f"  {line}" for line in mine)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("checkpoint-sentinel")
    except PackageNotFoundError:
        return "unknown (not installed)"


def add_actions(parser: argparse.ArgumentParser, actions: dict[str, tuple[str, Callable, Callable]]) -> None:
    """Sub-commands of a command (``features list``): name -> (summary, handler, arguments)."""
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, (summary, handler, arguments) in actions.items():
        action = sub.add_parser(name, help=summary, description=summary, parents=[common_options()],
                                prog=f"{parser.prog} {name}",
                                formatter_class=HelpFormatter)
        arguments(action)
        action.set_defaults(handler=handler)
