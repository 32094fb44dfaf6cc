"""Anomalies: a job unlike its usual self that no other family explains.

The novelty detector (unsupervised) reads what is new about a job's behaviour, not its size or
age: a fleet's jobs differ by orders of magnitude in both, and a young or small job is not an
anomaly. Its incidents are ``info``: something to look at, never a page.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipelines.families.backpressure import SURGE_OVER_USUAL
from pipelines.families.base import STARTUP_S, Family

NAME = "anomaly"


class Anomaly(Family):
    def positives(self, labels: pd.Series) -> np.ndarray:
        return (labels != "healthy").to_numpy()  # what it should flag: any fault

    def severity(self, row: Mapping[str, Any], forecast: dict | None, critical_eta_s: float) -> str:
        return "info"

    def summary(self, where: str, row: Mapping[str, Any], forecast: dict | None, severity: str) -> str:
        return f"[{severity}] unusual checkpoint behaviour in {where} that no failure family explains; have a look"


FAMILY = Anomaly(
    name=NAME, label="Unexplained (anomaly)", alertname="FlinkAnomaly", model_name="sentinel-anomaly",
    localised=False, supervised=False, colour="tab:gray", has_static_alarm=False,
    features=(
        "checkpoint_interval_ms", "state_rel_slope_per_h", "state_r2", "state_frac_increasing",
        "state_rel_slope_long_per_h", "state_r2_long", "state_deceleration", "state_over_prior_max",
        "state_over_plateau", "checkpointed_rel_slope_per_h", "limit_ratio", "limit_eta_s",
        "checkpoint_failed_fraction", "checkpoint_consecutive_failures", "checkpoint_duration_over_interval",
        "checkpoint_duration_over_timeout", "checkpoint_duration_rel_slope_per_h", "checkpoints_in_progress",
        "restarts_in_window", "checkpoint_failures_counted", "jm_heap_ratio", "jm_heap_rel_slope_per_h",
        "persisted_inflight_rel_slope_per_h", "limit_known"),
    # A job working through more load than usual (a burst, the backlog after one) is explained by
    # the load: its checkpoints stretch for it, as the backpressure rule's surge does not page either.
    post_rule=(("startup_s", STARTUP_S), ("refused_by", (("busiest_input_over_usual", SURGE_OVER_USUAL),))),
    runbook=(
        "Compare the evidence with the job's usual checkpoint sizes, durations and rates.",
        "Check recent deployments, config changes and restarts of this job.",
        "If it is a real problem of a known kind, label it so the next training run learns it.",
    ),
)
