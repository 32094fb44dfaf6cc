"""The test run's trained champions, made once, in a process of their own, beside the first tests.

Training them is the suite's largest single piece of work: writing the simulated dataset, its
feature backfill in Spark, each family's calibration (about five minutes on two slow cores). So
the first test process that collects a test needing them starts this module as a subprocess, and
the tests that need them run last (see ``tests/conftest.py``): the training overlaps the tests that
do not need it, and pytest-xdist's workers share its one result. The processes meet in one folder
of the test run: whoever creates ``claimed`` first starts the training; everyone reads the result
once ``done`` is there (or reports the log once ``failed`` is).

Run by hand: ``python -m tests.champions FOLDER``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LAB_CORPUS = PROJECT_ROOT / "data" / "lab"  # the committed real-Flink corpus
# One point of the grid: the gate and the grid search are tested on their own (tests/models).
TRAINING_GRID = {"learning_rate": (0.1,), "max_depth": (4,)}

CLAIMED, DONE, FAILED, LOG = "claimed", "done", "failed", "champions.log"


def simulated_dataset(root: Path) -> Path:
    return root / "datasets" / "simulated"


def store_state_dir(root: Path) -> Path:
    """The state folder of the config whose MLflow store holds the champions."""
    return root / "trained" / "state"


def start(root: Path) -> subprocess.Popen | None:
    """Start the training in ``root`` unless a process of this test run already has."""
    root.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(root / CLAIMED, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None
    with open(root / LOG, "wb") as log:
        # Not a session of its own: Ctrl-C at the terminal stops it with the tests.
        return subprocess.Popen([sys.executable, "-m", "tests.champions", str(root)], cwd=PROJECT_ROOT,
                                stdout=log, stderr=subprocess.STDOUT)


def wait_for(root: Path, marker: str, timeout_s: float = 3600.0) -> None:
    """Block until the training in ``root`` wrote ``marker``; raise with its log if it failed."""
    deadline = time.monotonic() + timeout_s
    while not (root / marker).exists():
        if (root / FAILED).exists():
            raise RuntimeError(f"training the test run's champions failed; the end of {root / LOG}:\n"
                               + _tail(root / LOG))
        if not (root / CLAIMED).exists():
            raise RuntimeError(f"no process started the champions' training in {root}: "
                               "tests/conftest.py starts it when the collected tests need it")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the champions' training in {root} wrote no {marker} in {timeout_s:.0f} s; "
                               f"the end of its log:\n" + _tail(root / LOG))
        time.sleep(1.0)


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def train(root: Path) -> None:
    """What `sentinel train` does by default, with one grid point; every family gets a champion."""
    from models import registry
    from models.training import run_training
    from pipelines import simulator
    from pipelines.spark_session import build_spark
    from tests.conftest import config_for

    started = time.monotonic()
    simulator.write_dataset(simulated_dataset(root), list(simulator.CATALOGUE), jobs_per_scenario=3, seed=5,
                            duration_ms=90 * 60_000)
    print(f"datasets written in {time.monotonic() - started:.0f} s", flush=True)
    config = config_for(store_state_dir(root))
    spark = build_spark(config, "champions")
    try:
        outcomes = run_training(spark, config, [simulated_dataset(root), LAB_CORPUS], grid=TRAINING_GRID)
    finally:
        spark.stop()
    registry.use_config(config)
    for outcome in outcomes:
        # The gate is tested elsewhere; here every family needs a champion to score with.
        if not outcome.promoted:
            registry.set_alias(outcome.registered_name, registry.CHAMPION, outcome.version)
    print(f"champions trained in {time.monotonic() - started:.0f} s", flush=True)


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    try:
        train(root)
    except BaseException:
        traceback.print_exc()
        (root / FAILED).touch()
        return 1
    (root / DONE).touch()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
