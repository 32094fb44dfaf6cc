"""The post-rule: turns a detector's scores into decisions, separately from the detector.

A decision needs the score over a calibrated threshold in at least ``k`` of the entity's last
``n`` evaluations (persistence: one noisy point is not an incident). The rule is trained on
validation scores and saved with the model it belongs to.

>>> rule = PostRule(threshold=0.5, k=2, n=3)
>>> rule.decide([0.9, 0.1, 0.2]), rule.decide([0.9, 0.1, 0.7])
(False, True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import product
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class PostRule:
    threshold: float = 0.5
    k: int = 1
    n: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError("threshold must be in [0, 1]")
        if not 1 <= self.k <= self.n:
            raise ValueError("need 1 <= k <= n")

    def decide(self, recent_scores: Sequence[float]) -> bool:
        """The decision after the last of ``recent_scores`` (oldest first)."""
        window = list(recent_scores)[-self.n:]
        return sum(s >= self.threshold for s in window) >= self.k

    def decisions(self, frame: pd.DataFrame, score: str = "score",
                  entity: Sequence[str] = ("cluster", "job_id", "vertex_id"), ts: str = "ts") -> pd.Series:
        """The decision at every row, each entity's rows taken in time order."""
        ordered = frame.sort_values(list(entity) + [ts], kind="stable")
        over = (ordered[score] >= self.threshold).astype(int)
        keys = [ordered[c].fillna("") for c in entity]
        counts = over.groupby(keys).transform(lambda s: s.rolling(self.n, min_periods=1).sum())
        return (counts >= self.k).reindex(frame.index)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PostRule":
        return cls(**d)

    @classmethod
    def search(cls, frame: pd.DataFrame, quality: Callable[[np.ndarray], tuple], score: str = "score",
               persistence: Sequence[tuple[int, int]] = ((1, 1), (2, 3), (3, 4), (4, 6)),
               thresholds: Sequence[float] | None = None,
               entity: Sequence[str] = ("cluster", "job_id", "vertex_id")) -> "PostRule":
        """The rule whose decisions on ``frame`` have the best ``quality`` (a sortable key).

        Ties go to the more conservative rule (higher threshold, then more persistence).
        """
        grid = thresholds if thresholds is not None else np.round(np.linspace(0.05, 0.95, 19), 2)
        best: tuple | None = None
        for t, (k, n) in product(grid, persistence):
            rule = cls(float(t), k, n)
            key = (quality(rule.decisions(frame, score, entity).to_numpy(dtype=bool)), float(t), n - k + 1)
            if best is None or key > best[0]:
                best = (key, rule)
        return best[1]

    @classmethod
    def calibrate(cls, frame: pd.DataFrame, positive: Iterable[bool], score: str = "score", **grid: Any) -> "PostRule":
        """The rule with the best F1 of per-row decisions on validation rows."""
        y = np.asarray(list(positive), dtype=bool)
        if not y.any():
            raise ValueError("calibration needs positive rows")

        def f1(decided: np.ndarray) -> float:
            tp = int((decided & y).sum())
            return 2 * tp / (2 * tp + int((decided & ~y).sum()) + int((~decided & y).sum())) if tp else 0.0

        return cls.search(frame, f1, score, **grid)
