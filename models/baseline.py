"""The static-threshold alarms operators use today (AWS and Prometheus style), as the bar every
detector must clear.

* state leak: an operator's checkpointed state keeps growing (a straight line up over the last
  checkpoints, ``deriv(...) > 0`` with a good fit), or it is above a fixed size;
* checkpoint failure: ``RATE(numberOfFailedCheckpoints) > 0`` or ``lastCheckpointDuration``
  above the checkpoint interval;
* backpressure: ``backPressuredTimeMsPerSecond > 200`` for a minute (the features are one-minute
  averages already), on the vertex that reports it;
* skew: Dhalion's rate-skew ratio (busiest subtask's input rate over the mean) above 1.5.

:class:`StaticAlarm` presents an alarm as a detector whose score is 0 or 1, so the same
post-rule and incident policy turn it into incidents for a like-for-like comparison.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class BaselineThresholds:
    checkpoint_size_bytes: float = 1 << 30
    growing_r2: float = 0.9
    backpressured_ratio: float = 0.2
    rate_skew_ratio: float = 1.5

    def to_dict(self) -> dict:
        return asdict(self)


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name].astype("float64")


def baseline_decisions(frame: pd.DataFrame, family: str, thresholds: BaselineThresholds = BaselineThresholds()) -> np.ndarray:
    """The static alarm's decision at every row (a missing value never alarms)."""
    if family == "state_leak":
        fired = (_column(frame, "vertex_state_size_bytes") > thresholds.checkpoint_size_bytes) | (
            (_column(frame, "vertex_state_rel_slope_per_h") > 0) & (_column(frame, "vertex_state_r2") >= thresholds.growing_r2))
    elif family == "checkpoint_failure":
        fired = (_column(frame, "checkpoint_failed_fraction") > 0) | (_column(frame, "checkpoint_duration_over_interval") > 1)
    elif family == "backpressure":
        fired = _column(frame, "backpressured_max") > thresholds.backpressured_ratio
    elif family == "skew":
        fired = _column(frame, "records_in_max_over_mean") > thresholds.rate_skew_ratio
    else:
        raise ValueError(f"no static baseline for {family!r}")
    return fired.fillna(False).to_numpy(dtype=bool)


@dataclass(frozen=True)
class _AlarmConfig:
    family: str


class StaticAlarm:
    """A static alarm with a detector's face: ``score`` is 1.0 where it fires, else 0.0."""

    FAMILIES = ("state_leak", "backpressure", "skew", "checkpoint_failure")

    def __init__(self, family: str, thresholds: BaselineThresholds = BaselineThresholds()):
        self.config = _AlarmConfig(family)
        self.thresholds = thresholds

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        return baseline_decisions(frame, self.config.family, self.thresholds).astype("float64")
