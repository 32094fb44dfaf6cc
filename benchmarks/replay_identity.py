"""Replay identity: the decisions of a commit, as canonical incident lines and one digest.

A refactor that should change no decision is checked by running this on the commit before and
the commit after and comparing the digests. It does what the test suite's champions do
(``tests/champions.py``): writes the same simulated dataset (same scenarios, jobs, seed and
length), trains every family with ``sentinel train``'s workflow on it and the committed
real-Flink corpus (``data/lab``) with one grid point and seed 0, and gives each family's new
model the champion alias. Then, as ``sentinel evaluate`` does (``evaluate_dataset``: the live
job's validation, feature state machine, scoring and policy on the recorded events, with each
run's declared warm-up horizon), it replays

* the real-Flink test split (``data/lab/test``), and
* the simulator's test runs (the simulated dataset's ``test`` split),

with the champions and with the static alarms, through the same policy.

Each replay's incident events are written as canonical JSON lines to ``OUT``: keys sorted, no
spaces, the lines sorted. Nothing is dropped: incident ids are a hash of the incident's cluster,
job, family, vertex and opening time, every time is the recording's, and model versions count
from 1 in the run's own fresh MLflow store, so two runs of the same code give the same bytes
(checked by running twice). ``OUT/digest.txt`` holds the sha256 of each file and of all of them,
``OUT/post_rules.json`` the rule each family was calibrated to (a clue to where a difference
came from; only the incidents decide).

Usage (it runs the code of the checkout it is in, whatever the venv's editable install points
at: see BENCHMARKS.md, "Replay identity"):

    .venv/bin/python benchmarks/replay_identity.py OUT [--keep-work]
    .venv/bin/python benchmarks/replay_identity.py OUT --compare BASELINE_OUT

``--minutes 30`` trains on a smaller simulated dataset (every scenario
still, and the whole corpus): quicker, as deterministic, and compared only with a baseline made
with the same options (``OUT/parameters.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LAB_CORPUS = PROJECT_ROOT / "data" / "lab"
# As tests/champions.py trains the suite's champions: the gate and the grid search are
# measured elsewhere; here only that the same code makes the same decisions.
TRAINING_GRID = {"learning_rate": (0.1,), "max_depth": (4,)}
SIMULATED_SEED = 5
JOBS_PER_SCENARIO = 3
MINUTES = 90
SEED = 0
SPLIT = "test"
# The output files by stem: each test split replayed with the champions and with the static alarms.
REPLAYS = ("lab-test.champions", "lab-test.static", "simulated-test.champions", "simulated-test.static")


def canonical_lines(incidents: list[dict]) -> list[str]:
    """One canonical JSON line per incident event, sorted.

    >>> canonical_lines([{"b": 1.5, "a": None}, {"a": "x"}])
    ['{"a":"x"}', '{"a":null,"b":1.5}']
    """
    return sorted(json.dumps(incident, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                  for incident in incidents)


def environment(state_dir: Path) -> dict[str, str]:
    """The config's environment: this run's own state folder, the defaults for everything else
    (a developer's SENTINEL_* settings must not change the decisions), as tests/conftest.py's
    ``config_for`` makes it."""
    return {"SENTINEL_STATE_DIR": str(state_dir), "SENTINEL_DETECTION__METRICS_PORT": "0",
            "SENTINEL_COLLECTOR__METRICS_PORT": "0", "SENTINEL_ALERT__METRICS_PORT": "0"}


def train(work: Path, jobs_per_scenario: int, minutes: int, progress) -> tuple[object, dict]:
    """Champions trained as the test suite trains them (with its simulated dataset unless told
    otherwise); returns the config and the models."""
    from models import registry
    from models.training import run_training
    from pipelines import simulator
    from pipelines.config import load_config
    from pipelines.detection.champions import ChampionCache
    from pipelines.spark_session import build_spark

    simulated = work / "datasets" / "simulated"
    manifest = simulator.write_dataset(simulated, list(simulator.CATALOGUE), jobs_per_scenario=jobs_per_scenario,
                                       seed=SIMULATED_SEED, duration_ms=minutes * 60_000)
    if not manifest["splits"][SPLIT]["jobs"]:
        # Each scenario's jobs are split 60/20/20: too few leave the simulator's test runs empty.
        raise SystemExit(f"--jobs-per-scenario {jobs_per_scenario} leaves the simulated {SPLIT} split empty; use 3 or more")
    state_dir = work / "state"
    config = load_config(environ=environment(state_dir), base_dir=state_dir)
    spark = build_spark(config, "replay-identity")
    try:
        outcomes = run_training(spark, config, [simulated, LAB_CORPUS], seed=SEED, grid=TRAINING_GRID,
                                progress=progress)
    finally:
        spark.stop()
    registry.use_config(config)
    for outcome in outcomes:
        # Every family needs a champion to replay with, whatever the gate said.
        if not outcome.promoted:
            registry.set_alias(outcome.registered_name, registry.CHAMPION, outcome.version)
    return config, ChampionCache(config).require()


def replay_all(config, models: dict, work: Path) -> dict[str, list[dict]]:
    """Each replay's incident events, by output file stem."""
    from pipelines.reports.backtest import evaluate_dataset

    out = {}
    for name, dataset in (("lab-test", LAB_CORPUS), ("simulated-test", work / "datasets" / "simulated")):
        evaluation = evaluate_dataset(config, dataset, SPLIT, models)
        out[f"{name}.champions"] = evaluation.incidents
        out[f"{name}.static"] = evaluation.baseline_incidents
    return out


def write_outputs(out: Path, replays: dict[str, list[dict]], models: dict, parameters: dict) -> str:
    """The canonical files, ``digest.txt`` and ``parameters.json``; returns the digest of all the files."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "parameters.json").write_text(json.dumps(parameters, sort_keys=True) + "\n")
    whole = hashlib.sha256()
    lines = []
    for stem in REPLAYS:
        data = "".join(line + "\n" for line in canonical_lines(replays[stem])).encode()
        (out / f"{stem}.jsonl").write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        # The whole digest covers each file's name and length too, so no two layouts collide.
        whole.update(f"{stem}.jsonl {len(data)}\n".encode())
        whole.update(data)
        lines.append(f"{digest}  {stem}.jsonl  ({len(replays[stem])} incident events)")
    total = whole.hexdigest()
    (out / "digest.txt").write_text(f"{total}  all\n" + "\n".join(lines) + "\n")
    # The rules as they serialise (a refactor may change their form and no decision): a clue, not a verdict.
    rules = {family: (model.post_rule.to_dict() if hasattr(model.post_rule, "to_dict") else repr(model.post_rule))
             for family, model in sorted(models.items())}
    (out / "post_rules.json").write_text(json.dumps(rules, sort_keys=True, indent=1, default=str) + "\n")
    return total


def read_digest(out: Path) -> str:
    return (out / "digest.txt").read_text().split()[0]


def compare(out: Path, baseline: Path) -> list[str]:
    """Which files differ from the baseline's, with their first differing line; empty if none."""
    ours, theirs = (json.loads((folder / "parameters.json").read_text()) for folder in (out, baseline))
    if ours != theirs:
        return [f"the runs trained on different simulated datasets: {ours} here, {theirs} in the baseline"]
    problems = []
    for stem in REPLAYS:
        ours = (out / f"{stem}.jsonl").read_text().splitlines()
        theirs = (baseline / f"{stem}.jsonl").read_text().splitlines()
        if ours == theirs:
            continue
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        problems.append(f"{stem}.jsonl differs: {len(ours)} lines against the baseline's {len(theirs)}, first at "
                        f"line {first + 1}:\n  this run: {ours[first][:300] if first < len(ours) else '(none)'}\n"
                        f"  baseline: {theirs[first][:300] if first < len(theirs) else '(none)'}")
    return problems


def rule_note(out: Path, baseline: Path) -> str | None:
    """Whether the calibrated post-rules read differently (a clue to where decisions changed)."""
    ours, theirs = (json.loads((folder / "post_rules.json").read_text()) for folder in (out, baseline))
    if ours == theirs:
        return None
    return f"note: the post-rules serialise differently:\n  this run: {ours}\n  baseline: {theirs}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output folder (its files are replaced)")
    parser.add_argument("--compare", type=Path, metavar="BASELINE_OUT",
                        help="a folder this script wrote on another commit: exit 1 unless identical")
    parser.add_argument("--jobs-per-scenario", type=int, default=JOBS_PER_SCENARIO,
                        help=f"simulated jobs of each scenario (default {JOBS_PER_SCENARIO}, as the tests' champions)")
    parser.add_argument("--minutes", type=int, default=MINUTES,
                        help=f"length of each simulated job (default {MINUTES}, as the tests' champions)")
    parser.add_argument("--keep-work", action="store_true",
                        help="keep OUT/work (the simulated dataset, offline store and MLflow store)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

    # The checkout this file is in, not the venv's editable install of another one: for this
    # process and for Spark's Python workers, which inherit PYTHONPATH.
    sys.path.insert(0, str(PROJECT_ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    import pipelines

    code = Path(pipelines.__file__).resolve().parent.parent
    if code != PROJECT_ROOT:
        raise SystemExit(f"pipelines comes from {code}, not from this checkout {PROJECT_ROOT}")
    started = time.monotonic()
    print(f"code: {code}", flush=True)
    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    parameters = {"jobs_per_scenario": args.jobs_per_scenario, "minutes": args.minutes, "seed": SIMULATED_SEED}
    config, models = train(work, args.jobs_per_scenario, args.minutes, lambda line: print(line, flush=True))
    trained_s = time.monotonic() - started
    replays = replay_all(config, models, work)
    write_outputs(args.out, replays, models, parameters)
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    total_s = time.monotonic() - started
    print((args.out / "digest.txt").read_text(), end="")
    print(f"trained in {trained_s:.0f} s, replayed in {total_s - trained_s:.0f} s, {total_s:.0f} s in all")
    if args.compare is None:
        return 0
    problems = compare(args.out, args.compare)
    note = rule_note(args.out, args.compare)
    if note:
        print(note)
    if problems:
        print(f"NOT identical to {args.compare} (digest {read_digest(args.compare)}):")
        for problem in problems:
            print(problem)
        return 1
    print(f"identical to {args.compare} (digest {read_digest(args.compare)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
