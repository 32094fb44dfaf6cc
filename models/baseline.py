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

from pipelines.families import BY_NAME, REGISTRY


@dataclass(frozen=True)
class BaselineThresholds:
    checkpoint_size_bytes: float = 1 << 30
    growing_r2: float = 0.9
    backpressured_ratio: float = 0.2
    rate_skew_ratio: float = 1.5

    def to_dict(self) -> dict:
        return asdict(self)


def baseline_decisions(frame: pd.DataFrame, family: str, thresholds: BaselineThresholds = BaselineThresholds()) -> np.ndarray:
    """The static alarm's decision at every row (a missing value never alarms); each family's is
    declared with it (``Family.static_alarm``)."""
    if family not in BY_NAME:
        raise ValueError(f"no static baseline for {family!r}")
    return BY_NAME[family].static_alarm(frame, thresholds)


@dataclass(frozen=True)
class _AlarmConfig:
    family: str


class StaticAlarm:
    """A static alarm with a detector's face: ``score`` is 1.0 where it fires, else 0.0."""

    FAMILIES = tuple(f.name for f in REGISTRY if f.has_static_alarm)

    def __init__(self, family: str, thresholds: BaselineThresholds = BaselineThresholds()):
        self.config = _AlarmConfig(family)
        self.thresholds = thresholds

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        return baseline_decisions(frame, self.config.family, self.thresholds).astype("float64")
