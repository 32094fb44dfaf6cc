"""Detectors: a score in [0, 1] per feature row, nothing more (decisions are the post-rule's).

One supervised detector per failure family, each reading the feature rows of its level
(localised families read vertex rows, checkpoint failures read job rows), and an unsupervised
novelty detector for what none of them explains. A detector's configuration round-trips to a
plain dict, which is saved beside the model (Merlion's habit), so a loaded model says exactly
what it expects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier, IsolationForest

try:  # scikit-learn's own, for isolation_scores (private: absent, score_samples does the work)
    from sklearn.ensemble._iforest import _average_path_length
except ImportError:  # pragma: no cover - another scikit-learn layout
    _average_path_length = None

from feature_store.definitions import FEATURES
from pipelines.families import BY_NAME

FEATURE_SET_VERSION = 5  # bump when a family's feature list changes meaning

# Which rows each family is judged on (a vertex's or the job's).
FAMILY_LEVEL = {name: family.level for name, family in BY_NAME.items()}


def default_features(family: str) -> tuple[str, ...]:
    """The features the family's detector reads (declared with the family: pipelines/families/)."""
    if family not in BY_NAME:
        raise ValueError(f"unknown family {family!r}")
    return BY_NAME[family].features


def default_monotone(family: str, features: tuple[str, ...]) -> dict[str, int]:
    """The family's monotone signs on ``features`` (+1: the score never falls as the feature
    grows, -1: never rises); features not named are free."""
    return {name: sign for name, sign in BY_NAME[family].monotone if name in features}


@dataclass
class DetectorConfig:
    family: str
    features: tuple[str, ...] = ()
    learning_rate: float = 0.1
    max_depth: int | None = 4
    max_iter: int = 200
    n_estimators: int = 200  # the novelty detector's trees
    seed: int = 0
    feature_set_version: int = FEATURE_SET_VERSION
    # feature -> +1/-1 (see Family.monotone); None: the family's default. Saved with the model.
    monotone: dict[str, int] | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILY_LEVEL:
            raise ValueError(f"unknown family {self.family!r}")
        self.features = tuple(self.features) or default_features(self.family)
        unknown = set(self.features) - {f.name for f in FEATURES}
        if unknown:
            raise ValueError(f"features not in the feature store: {sorted(unknown)}")
        if self.monotone is None:
            self.monotone = default_monotone(self.family, self.features)
        stray = set(self.monotone) - set(self.features)
        if stray or any(sign not in (-1, 1) for sign in self.monotone.values()):
            raise ValueError(f"monotone constraints must be +1/-1 on the detector's own features: {self.monotone}")

    @property
    def level(self) -> str:
        return FAMILY_LEVEL[self.family]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["features"] = list(self.features)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DetectorConfig":
        # A model saved before constraints existed was trained without any.
        return cls(**{"monotone": {}, **d, "features": tuple(d.get("features", ()))})


def rows_for(frame: pd.DataFrame, level: str) -> pd.DataFrame:
    """The feature rows a detector of ``level`` judges (job rows have a null vertex)."""
    job_rows = frame["vertex_id"].isna()
    return frame[job_rows if level == "job" else ~job_rows]


def _matrix(frame: pd.DataFrame, features: tuple[str, ...]) -> np.ndarray:
    missing = [f for f in features if f not in frame.columns]
    if missing:
        raise KeyError(f"feature rows lack {missing}")
    return frame.loc[:, list(features)].astype("float64").to_numpy()


class _Scorer:
    """The guard every detector's ``score`` shares; subclasses say how a fitted model scores."""

    model: Any

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        """One score in [0, 1] per row of ``frame``."""
        if self.model is None:
            raise RuntimeError("score() before fit()")
        if len(frame) == 0:
            return np.empty(0)
        return self._score(frame)

    def _score(self, frame: pd.DataFrame) -> np.ndarray:
        raise NotImplementedError


@dataclass
class FamilyDetector(_Scorer):
    """Supervised: the probability that a row shows its family's fault (missing values allowed)."""

    config: DetectorConfig
    model: Any = field(default=None, repr=False)

    def fit(self, frame: pd.DataFrame, is_family: np.ndarray, sample_weight: np.ndarray | None = None) -> "FamilyDetector":
        y = np.asarray(is_family, dtype=int)
        if y.min() == y.max():
            raise ValueError(f"{self.config.family}: training rows need both positive and negative labels")
        self.model = HistGradientBoostingClassifier(
            learning_rate=self.config.learning_rate, max_depth=self.config.max_depth, max_iter=self.config.max_iter,
            random_state=self.config.seed, class_weight="balanced",
            monotonic_cst=[self.config.monotone.get(name, 0) for name in self.config.features],
        ).fit(_matrix(frame, self.config.features), y, sample_weight=sample_weight)
        return self

    def _score(self, frame: pd.DataFrame) -> np.ndarray:
        return self.model.predict_proba(_matrix(frame, self.config.features))[:, 1]


@dataclass
class NoveltyDetector(_Scorer):
    """Unsupervised: how unlike the healthy training rows a row is (IsolationForest), in [0, 1].

    Trained on healthy rows only, so it never learns its own alarms as normal. Missing values
    are filled with the training medians (IsolationForest cannot take NaN); the fill is part of
    the model.
    """

    config: DetectorConfig
    model: Any = field(default=None, repr=False)
    medians: dict[str, float] = field(default_factory=dict)

    def fit(self, frame: pd.DataFrame, is_healthy: np.ndarray | None = None,
            sample_weight: np.ndarray | None = None) -> "NoveltyDetector":
        keep = np.ones(len(frame), dtype=bool) if is_healthy is None else np.asarray(is_healthy, dtype=bool)
        X = frame[keep].loc[:, list(self.config.features)].astype("float64")
        self.medians = {k: (0.0 if np.isnan(v) else float(v)) for k, v in X.median().items()}
        self.model = IsolationForest(n_estimators=self.config.n_estimators, random_state=self.config.seed)
        self.model.fit(X.fillna(self.medians).to_numpy(),
                       sample_weight=None if sample_weight is None else np.asarray(sample_weight)[keep])
        return self

    def _score(self, frame: pd.DataFrame) -> np.ndarray:
        X = frame.loc[:, list(self.config.features)].astype("float64").fillna(self.medians).to_numpy()
        # 2^(-depth/c), in (0, 1]: 1 is the most isolated.
        return np.clip(isolation_scores(self.model, X), 0.0, 1.0)


def isolation_scores(forest: IsolationForest, X: np.ndarray) -> np.ndarray:
    """``-forest.score_samples(X)``, the same numbers, without scikit-learn handing each tree to
    joblib on its own, which costs far more per tree than the tree's own work on a micro-batch's
    few rows (see BENCHMARKS.md, "2026-11-26, 6b27e09: a real-time batch's fixed cost; the novelty
    detector's trees in a plain loop"). The same steps in the
    same order as scikit-learn's (the trees in turn, each one's path lengths added to the running
    depths); a forest without the per-tree tables these steps read (another scikit-learn
    version) is scored by ``score_samples``."""
    lengths = getattr(forest, "_decision_path_lengths", None)
    averages = getattr(forest, "_average_path_length_per_tree", None)
    if lengths is None or averages is None or _average_path_length is None:
        return -forest.score_samples(X)
    X = np.asarray(X, dtype=np.float32)  # as score_samples converts it
    if X.ndim != 2 or X.shape[1] != forest.n_features_in_:
        raise ValueError(f"X of shape {X.shape}: the forest was fitted on {forest.n_features_in_} features")
    subsample = forest._max_features != X.shape[1]
    depths = np.zeros(X.shape[0], order="f")
    for tree, features, tree_lengths, tree_averages in zip(forest.estimators_, forest.estimators_features_,
                                                          lengths, averages):
        leaves = tree.apply(X[:, features] if subsample else X, check_input=False)
        depths += tree_lengths[leaves] + tree_averages[leaves] - 1.0
    denominator = len(forest.estimators_) * _average_path_length([forest._max_samples])
    return 2 ** (-np.divide(depths, denominator, out=np.ones_like(depths), where=denominator != 0))


def make_detector(config: DetectorConfig) -> FamilyDetector | NoveltyDetector:
    return FamilyDetector(config) if BY_NAME[config.family].supervised else NoveltyDetector(config)
