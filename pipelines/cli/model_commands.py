"""The model commands: train, evaluate, replay. Each checks the MLflow servers it names first."""

from __future__ import annotations

import argparse
import re

from pipelines.cli.common import JOBS_PER_SCENARIO, Progress, require_champions, require_kafka, require_mlflow
from pipelines.cli.parser import Command, duration, positive_int
from pipelines.config import SentinelConfig
from pipelines.datasets import SPLITS
from pipelines.families import FAMILIES



def training_datasets(config: SentinelConfig, args: argparse.Namespace) -> list:
    """The --dataset folders, or the default the training workflow decides on."""
    from pathlib import Path

    from models.training import default_datasets
    from pipelines import simulator

    def simulate(folder: Path) -> None:
        print(f"no --dataset given: simulating one into {folder} (every scenario, {args.jobs_per_scenario} jobs "
              "each)", flush=True)
        simulator.write_dataset(folder, list(simulator.CATALOGUE), args.jobs_per_scenario, args.seed,
                                int(args.duration * 1000))

    # `sentinel demo` trains with this too, and has no --dataset: it always simulates the default.
    if getattr(args, "dataset", None):
        return [Path(d) for d in args.dataset]
    datasets = default_datasets(config, args.seed, simulate)
    print("training on " + " and the real-Flink corpus ".join(map(str, datasets)) +
          ("" if len(datasets) > 1 else f" (no real-Flink corpus at {config.lab.corpus_dir})"), flush=True)
    return datasets


def train(config: SentinelConfig, args: argparse.Namespace, families, dry_run: bool = False) -> None:
    # The services first, before the imports of MLflow, scikit-learn and Spark: a stop costs a second.
    require_mlflow(config)
    if getattr(args, "feedback", False):
        require_kafka(config)
    from models.training import run_training
    from pipelines.spark_session import build_spark

    datasets = training_datasets(config, args)
    spark = build_spark(config, "train")
    feedback = None
    if getattr(args, "feedback", False):
        from pipelines.feedback import load_fleet_feedback

        feedback = load_fleet_feedback(spark, config)
        print(f"the fleet's feedback: {len(feedback)} verdicts on {config.topics.feedback}, "
              f"{len(feedback.rows)} feature rows of their jobs in the feature log", flush=True)
    outcomes = run_training(spark, config, datasets, families, dry_run=dry_run, seed=args.seed,
                            progress=TrainingProgress(families), feedback=feedback)
    print("\nsummary:")
    for outcome in outcomes:
        print("  " + outcome.line())


class TrainingProgress:
    """The ``progress`` of ``run_training``: prints its lines, and counts a step at each family's
    grid point and at its calibration (the lines that end in a validation figure), with an ETA
    on a terminal."""

    STEP = re.compile(r"^  (\w+): .+ -> validation ")

    def __init__(self, families, **progress_options):
        from itertools import product

        from models.training import ANOMALY_GRID, DEFAULT_GRID
        from pipelines.families import BY_NAME

        steps = sum(len(list(product(*(DEFAULT_GRID if BY_NAME[f].supervised else ANOMALY_GRID).values()))) + 1
                    for f in families)
        self.progress = Progress(steps, "training", **progress_options)

    def __call__(self, line: str) -> None:
        step = self.STEP.match(line)
        if step:
            self.progress.done = min(self.progress.done + 1, self.progress.total)
            self.progress.what = step.group(1)
        self.progress.say(line)


def _cmd_train(config: SentinelConfig, args: argparse.Namespace) -> int:
    train(config, args, args.family or FAMILIES, dry_run=args.dry_run)
    return 0


def _cmd_evaluate(config: SentinelConfig, args: argparse.Namespace) -> int:
    require_mlflow(config)
    import tempfile
    from pathlib import Path

    from pipelines.datasets import subset
    from pipelines.reports.backtest import evaluate_dataset, write_report

    dataset = Path(args.dataset) if args.dataset else Path(config.lab.corpus_dir)
    cache = require_champions(config)
    with tempfile.TemporaryDirectory() as tmp:
        chosen = subset(dataset, args.run, Path(tmp) / dataset.name) if args.run else dataset
        evaluation = evaluate_dataset(config, chosen, args.split, cache.models)
    for line in (evaluation.run_lines() + [""] + evaluation.family_lines() + [""] + evaluation.stratum_lines()
                 + ([""] + evaluation.lead_lines() if evaluation.lead else [])
                 + ([""] + evaluation.ending_lines() if evaluation.comparison.ended else [])):
        print(line)
    out = Path(args.out) if args.out else Path(config.state_dir) / "reports" / f"evaluate-{dataset.name}-{args.split}"
    index = write_report(evaluation, out, f"sentinel evaluate: {dataset} ({args.split})")
    print(f"\nreport with a plot per run: {index}")
    return 0


def _cmd_replay(config: SentinelConfig, args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    for path in args.inputs:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no such events file: {path}")
    require_mlflow(config)
    from pipelines.detection.flink_job import replay
    from pipelines.incidents.comparison import compare

    cache = require_champions(config)
    result = replay(config, args.inputs, cache.models)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(i) + "\n" for i in result.incidents))
    print(f"replayed {result.events} events: {len(result.incidents)} incident events "
          f"({sum(i['event'] == 'opened' for i in result.incidents)} opened) -> {out}")
    if result.dead_letters:
        letters = out.with_name(out.stem + ".dead_letters.jsonl")
        letters.write_text("".join(json.dumps(d) + "\n" for d in result.dead_letters))
        print(f"{len(result.dead_letters)} unusable lines -> {letters}")
    if args.truth:
        truths = [json.loads(line) for t in args.truth for line in Path(t).read_text().splitlines() if line.strip()]
        for line in compare(truths, result.incidents).lines():
            print(line)
    return 0


def training_dataset_arguments(p: argparse.ArgumentParser) -> None:
    """How a command that trains without --dataset simulates its dataset (train, demo)."""
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated dataset and of the model search")
    p.add_argument("--jobs-per-scenario", type=positive_int, default=JOBS_PER_SCENARIO, metavar="N",
                   help="jobs of each scenario in a simulated training dataset")
    p.add_argument("--duration", type=duration, default=5400.0, metavar="DURATION",
                   help="event time per job of a simulated training dataset, at most")


def _train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", action="append", metavar="DIR",
                   help="labelled dataset folder to train on (repeatable; default: a simulated one under the state "
                        "folder and the real-Flink corpus, lab.corpus_dir)")
    p.add_argument("--family", action="append", choices=FAMILIES, metavar="FAMILY",
                   help=f"train only this family's detector (repeatable; one of {', '.join(FAMILIES)}; "
                        "default: every family)")
    p.add_argument("--dry-run", action="store_true",
                   help="show the gate's decision; register nothing, move no alias")
    p.add_argument("--feedback", action="store_true",
                   help="also learn from on-call's verdicts (`sentinel feedback`) on the feedback topic, with the "
                        "live feature log's rows of those incidents; the gate reports and checks them")
    training_dataset_arguments(p)


def _evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", metavar="DIR", help="labelled dataset folder to replay (default: the real-Flink "
                                                    "corpus, lab.corpus_dir)")
    p.add_argument("--split", default="test", choices=SPLITS, help="the dataset's split to replay")
    p.add_argument("--run", action="append", metavar="RUN_ID", help="only this run, a lab run id or a job name "
                                                                    "(repeatable; default: every run of the split)")
    p.add_argument("--out", metavar="DIR", help="where the report goes (default: "
                                                "<state_dir>/reports/evaluate-<dataset>-<split>)")
    p.add_argument("--report", dest="out", help=argparse.SUPPRESS)  # its name before --out


def _replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT.jsonl", help="input-contract events, one JSON per line")
    p.add_argument("--out", required=True, metavar="INCIDENTS.jsonl", help="where the incident events go (required)")
    p.add_argument("--truth", action="append", metavar="GROUND_TRUTH.jsonl",
                   help="compare with labelled faults, the simulator's or the lab's ground truth (repeatable; "
                        "default: no comparison)")


COMMANDS = [
    Command("train", "models", "retrain the detectors; promote through the champion/challenger gate",
            ("sentinel train", "sentinel train --family state_leak --dry-run    # the gate's decision, no change"),
            _cmd_train, _train_arguments),
    Command("evaluate", "models", "replay labelled runs with the champions and the static alarms; judge every run",
            ("sentinel evaluate", "sentinel evaluate --dataset data/lab --split validation --out /tmp/report"),
            _cmd_evaluate, _evaluate_arguments),
    Command("replay", "models", "the detection pipeline on recorded events (backtest a model)",
            ("sentinel replay events.jsonl --out incidents.jsonl --truth events.ground_truth.jsonl",),
            _cmd_replay, _replay_arguments),
]
