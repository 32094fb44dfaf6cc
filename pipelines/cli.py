"""``sentinel``: the one entry point. Each command parses its arguments, calls a library function
and prints; errors a user can fix are printed as one clear message with a non-zero exit code."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable, Sequence

from pipelines.config import ConfigError, SentinelConfig, load_config

EXIT_USAGE = 2
EXIT_FAILED = 1

# No internet here or on many production hosts: never let a library phone home.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def _cmd_up(config: SentinelConfig, args: argparse.Namespace) -> int:
    from infra.embedded_stack import EmbeddedStack

    for line in EmbeddedStack(config).up(mlflow=not args.no_mlflow):
        print(line)
    return 0


def _cmd_down(config: SentinelConfig, args: argparse.Namespace) -> int:
    from infra.embedded_stack import EmbeddedStack

    for line in EmbeddedStack(config).down():
        print(line)
    return 0


def _cmd_status(config: SentinelConfig, args: argparse.Namespace) -> int:
    from infra.embedded_stack import EmbeddedStack

    statuses = EmbeddedStack(config).status()
    for status in statuses:
        print(status.line())
    print(f"state    {config.state_dir}")
    return 0


def _cmd_selfcheck(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.io.kafka_clients import check_reachable
    from pipelines.selfcheck import contract_round_trip
    from pipelines.spark_session import build_spark

    # Say so before paying for a Spark start-up.
    check_reachable(config.kafka.bootstrap_servers, config.kafka.connect_timeout_s)
    spark = build_spark(config, "selfcheck")
    result = contract_round_trip(spark, config, events=args.events)
    print(result.summary())
    return 0 if result.ok else EXIT_FAILED


def _cmd_demo(config: SentinelConfig, args: argparse.Namespace) -> int:
    from infra.embedded_stack import EmbeddedStack

    print("checkpoint-sentinel demo on the embedded stack")
    for line in EmbeddedStack(config).up():
        print("  " + line)
    print(
        "The detection job is not built yet, so the demo runs the streaming round trip instead:\n"
        "Kafka -> Spark Structured Streaming (contract parsing) -> Kafka."
    )
    code = _cmd_selfcheck(config, args)
    print("The stack keeps running; `sentinel status` shows it and `sentinel down` stops it.")
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sentinel", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML config file (default: $SENTINEL_CONFIG, else ./sentinel.yaml if present)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="start the embedded broker (with the topics) and the MLflow server")
    up.add_argument("--no-mlflow", action="store_true", help="start only the broker")
    up.set_defaults(handler=_cmd_up)
    commands.add_parser("down", help="stop what `sentinel up` started").set_defaults(handler=_cmd_down)
    commands.add_parser("status", help="say what runs where").set_defaults(handler=_cmd_status)

    selfcheck = commands.add_parser("selfcheck", help="round-trip example events Kafka -> Spark -> Kafka and compare")
    selfcheck.add_argument("--events", type=int, default=3000)
    selfcheck.set_defaults(handler=_cmd_selfcheck)

    demo = commands.add_parser("demo", help="what `make run` runs: the embedded stack and the main job")
    demo.add_argument("--events", type=int, default=3000)
    demo.set_defaults(handler=_cmd_demo)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean 'fix your setup', printed without a traceback."""
    from infra.embedded_stack import StackError
    from pipelines.io.kafka_clients import KafkaUnavailable
    from pipelines.spark_session import JavaMissing

    return (ConfigError, StackError, KafkaUnavailable, JavaMissing)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler: Callable[[SentinelConfig, argparse.Namespace], int] = args.handler
    try:
        config = load_config(args.config)
        return handler(config, args)
    except ConfigError as exc:
        print(f"sentinel: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except _user_errors() as exc:
        print(f"sentinel {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("sentinel: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
