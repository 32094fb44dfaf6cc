"""The post-rule: turns a detector's scores into decisions, separately from the detector.

A decision needs the score over a calibrated threshold in at least ``k`` of the entity's last
``n`` evaluations (persistence: one noisy point is not an incident). The rule is trained on
validation scores and saved with the model it belongs to.

A rule may also carry a *warm-up guard* (the leak detector's): while a job is younger than
``warmup_s`` (checkpoints seen times the checkpoint interval), or younger than
``steady_growth_warmup_s`` with its state growing in one straight line since it was first seen
(long-horizon R^2 of at least ``steady_growth_r2``: windows filling, TTLs not expiring yet), or
at any age while its growth keeps slowing down (deceleration below ``decelerating_below``:
levelling off), growth is presumed to be warm-up, and a decision also needs a forecast that reaches the job's
state limit within ``warmup_eta_s``. Healthy state grows too at first; only a limit in sight
overrides that. Growth that starts after a plateau is not warm-up and is judged at once.

A rule may also require *evidence*: at least one of some feature columns at or above a minimum
(the checkpoint-failure rule wants a failed checkpoint, a checkpoint near its timeout, a pile-up,
a restart or a full JobManager heap). A decision nobody could explain from the incident is not
made.

>>> rule = PostRule(threshold=0.5, k=2, n=3)
>>> rule.decide([0.9, 0.1, 0.2]), rule.decide([0.9, 0.1, 0.7])
(False, True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import product
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd


GUARD_COLUMNS = ("job_age_checkpoints", "checkpoint_interval_ms", "limit_eta_s", "vertex_state_r2_long", "state_r2_long",
                 "vertex_state_deceleration", "state_deceleration")


@dataclass(frozen=True)
class PostRule:
    threshold: float = 0.5
    k: int = 1
    n: int = 1
    warmup_s: float = 0.0
    warmup_eta_s: float = 3600.0
    steady_growth_warmup_s: float = 0.0
    steady_growth_r2: float = 0.9
    decelerating_below: float = 0.8
    evidence: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError("threshold must be in [0, 1]")
        if not 1 <= self.k <= self.n:
            raise ValueError("need 1 <= k <= n")
        if self.warmup_s < 0 or self.warmup_eta_s < 0:
            raise ValueError("warm-up times must be >= 0")

    def decide(self, recent_scores: Sequence[float], row: Mapping[str, Any] | None = None) -> bool:
        """The decision after the last of ``recent_scores`` (oldest first); ``row`` is the feature
        row of the last one (needed by a warm-up guard)."""
        window = list(recent_scores)[-self.n:]
        held = sum(s >= self.threshold for s in window) >= self.k
        if not held or row is None:
            return held
        if self.evidence and not any(_value(row, column) >= minimum for column, minimum in self.evidence):
            return False
        return not self.warmup_s or bool(self._past_warmup(*(_value(row, c) for c in GUARD_COLUMNS)))

    def _past_warmup(self, age_checkpoints, interval_ms, limit_eta_s, vertex_r2_long, job_r2_long,
                     vertex_deceleration, job_deceleration):
        """Vectorised: True where the guard lets a decision through (NaN: unknown)."""
        age_s = np.nan_to_num(np.asarray(age_checkpoints, dtype="float64") * np.asarray(interval_ms, dtype="float64")
                              / 1000.0, nan=0.0)  # an unknown age or interval counts as young
        r2 = _vertex_else_job(vertex_r2_long, job_r2_long)
        steady_growth = np.nan_to_num(r2, nan=0.0) >= self.steady_growth_r2
        # Unknown deceleration: the earlier half was flat, so this growth began after a plateau.
        decelerating = np.nan_to_num(_vertex_else_job(vertex_deceleration, job_deceleration), nan=np.inf) \
            < self.decelerating_below
        young = (age_s < self.warmup_s) | (steady_growth & (age_s < self.steady_growth_warmup_s))
        # Growth that keeps slowing down is levelling off at any age (a leak does not decelerate).
        young |= decelerating
        limit_in_sight = np.nan_to_num(np.asarray(limit_eta_s, dtype="float64"), nan=np.inf) <= self.warmup_eta_s
        return ~young | limit_in_sight

    def decisions(self, frame: pd.DataFrame, score: str = "score",
                  entity: Sequence[str] = ("cluster", "job_id", "vertex_id"), ts: str = "ts") -> pd.Series:
        """The decision at every row, each entity's rows taken in time order."""
        group = frame.groupby([frame[c].fillna("") for c in entity], sort=False).ngroup().to_numpy()
        order = np.lexsort((frame[ts].to_numpy(), group))
        over = (frame[score].to_numpy()[order] >= self.threshold).astype(np.int64)
        g = group[order]
        # Rolling count of the last n per entity: prefix sums, each window clipped at its entity's start.
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, dtype=np.int64)
        entity_start = starts[np.searchsorted(starts, np.arange(len(g)), side="right") - 1] if len(g) else starts
        prefix = np.r_[0, np.cumsum(over)]
        i = np.arange(len(g))
        counts = prefix[i + 1] - prefix[np.maximum(i + 1 - self.n, entity_start)]
        decided = np.empty(len(g), dtype=bool)
        decided[order] = counts >= self.k
        if self.warmup_s:
            decided &= self._past_warmup(*(frame[c] if c in frame else np.nan for c in GUARD_COLUMNS))
        if self.evidence:
            shown = np.zeros(len(frame), dtype=bool)
            for column, minimum in self.evidence:
                shown |= np.nan_to_num(frame[column].to_numpy(dtype="float64"), nan=-np.inf) >= minimum
            decided &= shown
        return pd.Series(decided, index=frame.index)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "evidence": [list(e) for e in self.evidence]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PostRule":
        return cls(**{**d, "evidence": tuple(tuple(e) for e in d.get("evidence", ()))})



    @classmethod
    def search(cls, frame: pd.DataFrame, quality: Callable[[np.ndarray], tuple], score: str = "score",
               persistence: Sequence[tuple[int, int]] = ((1, 1), (2, 3), (3, 4), (4, 6)),
               thresholds: Sequence[float] | None = None,
               entity: Sequence[str] = ("cluster", "job_id", "vertex_id"),
               guards: Mapping[str, Any] | None = None) -> "PostRule":
        """The rule whose decisions on ``frame`` have the best ``quality`` (a sortable key).

        Ties go to the more conservative rule (higher threshold, then more persistence).
        ``guards`` are the fixed warm-up guard and evidence fields every candidate carries.
        """
        grid = thresholds if thresholds is not None else np.round(np.linspace(0.05, 0.95, 19), 2)
        guards = dict(guards or {})
        best: tuple | None = None
        for t, (k, n) in product(grid, persistence):
            rule = cls(float(t), k, n, **guards)
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


def _value(row: Mapping[str, Any], name: str) -> float:
    value = row.get(name)
    return float("nan") if value is None else float(value)


def _vertex_else_job(vertex_values, job_values) -> np.ndarray:
    values = np.asarray(vertex_values, dtype="float64")
    return np.where(np.isnan(values), np.asarray(job_values, dtype="float64"), values)
