"""``sentinel config show`` and ``sentinel config validate``: the resolved config, and whether it loads."""

from __future__ import annotations

import argparse
import json

from pipelines.cli.parser import Command, add_actions
from pipelines.config import SentinelConfig
from pipelines.errors import UsageError


def _cmd_show(config: SentinelConfig, args: argparse.Namespace) -> int:
    import yaml

    from pipelines.config.show import lookup, masked

    data = masked(config)
    if args.key:
        try:
            data = lookup(data, args.key)
        except KeyError as exc:
            raise UsageError(f"no key {args.key!r} ({exc.args[0]!r} is not there; `sentinel config show` lists "
                             "every key)") from None
    if args.output == "json":
        print(json.dumps(data, indent=2))
    elif isinstance(data, (dict, list)):
        print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
    else:
        print("null" if data is None else data)
    return 0


def _cmd_validate(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.config.show import sources

    # The config loaded before this handler ran: a bad one has already exited with 2 naming its keys.
    print("config is valid; values from, strongest first:")
    for line in sources(args.config):
        print(f"  {line}")
    print("`sentinel status` tells whether the services it names answer.")
    return 0


def _config_arguments(p: argparse.ArgumentParser) -> None:
    def show(a: argparse.ArgumentParser) -> None:
        a.add_argument("key", nargs="?", help="only this key or section, e.g. kafka.bootstrap_servers "
                                              "(default: every key)")
        a.add_argument("--output", choices=("yaml", "json"), default="yaml", help="the format printed")

    add_actions(p, {"show": ("the resolved config, every key with its value, secrets masked", _cmd_show, show),
                    "validate": ("load the config and say where its values came from; exit 2 naming each bad key",
                                 _cmd_validate, lambda a: None)})


COMMANDS = [
    Command("config", "configuration", "show the resolved config (secrets masked) or validate it",
            ("sentinel config show --config sentinel.yaml", "sentinel config show kafka.bootstrap_servers",
             "sentinel config validate --config sentinel.yaml"), None, _config_arguments),
]
