"""Checkpoint failures: timeouts, storage errors, checkpoints piling up faster than they finish.

A job-level family: its detector reads the job's checkpoint history, restarts and JobManager
heap. It is also the symptom of the other families (a leak, backpressure or a hot key makes
checkpoints slow and then fail), folded into their incidents while they are open.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipelines.families.base import Family, Plot, checkpoint_failed, col, column, fired, num

NAME = "checkpoint_failure"
# A timeout forecast opens a predicted incident only as a credible build-up: the latest checkpoint
# took at least half its timeout, the forecast's whole 95 % band falls within the warning horizon,
# and both held for PREDICT_SUSTAIN_MS with no failed checkpoint (docs/DETECTORS.md, "Forecasts").
PREDICT_MIN_OVER_TIMEOUT = 0.5
PREDICT_SUSTAIN_MS = 30_000


class CheckpointFailure(Family):
    predict_sustain_ms = PREDICT_SUSTAIN_MS
    prediction_columns = ("checkpoint_timeout_eta_high_s", "checkpoint_duration_over_timeout",
                          "checkpoint_failed_fraction")

    def predicted_rows(self, frame: pd.DataFrame, warning_horizon_s: np.ndarray) -> np.ndarray:
        high = column(frame, "checkpoint_timeout_eta_high_s")
        over = column(frame, "checkpoint_duration_over_timeout")
        failed = column(frame, "checkpoint_failed_fraction")
        with np.errstate(invalid="ignore"):
            return (high <= warning_horizon_s) & (over >= PREDICT_MIN_OVER_TIMEOUT) & ~(failed > 0)

    def severity(self, row: Mapping[str, Any], forecast: dict | None, critical_eta_s: float) -> str:
        failed = num(row, "checkpoint_failed_fraction") or 0.0
        consecutive = num(row, "checkpoint_consecutive_failures") or 0.0
        return "critical" if consecutive >= 3 or failed >= 0.5 else "warning"

    def summary(self, where: str, row: Mapping[str, Any], forecast: dict | None, severity: str) -> str:
        if row.get("predicted") and not checkpoint_failed(row):
            over = num(row, "checkpoint_duration_over_timeout")
            took = f"; the latest took {over * 100:.0f}% of the timeout" if over is not None else ""
            return f"[{severity}] checkpoint failure predicted in {where}: none has failed yet{took}"
        failed = num(row, "checkpoint_failed_fraction")
        over = num(row, "checkpoint_duration_over_timeout")
        detail = f"{failed * 100:.0f}% of recent checkpoints failed" if failed else "checkpoints near their timeout"
        if over is not None:
            detail += f", latest took {over * 100:.0f}% of the timeout"
        return f"[{severity}] checkpoint failures in {where}: {detail}; check storage latency and the timeout"

    def recent_evidence(self, record: Mapping[str, Any]) -> dict:
        message = record.get("last_failure_message")
        return {"last_failure_message": message} if message else {}

    def static_alarm(self, frame: pd.DataFrame, thresholds: Any) -> np.ndarray:
        # RATE(numberOfFailedCheckpoints) > 0, or lastCheckpointDuration above the interval.
        return fired((col(frame, "checkpoint_failed_fraction") > 0) | (col(frame, "checkpoint_duration_over_interval") > 1))


FAMILY = CheckpointFailure(
    name=NAME, label="Checkpoint failure", alertname="FlinkCheckpointFailure",
    model_name="sentinel-checkpoint-failure", localised=False, supervised=True, colour="tab:brown",
    is_failed_checkpoints=True,
    decisive_plot=Plot("checkpoint_failed_fraction", "failed share of recent checkpoints"),
    explained_by=("state_leak", "backpressure", "skew"),
    features=(
        "checkpoint_interval_ms", "checkpoint_failed_fraction", "checkpoint_consecutive_failures",
        "checkpoint_duration_over_interval", "checkpoint_duration_over_timeout", "checkpoint_duration_rel_slope_per_h",
        "checkpoints_in_progress", "restarts_in_window", "checkpoint_failures_counted", "jm_heap_ratio",
        "jm_heap_rel_slope_per_h"),
    monotone=(
        ("checkpoint_failed_fraction", 1), ("checkpoint_consecutive_failures", 1), ("checkpoint_failures_counted", 1),
        ("checkpoint_duration_over_interval", 1), ("checkpoint_duration_over_timeout", 1),
        ("checkpoint_duration_rel_slope_per_h", 1), ("restarts_in_window", 1), ("jm_heap_ratio", 1),
        ("jm_heap_rel_slope_per_h", 1)),
    # An incident must show a failure (in the history or Flink's counter), a checkpoint near its
    # timeout, a pile-up, a restart or a nearly full JobManager heap; a failed checkpoint in the
    # history decides by itself (on-call hears of it at that failure).
    post_rule=(("evidence", (("checkpoint_failed_fraction", 1e-9), ("checkpoint_duration_over_timeout", 0.5),
                             ("checkpoints_in_progress", 2.0), ("restarts_in_window", 1.0), ("jm_heap_ratio", 0.9),
                             ("checkpoint_failures_counted", 1.0))),
               ("decisive", (("checkpoint_failed_fraction", 1e-9),))),
    # The evidence already needs a real failure: on-call should hear of it at that failure, not a
    # few evaluations later.
    calibration_persistence=((1, 1),),
    # A checkpoint failure is due at the first failed checkpoint, so one fault found a poll late
    # makes a worse rule, which the median of a handful of faults does not see (docs/DETECTORS.md,
    # "On real Flink: how the detectors got there").
    delay_statistic="mean",
    learns_from_symptom_rows=False,
    recent_column="checkpoint_failed_fraction",
    runbook=(
        "Read the failure messages in the evidence: timeouts, storage errors and declined checkpoints need "
        "different fixes.",
        "Check checkpoint storage latency and errors (S3/HDFS throttling, transient 5xx) and local disk "
        "throughput for RocksDB uploads.",
        "If checkpoints run out of time, raise execution.checkpointing.timeout or reduce state per checkpoint "
        "(incremental checkpoints, fewer large operators).",
        "Keep the interval above the checkpoint duration (execution.checkpointing.min-pause) so checkpoints "
        "do not pile up; each in-flight checkpoint costs JobManager memory.",
        "Watch JobManager heap; raise jobmanager.memory.process.size if it grows with in-flight checkpoints.",
        "Check operators that call external systems during snapshotState; they can stall the checkpoint.",
    ),
)
