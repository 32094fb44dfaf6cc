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

from feature_store.definitions import FEATURES, features_of
from pipelines.families import FAMILIES, LOCALISED

FEATURE_SET_VERSION = 5  # bump when a family's feature list changes meaning

# No job age: in the simulated fleet every fault strikes a job hours old, in the lab minutes old,
# and a detector that reads age learns "young jobs do not fail" (see docs/DETECTORS.md, "Detectors
# and their post-rules"). Start-up is told apart by what it looks like (every vertex busy, none
# backpressured), and a leak's warm-up by the post-rule's horizon.
CONTEXT = ("checkpoint_interval_ms",)
AGE = ("job_age_s", "job_age_checkpoints")
# Absolute sizes differ by orders of magnitude between jobs (a lab job's megabytes, a fleet's
# gigabytes): a detector that splits on them learns the jobs it saw, not the failure.
ABSOLUTE = ("state_size_bytes", "vertex_state_size_bytes", "state_growth_bytes_per_record", "persisted_inflight_bytes")

# Which rows each family is judged on, and which features it reads.
FAMILY_LEVEL = {family: "vertex" if family in LOCALISED else "job" for family in FAMILIES}


def default_features(family: str) -> tuple[str, ...]:
    if family == "state_leak":
        # How long a job may warm up is the operator's (the post-rule's horizon), not learned.
        return CONTEXT + _relative(features_of("state_leak")) + (
            "busy_reported", "state_reported", "limit_known")
    if family == "backpressure":
        # No buffer-pool usage: a saturated operator fed over a local channel (the same TaskManager)
        # reports inPoolUsage 0 on Flink 2.3, over the network close to 1 (see docs/DETECTORS.md,
        # "Detectors and their post-rules");
        # the backpressured time of the vertices around it says the same thing either way.
        # No subtask means either: a vertex is as fast as its slowest subtask, and a mean hides
        # one hot subtask that saturates (the more so, the higher the parallelism).
        # No growth of the barriers' delays: a saturated bottleneck's checkpoints all expire, its
        # delays stop growing at the timeout, and a model reading their slopes let go of it there.
        named = tuple(n for n in _relative(features_of("backpressure"))
                      if n not in ("in_pool_max", "out_pool_max", "busy_mean", "idle_mean",
                                   "start_delay_rel_slope_per_h", "alignment_rel_slope_per_h"))
        return CONTEXT + named + ("busy_reported", "checkpoint_duration_over_interval",
                                  "checkpoint_duration_over_timeout")
    if family == "skew":
        # hot_subtask is an index: where the skew is, not whether.
        return CONTEXT + tuple(n for n in features_of("skew") if n != "hot_subtask") + ("busy_max", "start_delay_max_ms")
    if family == "checkpoint_failure":
        return CONTEXT + features_of("checkpoint_failure")
    if family == "anomaly":
        # What is new about a job's behaviour, not about its size or age: a fleet's jobs differ by
        # orders of magnitude in both, and a young or small job is not an anomaly.
        return tuple(f.name for f in FEATURES if f.level == "job" and f.name not in ABSOLUTE + AGE)
    raise ValueError(f"unknown family {family!r}")


def _relative(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n for n in names if n not in ABSOLUTE)


# How a family's score may move as a feature grows, all else equal (+1: never down, -1: never
# up), in the direction operators read these metrics; features not named are free. Trained on
# a few dozen real runs and a simulator, an unconstrained model learns accidents of its data (a
# long checkpoint start delay lowered a saturated bottleneck's score: see docs/DETECTORS.md, "On
# real Flink: how the detectors got there").
MONOTONE: dict[str, dict[str, int]] = {
    "backpressure": {
        "busy_max": 1,
        # the bottleneck itself is busy, not waiting: its own backpressured time says "look downstream"
        "backpressured_max": -1, "backpressured_mean": -1,
        "downstream_of_backpressure": 1, "is_busiest_vertex": 1, "others_backpressured_max": 1,
        "start_delay_max_ms": 1, "alignment_max_ms": 1, "start_delay_rel_slope_per_h": 1,
        "alignment_rel_slope_per_h": 1, "persisted_inflight_rel_slope_per_h": 1,
        "checkpoint_duration_over_interval": 1, "checkpoint_duration_over_timeout": 1,
    },
    "skew": {
        "records_in_max_over_mean": 1, "records_in_cv": 1, "records_in_hot_excess": 1,
        "state_max_over_mean": 1, "state_cv": 1, "state_hot_excess": 1, "start_delay_max_over_median": 1,
    },
    "checkpoint_failure": {
        "checkpoint_failed_fraction": 1, "checkpoint_consecutive_failures": 1, "checkpoint_failures_counted": 1,
        "checkpoint_duration_over_interval": 1, "checkpoint_duration_over_timeout": 1,
        "checkpoint_duration_rel_slope_per_h": 1, "restarts_in_window": 1, "jm_heap_ratio": 1,
        "jm_heap_rel_slope_per_h": 1,
    },
    # None for leaks: a warm-up and a leak differ in how growth, fit and deceleration combine;
    # constrained, the leak detector fired on a simulated CEP warm-up and missed linear leaks.
}


def default_monotone(family: str, features: tuple[str, ...]) -> dict[str, int]:
    return {name: sign for name, sign in MONOTONE.get(family, {}).items() if name in features}


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
    # feature -> +1/-1 (see MONOTONE); None: the family's default. Saved with the model.
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
    return NoveltyDetector(config) if config.family == "anomaly" else FamilyDetector(config)
