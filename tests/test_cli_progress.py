"""Progress with an ETA on long work: counted from what the work reports, drawn on a terminal
only, the command's own lines printed above it."""

from __future__ import annotations

import io

from pipelines.cli.common import GridProgress, Progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_is_the_mean_time_per_step_times_the_steps_left():
    clock, out = Clock(), io.StringIO()
    progress = Progress(4, "runs recorded", stream=out, clock=clock, enabled=True)
    assert progress.text() == "[0/4]   0% eta ?      runs recorded"
    clock.now = 30.0
    progress.step("leak_start")
    assert progress.text("leak_start") == "[1/4]  25% eta 1m30s  runs recorded leak_start"
    clock.now = 60.0
    progress.step()
    assert out.getvalue().endswith("[2/4]  50% eta 1m     runs recorded")


def test_nothing_is_drawn_when_the_output_is_not_a_terminal(capsys):
    out = io.StringIO()  # not a tty
    progress = Progress(3, stream=out)
    assert not progress.enabled
    progress.step()
    progress.say("a line of the command")
    assert out.getvalue() == ""
    assert capsys.readouterr().out == "a line of the command\n"


def test_a_lab_grid_counts_the_runs_its_dataset_recorded_whatever_its_lines_say(capsys):
    """The lab session's progress callable, as `sentinel lab --grid` hands it over: it counts the
    grid's runs in the dataset's manifest (one recorded before the session began is not work left)."""
    clock, out, recorded = Clock(), io.StringIO(), {"r0"}
    progress = GridProgress(["r0", "r1", "r2", "r3"], lambda: recorded, stream=out, clock=clock, enabled=True)
    assert progress.progress.total == 3
    clock.now = 100.0
    progress("  submitted lab-r1 as job 42")
    assert progress.progress.done == 0 and out.getvalue().endswith("[0/3]   0% eta ?      runs recorded")
    recorded.add("r1")
    clock.now = 200.0
    progress("r1: recorded 311 events")
    assert progress.progress.done == 1
    assert out.getvalue().rstrip().endswith("[1/3]  33% eta 6m40s  runs recorded")
    recorded.update({"r2", "r3"})
    progress("r3: recorded")
    assert progress.progress.done == 3 and out.getvalue().endswith("\n")
    assert capsys.readouterr().out.splitlines() == ["  submitted lab-r1 as job 42", "r1: recorded 311 events",
                                                    "r3: recorded"]


def test_training_counts_each_grid_point_and_calibration_of_each_family(capsys):
    from itertools import product

    from models.training import ANOMALY_GRID, DEFAULT_GRID
    from pipelines.cli.model_commands import TrainingProgress

    clock, out = Clock(), io.StringIO()
    progress = TrainingProgress(["skew", "anomaly"], stream=out, clock=clock, enabled=True)
    expected = len(list(product(*DEFAULT_GRID.values()))) + 1 + len(list(product(*ANOMALY_GRID.values()))) + 1
    assert progress.progress.total == expected
    progress("training skew (1200 rows)")
    assert progress.progress.done == 0
    clock.now = 10.0
    progress("  skew: {'learning_rate': 0.05, 'max_depth': 3} -> validation average precision 0.912")
    progress("  skew: PostRule(threshold=0.5) -> validation 6 of 6 faults, 0 false")
    assert progress.progress.done == 2 and progress.progress.what == "skew"
    assert f"[2/{expected}]" in out.getvalue()
