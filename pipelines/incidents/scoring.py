"""Detectors' scores per feature row: pure, the same in the live job, a replay and training.

:func:`score_rows` takes feature rows and detectors and gives one score row per (feature row,
family), each naming the model version that produced it. A score that is not a number, or a
family whose scoring raises, gives no score row (the policy sees nothing rather than a NaN that
never crosses a threshold) and is counted in the models' :class:`ScoringHealth` when they have
one (the live job's :class:`Champions`), which the job reports per family
(:mod:`pipelines.detection.champions`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pandas as pd

from models.detectors import FAMILY_LEVEL, rows_for
from models.registry import LoadedDetector

log = logging.getLogger(__name__)

SCORE_COLUMNS = ["row", "family", "score", "model_name", "model_version", "model_alias"]


@dataclass
class ScoringHealth:
    """What a process's scoring met since it last reported, per family: champion loads that
    failed, feature rows judged, and those of them that got no score (NaN, or the scoring raised).
    ``errors``: each family's latest load or scoring error, until it loads or scores again."""

    load_failures: dict[str, int] = field(default_factory=dict)
    judged: dict[str, int] = field(default_factory=dict)
    unscored: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    logged: set = field(default_factory=set)  # (family, version, what) already in the log

    def count(self, counts: dict[str, int], family: str, n: int) -> None:
        counts[family] = counts.get(family, 0) + n

    def log_once(self, level: int, key: tuple, message: str, *args) -> None:
        """Log a family's trouble once per version and kind, not once per micro-batch."""
        if key not in self.logged:
            self.logged.add(key)
            log.log(level, message, *args)

    def drain(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """The counts since the last report (load failures, judged, unscored); zero afterwards."""
        counts = self.load_failures, self.judged, self.unscored
        self.load_failures, self.judged, self.unscored = {}, {}, {}
        return counts


class Champions(dict):
    """family -> :class:`LoadedDetector`, and the :class:`ScoringHealth` that
    :func:`score_rows` counts what they could not score in."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.health = ScoringHealth()


def score_rows(rows: pd.DataFrame, models: Mapping[str, LoadedDetector]) -> pd.DataFrame:
    """One row per (feature row, family of its level): ``row`` is the feature row's index.
    Where ``models`` are the job's :class:`Champions`, a NaN score or a family whose scoring
    raises gives no row and is counted in their health; elsewhere (training, evaluation) the
    scores are the detectors' as they are, and their errors raised."""
    health: ScoringHealth | None = getattr(models, "health", None)
    parts = []
    levels: dict[str, pd.DataFrame] = {}  # each level's rows taken once, not once per family
    for family, model in models.items():
        level = FAMILY_LEVEL[family]
        judged = levels.get(level)
        if judged is None:
            judged = levels[level] = rows_for(rows, level)
        if judged.empty:
            continue
        if health is None:  # training and evaluation: a broken detector is an error to see at once
            parts.append(_score_frame(judged, family, model, model.detector.score(judged)))
            continue
        try:
            scores = np.asarray(model.detector.score(judged), dtype="float64")
        except Exception as exc:  # one family's broken model must not fail the others' micro-batch
            scores = np.full(len(judged), np.nan)
            health.errors[family] = f"{model.name} version {model.version} failed to score: {exc}"[:400]
            health.log_once(logging.ERROR, (family, model.version, "score"),
                            "the %s champion %s version %s failed to score (%s): %s is NOT scored", family,
                            model.name, model.version, exc, family)
        scored = ~np.isnan(scores)
        unscored = int(len(scores) - scored.sum())
        health.count(health.judged, family, len(scores))
        if unscored:
            health.count(health.unscored, family, unscored)
            health.log_once(logging.ERROR, (family, model.version, "nan"),
                            "the %s champion %s version %s gave no score (NaN) for %d of %d feature rows: those "
                            "rows are not judged for %s", family, model.name, model.version, unscored, len(scores),
                            family)
            judged, scores = judged[scored], scores[scored]
            if judged.empty:
                continue
        parts.append(_score_frame(judged, family, model, scores))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=SCORE_COLUMNS)


def _score_frame(judged: pd.DataFrame, family: str, model: LoadedDetector, scores) -> pd.DataFrame:
    return pd.DataFrame({"row": judged.index, "family": family, "score": scores, "model_name": model.name,
                         "model_version": model.version, "model_alias": model.alias})
