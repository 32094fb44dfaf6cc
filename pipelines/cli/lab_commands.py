"""The development and lab commands: up, down, demo, simulate, lab, features."""

from __future__ import annotations

import argparse

from pipelines.cli.common import JOBS_PER_SCENARIO, GridProgress, require_kafka, require_mlflow, stop_on_signals
from pipelines.cli.model_commands import train, training_dataset_arguments
from pipelines.cli.parser import Command, add_actions, duration, positive_int
from pipelines.config import SentinelConfig
from pipelines.datasets import SPLITS
from pipelines.errors import UsageError
from pipelines.families import FAMILIES



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


def _cmd_demo(config: SentinelConfig, args: argparse.Namespace) -> int:
    require_mlflow(config)  # before the stack starts: a tracking server that is down would leave it running
    from infra.embedded_stack import EmbeddedStack
    from models import registry
    from pipelines.detection.demo import run_demo

    print("checkpoint-sentinel demo on the embedded stack")
    for line in EmbeddedStack(config).up():
        print("  " + line)
    registry.use_config(config)
    missing = [f for f in FAMILIES if registry.alias_version(getattr(config.mlflow.models, f), config.mlflow.alias) is None]
    if missing:
        print(f"no champion yet for {', '.join(missing)}: training the initial models (once; later runs reuse them)")
        train(config, args, missing)
    else:
        print("champions found in the registry: reusing them")
    run_demo(config, fleet=args.fleet, seed=args.seed, duration=args.fleet_duration, speed=args.speed)
    print("The stack keeps running; `sentinel incidents --from-beginning` shows the incident topic, "
          "`sentinel status` the stack and `sentinel down` stops it.")
    return 0


def _cmd_simulate(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pathlib import Path

    from pipelines import simulator
    from pipelines.simulator.scenarios import CATALOGUE

    if args.list:
        for name, scenario in CATALOGUE.items():
            length = f"{scenario.default_duration_ms // 60_000} min"
            print(f"{name:<28} {scenario.family or 'healthy':<19} {length:>8}  {scenario.description}")
        return 0
    if args.calibration_report:
        from pipelines.simulator.calibration import report

        out = Path(args.calibration_report)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report(Path(config.lab.corpus_dir)))
        print(f"calibration report: {out}")
        return 0
    duration_ms = int(args.duration * 1000) if args.duration else None
    names = args.scenario or list(CATALOGUE)
    if args.out_dataset:
        manifest = simulator.write_dataset(Path(args.out_dataset), [n for n, _ in simulator.parse_mix(names)],
                                           args.jobs_per_scenario, args.seed, duration_ms)
        for split, info in manifest["splits"].items():
            print(f"{split:<10} {info['jobs']:>4} jobs {info['events']:>9} events  {Path(args.out_dataset) / split}")
        return 0
    if not (args.out or args.kafka):
        raise UsageError("say where the events go: --out FILE.jsonl, --kafka or --out-dataset DIR")
    if args.kafka:
        require_kafka(config)
    jobs = simulator.plan_jobs(simulator.parse_mix(names), args.seed, duration_ms, fleet=args.fleet)
    truth_path = Path(args.truth) if args.truth else (Path(args.out).with_suffix(".ground_truth.jsonl") if args.out else None)
    if truth_path:
        simulator.write_jsonl(truth_path, (job.truth for job in jobs))
    if args.out:
        count = simulator.write_jsonl(Path(args.out), simulator.merged_events(jobs))
        print(f"wrote {count} events of {len(jobs)} jobs to {args.out}; ground truth in {truth_path}")
        return 0
    from datetime import datetime, timezone

    from pipelines.simulator.publish import publish_to_kafka

    def progress(sent: int, ts: int) -> None:
        print(f"  {sent} events published, event time {datetime.fromtimestamp(ts / 1000, timezone.utc):%Y-%m-%d %H:%M:%S}", flush=True)

    speed = None if args.max_speed else args.speed
    print(f"publishing {len(jobs)} jobs to {config.topics.input} at {config.kafka.bootstrap_servers}"
          f" ({'as fast as possible' if speed is None else f'{speed:g}x event time'})", flush=True)
    count = publish_to_kafka(simulator.merged_events(jobs), config, speed, progress)
    print(f"published {count} events" + (f"; ground truth in {truth_path}" if truth_path else ""))
    return 0


def _cmd_features_list(config: SentinelConfig, args: argparse.Namespace) -> int:
    from feature_store.definitions import FEATURES, markdown_table

    if args.markdown:
        print(markdown_table())
    else:
        for f in FEATURES:
            print(f"{f.name:<36} {f.family:<19} {f.level:<7} {f.unit:<13} {f.description}")
    return 0


def _cmd_features_backfill(config: SentinelConfig, args: argparse.Namespace) -> int:
    from feature_store import offline_store
    from pipelines.spark_session import build_spark

    paths = list(args.events or [])
    if args.dataset:
        paths += offline_store.dataset_files(args.dataset)[0]
    if not paths:
        raise UsageError("features backfill needs event files or --dataset DIR")
    store = config.location(args.store) if args.store else config.offline_store
    spark = build_spark(config, "backfill")
    rows = offline_store.backfill(spark, paths, store, config.features.idle_timeout_ms)
    print(f"wrote {rows} feature rows from {len(paths)} event file(s) to {store}")
    return 0


def _cmd_lab(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pathlib import Path

    from pipelines import lab
    from pipelines.config import LabConfig
    from pipelines.lab.corpus import GRIDS
    from pipelines.lab.scenarios import NAMED

    if args.flink_version:
        # A version's own virtualenv, unless lab.flink_venv names one explicitly.
        venv = config.lab.flink_venv
        if venv.name == LabConfig.default_venv(config.lab.flink_version).name:
            venv = venv.with_name(LabConfig.default_venv(args.flink_version).name)
        config.lab = config.lab.model_copy(update={"flink_version": args.flink_version, "flink_venv": venv})
    if args.merge_from:
        target = Path(args.out_dataset) if args.out_dataset else Path(config.lab.corpus_dir)
        merged = lab.merge_runs(Path(args.merge_from), target)
        print(f"added {len(merged)} runs of {args.merge_from} to {target}")
        return 0
    if args.grid:
        names = args.grid.split(",")
        unknown = [name for name in names if name not in GRIDS]
        if unknown:
            raise UsageError(f"unknown grid {', '.join(map(repr, unknown))}; choose from {', '.join(GRIDS)}")
        variants = [v for name in dict.fromkeys(names) for v in GRIDS[name](args.only, config.lab.flink_version)]
        dataset = Path(args.out_dataset) if args.out_dataset else Path(config.lab.corpus_dir)
        if args.forget:
            if not args.only:
                raise UsageError("--forget needs --only GLOB: say which runs to record again")
            forgotten = lab.remove_runs(dataset, [v.run_id for v in variants])
            print(f"forgot {len(forgotten)} runs of {dataset}; the grid records them again next time")
            return 0
        if args.list:
            done = lab.recorded_runs(dataset)
            for v in variants:
                print(f"{v.run_id:<58} {v.split:<10} {v.kind:<10} {v.family:<19} {v.duration_s:>4}s "
                      f"{'recorded' if v.run_id in done else ''}")
            return 0
        runs = lab.run_grid(config, variants, dataset, concurrency=args.concurrency,
                            publish_to_kafka=args.kafka, stop=stop_on_signals(),
                            progress=GridProgress([v.run_id for v in variants], lambda: lab.recorded_runs(dataset)))
        print(f"grid {args.grid}: {len(runs)} runs recorded in {dataset}")
        return 0
    if args.list:
        for name, named in NAMED.items():
            variant = named.variant(240)
            print(f"{name:<26} {variant.family:<19} {variant.description}")
        return 0
    if not args.scenario:
        raise UsageError("name a scenario (`sentinel lab --list` shows them) or a grid (--grid corpus)")
    if args.scenario not in NAMED:
        raise UsageError(f"unknown lab scenario {args.scenario!r}; `sentinel lab --list` shows them")
    run = lab.run_lab(config, args.scenario, duration=args.duration, split=args.split,
                      dataset=Path(args.out_dataset) if args.out_dataset else None, publish_to_kafka=not args.no_kafka,
                      keep_cluster=args.keep_cluster, stop=stop_on_signals())
    print(run.summary())
    return 0


def _up_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-mlflow", action="store_true", help="start only the broker")


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fleet", type=positive_int, default=24, metavar="N",
                   help="simulated jobs: every family, healthy jobs and warm-ups")
    p.add_argument("--fleet-duration", type=duration, default=4500.0, metavar="DURATION",
                   help="event time per simulated job of the fleet")
    p.add_argument("--speed", type=float, default=60.0,
                   help="event-time seconds per wall second (60: the fleet's hour in a minute)")
    training_dataset_arguments(p)


def _simulate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--list", action="store_true", help="show the scenario catalogue")
    p.add_argument("--scenario", action="append", metavar="NAME[:WEIGHT]",
                   help="scenario to run (repeatable; default: all); weights set the --fleet mix")
    p.add_argument("--seed", type=int, default=0, help="fixes every number the simulation draws")
    p.add_argument("--duration", type=duration, metavar="DURATION",
                   help="event time to simulate per job, e.g. 2h, 30m (default: the scenario's)")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=float, default=1.0, help="with --kafka: event-time seconds per second")
    pace.add_argument("--max-speed", action="store_true", help="with --kafka: publish as fast as possible")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--out", metavar="FILE.jsonl", help="write events (and FILE.ground_truth.jsonl)")
    target.add_argument("--kafka", action="store_true", help="publish to the input topic of the config")
    target.add_argument("--out-dataset", metavar="DIR",
                        help="write a labelled dataset, split into train/validation/test by job")
    target.add_argument("--dataset", dest="out_dataset", help=argparse.SUPPRESS)  # its name before --out-dataset
    p.add_argument("--truth", metavar="FILE", help="where to write the ground truth, JSON lines (default: "
                                                   "FILE.ground_truth.jsonl beside --out)")
    p.add_argument("--fleet", type=positive_int, metavar="N",
                   help="N concurrent jobs drawn from the scenario mix (default: one job per scenario)")
    p.add_argument("--jobs-per-scenario", type=positive_int, default=JOBS_PER_SCENARIO, metavar="N",
                   help="with --out-dataset: jobs of each scenario")
    p.add_argument("--calibration-report", metavar="FILE.md",
                   help="compare the simulator's features with the real-Flink corpus (lab.corpus_dir), before "
                        "and after its calibration, and write the report")


def _features_arguments(p: argparse.ArgumentParser) -> None:
    def listing(a: argparse.ArgumentParser) -> None:
        a.add_argument("--markdown", action="store_true", help="as the Markdown table of docs/FEATURES.md")

    def backfill(a: argparse.ArgumentParser) -> None:
        a.add_argument("events", nargs="*", help="JSON-lines files of input events")
        a.add_argument("--dataset", metavar="DIR", help="every split of a dataset folder (default: none)")
        a.add_argument("--store", metavar="DIR", help="offline store root (default: features.offline_path)")

    add_actions(p, {"list": ("every feature with its family, level, unit and meaning", _cmd_features_list, listing),
                    "backfill": ("compute features from recorded events into the offline store",
                                 _cmd_features_backfill, backfill)})


def _lab_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", nargs="?", help="a named scenario (`sentinel lab --list`)")
    p.add_argument("--list", action="store_true", help="show the named scenarios, or with --grid its variants")
    p.add_argument("--duration", type=duration, default=240.0, metavar="DURATION", help="how long the job runs")
    p.add_argument("--split", default="test", choices=SPLITS, help="dataset split the run is recorded in")
    p.add_argument("--out-dataset", metavar="DIR", help="dataset folder the runs are recorded in (default: "
                                                        "<state_dir>/lab/dataset; with --grid, lab.corpus_dir)")
    p.add_argument("--dataset", dest="out_dataset", help=argparse.SUPPRESS)  # its name before --out-dataset
    p.add_argument("--no-kafka", action="store_true", help="only record; do not publish to the input topic")
    p.add_argument("--keep-cluster", action="store_true", help="leave the Flink cluster running afterwards")
    p.add_argument("--grid", metavar="NAME", help="record every variant of a grid (corpus, long, sql; several "
                                                  "separated by commas, in one session) not yet in the dataset "
                                                  "folder; resumable (default: one named scenario)")
    p.add_argument("--only", metavar="GLOB", help="with --grid: only the variants whose run id matches (globs "
                                                  "separated by commas; default: every variant)")
    p.add_argument("--concurrency", type=positive_int, default=3, help="with --grid: jobs running side by side")
    p.add_argument("--kafka", action="store_true", help="with --grid: also publish to the input topic")
    p.add_argument("--forget", action="store_true", help="with --grid (and --only): take the recorded runs out "
                                                         "of the dataset, to record them again")
    p.add_argument("--merge-from", metavar="DIR", help="add the runs recorded in dataset folder DIR to "
                                                       "--out-dataset (default: lab.corpus_dir), in their splits")
    p.add_argument("--flink-version", metavar="VERSION",
                   help="apache-flink version to run (default: lab.flink_version); each version gets its own "
                        "virtualenv (.venv-flink-VERSION) and cluster folder: a second cluster at once needs other "
                        "ports (SENTINEL_LAB__REST_PORT, SENTINEL_LAB__RPC_PORT)")


COMMANDS = [
    Command("up", "development and lab", "start the embedded broker (with the topics) and the MLflow server",
            ("sentinel up", "sentinel up --no-mlflow"), _cmd_up, _up_arguments),
    Command("down", "development and lab", "stop what `sentinel up` started", ("sentinel down",), _cmd_down),
    Command("demo", "development and lab", "what `make run` runs: the embedded stack, a simulated fleet and the job",
            ("sentinel demo", "sentinel demo --fleet 48 --speed 120"), _cmd_demo, _demo_arguments),
    Command("simulate", "development and lab", "labelled Flink metric streams: to a file, to Kafka, or a dataset",
            ("sentinel simulate --list", "sentinel simulate --scenario leak_linear --out leak.jsonl",
             "sentinel simulate --out-dataset data/sim --jobs-per-scenario 5 --seed 1"),
            _cmd_simulate, _simulate_arguments),
    Command("lab", "development and lab", "run real Flink jobs that fail in known ways; record them",
            ("sentinel lab --list", "sentinel lab leak --duration 4m",
             "sentinel lab --grid corpus --only 'leak_*'"), _cmd_lab, _lab_arguments),
    Command("features", "development and lab", "the feature definitions and the offline store",
            ("sentinel features list", "sentinel features backfill --dataset data/lab"), None, _features_arguments),
]
