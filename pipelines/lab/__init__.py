"""``sentinel lab``: real Flink jobs that fail the way production jobs do, recorded as labelled data.

Runtimes layer: it may import every layer below (the foundation, whose :mod:`pipelines.datasets`
holds the dataset layout, up to the model workflows) and the other runtimes, never the command
line. ``session`` runs variants on a local cluster, ``truth`` labels and records each run,
``scenarios`` and ``corpus`` are the variants and the grids. A grid
(``sentinel lab --grid corpus``) is resumable: a run is added to the dataset folder when it ends
and variants recorded there already are skipped.
"""

from pipelines.datasets import SPLITS, recorded_runs, remove_runs
from pipelines.lab.session import LabError, LabRun, LabSession, default_dataset, run_grid, run_lab, scenario
from pipelines.lab.truth import (LAB_CLUSTER, STARTUP_MARGIN_MS, at_ms, backpressure_onset, failed_checkpoints,
                                 ground_truth, merge_runs, record_run, unsound)

__all__ = ["LAB_CLUSTER", "SPLITS", "STARTUP_MARGIN_MS", "LabError", "LabRun", "LabSession", "at_ms",
           "backpressure_onset", "default_dataset", "failed_checkpoints", "ground_truth", "merge_runs",
           "record_run", "recorded_runs", "remove_runs", "run_grid", "run_lab", "scenario", "unsound"]
