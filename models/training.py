"""The retraining workflow: features from the offline store, labels, validation, training per
family, evaluation against the baseline and the champion, registration, and the gate.

Promotion is code: a new version becomes ``challenger``; it becomes ``champion`` only when it is
at least as good as the current champion on the gate metrics (fault recall, false incidents per
job-day, median detection delay, all on the same test rows) and better than the static baseline
(F1). Otherwise the champion stays and the outcome says why. A dry run logs and registers
nothing and moves no alias; it prints what would happen.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Callable, Sequence

import mlflow
import numpy as np
import pandas as pd
from pyspark.sql import SparkSession

from feature_store import offline_store
from feature_store.definitions import SHORT_WINDOW_CHECKPOINTS
from models import registry
from models.baseline import baseline_decisions
from models.detectors import FAMILY_LEVEL, DetectorConfig, make_detector, rows_for
from models.evaluation import detection_delays, evaluate
from models.post_rule import PostRule
from models.validation import TrainingSetInvalid, validate_training_set
from pipelines.config import SentinelConfig

FAMILIES = ("state_leak", "backpressure", "skew", "checkpoint_failure", "anomaly")
SUPERVISED = tuple(f for f in FAMILIES if f != "anomaly")
DEFAULT_GRID = {"learning_rate": (0.05, 0.15), "max_depth": (3, 6)}
ANOMALY_GRID = {"n_estimators": (100, 300)}  # the novelty detector has other knobs
# One false incident per job and day is what an on-call rotation tolerates for one family.
FALSE_INCIDENT_BUDGET_PER_JOB_DAY = 1.0
# Healthy state grows at first (windows filling, TTLs not yet expiring); the simulator's warm-ups
# last up to ~55 min. A leak decision on a young job needs a limit in sight (see PostRule).
# A checkpoint-failure incident must show a failure, or a checkpoint near its timeout, a pile-up,
# a restart or a nearly full JobManager heap: slower checkpoints alone are not one.
POST_RULE_GUARDS = {
    "state_leak": {"warmup_s": 30 * 60.0, "warmup_eta_s": 3600.0, "steady_growth_warmup_s": 60 * 60.0,
                   "steady_growth_r2": 0.9, "decelerating_below": 0.8},
    "checkpoint_failure": {"evidence": (("checkpoint_failed_fraction", 1e-9), ("checkpoint_duration_over_timeout", 0.5),
                                        ("checkpoints_in_progress", 2.0), ("restarts_in_window", 1.0),
                                        ("jm_heap_ratio", 0.9))},
}
GATE_TOLERANCE = {"fault_recall": 0.0, "false_incidents_per_job_day": 0.0, "delay_s_median": 0.0}

Progress = Callable[[str], None]


@dataclass
class FamilyOutcome:
    family: str
    registered_name: str
    version: str | None
    promoted: bool
    reasons: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    champion: dict[str, float] = field(default_factory=dict)
    champion_version: str | None = None

    def line(self) -> str:
        verdict = "PROMOTED to champion" if self.promoted else "kept the champion"
        return (f"{self.family:<19} v{self.version or '-':<4} {verdict}: " + "; ".join(self.reasons)
                + f"  [F1 {self.metrics.get('f1', float('nan')):.3f}, fault recall "
                  f"{self.metrics.get('fault_recall', float('nan')):.2f}, false/job-day "
                  f"{self.metrics.get('false_incidents_per_job_day', float('nan')):.2f}, median delay "
                  f"{self.metrics.get('delay_s_median', float('nan')):.0f}s]")


def positives(frame: pd.DataFrame, family: str) -> np.ndarray:
    """What a family's detector should flag: its own fault; for anomalies, any fault."""
    labels = frame["label"]
    return (labels != "healthy").to_numpy() if family == "anomaly" else (labels == family).to_numpy()


def unambiguous(frame: pd.DataFrame, family: str) -> pd.DataFrame:
    """The rows a family's detector learns and is calibrated from.

    A state leak looks exactly like warm-up growth until the growth has outlasted the short
    slope window: a fixed CEP job and its leaky twin are the same curve for the first
    ``SHORT_WINDOW_CHECKPOINTS`` checkpoints after the twin's onset. Leak rows inside that
    grace period are neither positive nor negative evidence, so they are left out of fitting and
    calibration (never out of evaluation: delays still count from the labelled onset).

    Checkpoint failures are also a *symptom* of leaks and backpressure (seed 000's leak fails
    its checkpoints). Rows of such a fault that show failures are not a lesson for the
    checkpoint-failure detector either way; they are left out of its fitting, calibration and
    evaluation, and the incident policy folds the symptom into the root cause's incident.
    """
    if frame.empty:
        return frame
    if family == "checkpoint_failure":
        return frame[~symptom_of_another_fault(frame)]
    if family != "state_leak":
        return frame
    interval = frame["checkpoint_interval_ms"].astype("float64").fillna(0.0)
    since_onset = frame["ts"].astype("float64") - frame["onset_ts"].astype("float64")
    in_grace = (frame["label"] == family) & (since_onset < SHORT_WINDOW_CHECKPOINTS * interval).fillna(False)
    return frame[~in_grace.to_numpy()]


def symptom_of_another_fault(frame: pd.DataFrame) -> np.ndarray:
    """Rows of a leak, backpressure or skew fault with failed checkpoints."""
    failing = frame["checkpoint_failed_fraction"].astype("float64").fillna(0.0) > 0
    other = ~frame["label"].isin(["healthy", "checkpoint_failure"])
    return (failing & other).to_numpy()


def load_splits(spark: SparkSession, config: SentinelConfig, dataset_dirs: Sequence[Path],
                progress: Progress) -> dict[str, pd.DataFrame]:
    """Labelled feature rows per split, read back from the offline store after a backfill."""
    splits: dict[str, pd.DataFrame] = {}
    for dataset in dataset_dirs:
        store = Path(config.features.offline_path) / "datasets" / Path(dataset).name
        events, _ = offline_store.dataset_files(dataset)
        progress(f"computing features of {dataset} into {store}")
        offline_store.backfill(spark, events, store, config.features.idle_timeout_ms)
        for split in ("train", "validation", "test"):
            truth = Path(dataset) / split / "ground_truth.jsonl"
            if truth.is_file():
                rows = offline_store.training_set(spark, store, [truth]).toPandas()
                splits[split] = pd.concat([splits[split], rows], ignore_index=True) if split in splits else rows
    missing = {"train", "validation", "test"} - set(splits)
    if missing:
        raise TrainingSetInvalid(f"the datasets have no {', '.join(sorted(missing))} split")
    return splits


def _fit(family: str, params: dict, seed: int, train: pd.DataFrame):
    detector = make_detector(DetectorConfig(family, seed=seed, **params))
    target = (train["label"] == "healthy").to_numpy() if family == "anomaly" else positives(train, family)
    return detector.fit(train, target)


def train_family(family: str, splits: dict[str, pd.DataFrame], seed: int, grid: dict,
                 progress: Progress) -> tuple[object, PostRule, dict[str, float], pd.DataFrame]:
    """Grid search on validation F1 (post-rule calibrated per candidate); returns the winner,
    its post-rule, its test metrics and the test rows it was judged on."""
    level = FAMILY_LEVEL[family]
    train, validation = (unambiguous(rows_for(splits[s], level), family) for s in ("train", "validation"))
    test = rows_for(splits["test"], level)
    if family == "checkpoint_failure":
        test = test[~symptom_of_another_fault(test)]
    best = None
    for values in product(*grid.values()):
        params = dict(zip(grid.keys(), values))
        detector = _fit(family, params, seed, train)
        scored = validation.assign(score=detector.score(validation))
        rule = calibrate_for_incidents(scored, family)
        f1 = family_metrics(validation, rule.decisions(scored).to_numpy(), family)["f1"]
        progress(f"  {family}: {params} -> validation F1 {f1:.3f} with {rule}")
        if best is None or f1 > best[0]:
            best = (f1, detector, rule)
    _, detector, rule = best
    decided = rule.decisions(test.assign(score=detector.score(test))).to_numpy()
    return detector, rule, family_metrics(test, decided, family), test


def calibrate_for_incidents(scored: pd.DataFrame, family: str) -> PostRule:
    """The post-rule as on-call people judge it: within the false-incident budget, catch the most
    faults, then raise the fewest false incidents, then catch the most faulty rows; over the
    budget, the fewer false incidents the better. (Validation sets are small: a rule that merely
    stays within the budget there can still be noisy on new jobs.)"""

    def quality(decided: np.ndarray) -> tuple:
        m = family_metrics(scored, decided, family)
        false = m["false_incidents_per_job_day"]
        within = false <= FALSE_INCIDENT_BUDGET_PER_JOB_DAY
        return (within, m["fault_recall"] if within else -false, -false, m["f1"])

    return PostRule.search(scored, quality, guards=POST_RULE_GUARDS.get(family))


def family_metrics(frame: pd.DataFrame, decided: np.ndarray, family: str) -> dict[str, float]:
    if family == "anomaly":
        return evaluate(frame.assign(label=np.where(positives(frame, "anomaly"), "anomaly", "healthy")), decided, "anomaly")
    return evaluate(frame, decided, family)


def gate(candidate: dict[str, float], champion: dict[str, float] | None, baseline: dict[str, float] | None) -> tuple[bool, list[str]]:
    """Promote only if no worse than the champion on every gate metric and better than the baseline."""
    reasons, ok = [], True
    if baseline is not None:
        if candidate["f1"] > baseline["f1"]:
            reasons.append(f"F1 {candidate['f1']:.3f} beats the static baseline's {baseline['f1']:.3f}")
        else:
            ok = False
            reasons.append(f"F1 {candidate['f1']:.3f} does not beat the static baseline's {baseline['f1']:.3f}")
    if champion is None:
        reasons.append("no champion yet")
        return ok, reasons
    checks = (("fault_recall", "higher"), ("false_incidents_per_job_day", "lower"), ("delay_s_median", "lower"))
    for metric, better in checks:
        new, old = candidate[metric], champion[metric]
        if math.isnan(old) and math.isnan(new):
            continue
        worse = (math.isnan(new) and not math.isnan(old)) or (
            not math.isnan(old) and (new < old - GATE_TOLERANCE[metric] if better == "higher"
                                     else new > old + GATE_TOLERANCE[metric]))
        if worse:
            ok = False
            reasons.append(f"{metric} {new:.3f} is worse than the champion's {old:.3f}")
    if ok:
        reasons.append("at least as good as the champion on recall, false incidents and delay")
    return ok, reasons


def _plots(family: str, test: pd.DataFrame, scores: np.ndarray, decided: np.ndarray, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay, PrecisionRecallDisplay

    y = positives(test, family)
    paths = []
    fig, ax = plt.subplots(figsize=(5, 4))
    PrecisionRecallDisplay.from_predictions(y, scores, ax=ax, name=family)
    paths.append(directory / f"{family}_precision_recall.png")
    fig.savefig(paths[-1])
    fig, ax = plt.subplots(figsize=(4, 4))
    ConfusionMatrixDisplay.from_predictions(y, decided, ax=ax, display_labels=["ok", family])
    paths.append(directory / f"{family}_confusion_matrix.png")
    fig.savefig(paths[-1])
    labelled = test.assign(label=np.where(y, family, "healthy"))
    delays = detection_delays(labelled, decided, family)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.hist(delays, bins=20)
    ax.set_xlabel("detection delay after onset (s)")
    ax.set_ylabel("faults")
    paths.append(directory / f"{family}_delay_histogram.png")
    fig.savefig(paths[-1])
    plt.close("all")
    return paths


def run_training(spark: SparkSession, config: SentinelConfig, dataset_dirs: Sequence[Path],
                 families: Sequence[str] = FAMILIES, dry_run: bool = False, seed: int = 0,
                 grid: dict | None = None, progress: Progress = print) -> list[FamilyOutcome]:
    """The whole workflow; returns one outcome per family."""
    grid = grid or DEFAULT_GRID
    registry.use_config(config)
    splits = load_splits(spark, config, dataset_dirs, progress)
    features = sorted({f for fam in families for f in DetectorConfig(fam).features})
    report = validate_training_set(splits["train"], features, [f for f in families if f != "anomaly"],
                                   known_labels=SUPERVISED)
    progress(report.text())
    if not report.success:
        raise TrainingSetInvalid(report.text())
    if not dry_run:
        mlflow.set_experiment(config.mlflow.experiment)
    outcomes = []
    for family in families:
        name = getattr(config.mlflow.models, family)
        progress(f"training {family} ({len(rows_for(splits['train'], FAMILY_LEVEL[family]))} rows)")
        family_grid = ANOMALY_GRID if family == "anomaly" and grid is DEFAULT_GRID else grid
        detector, rule, metrics, test = train_family(family, splits, seed, family_grid, progress)
        baseline = family_metrics(test, baseline_decisions(test, family), family) if family != "anomaly" else None
        champion_version = registry.alias_version(name, config.mlflow.alias)
        champion_metrics = None
        if champion_version is not None:
            champion = registry.load_detector(name, config.mlflow.alias)
            scored = test.assign(score=champion.detector.score(test))
            champion_metrics = family_metrics(test, champion.post_rule.decisions(scored).to_numpy(), family)
        promote, reasons = gate(metrics, champion_metrics, baseline)
        outcome = FamilyOutcome(family, name, None, promote and not dry_run, reasons, metrics, baseline or {},
                                champion_metrics or {}, champion_version)
        if dry_run:
            outcome.reasons.append("dry run: nothing registered, no alias moved"
                                   + (" (would promote)" if promote else ""))
        else:
            outcome.version = _log_and_register(family, name, detector, rule, splits["train"], test, metrics,
                                                baseline, champion_metrics, promote, reasons, seed, config)
        progress(outcome.line())
        outcomes.append(outcome)
    return outcomes


def _log_and_register(family, name, detector, rule, train, test, metrics, baseline, champion_metrics, promote,
                      reasons, seed, config) -> str:
    with mlflow.start_run(run_name=f"train-{family}"):
        mlflow.log_params({"family": family, "seed": seed, **{f"post_rule_{k}": v for k, v in rule.to_dict().items()},
                           **{k: v for k, v in detector.config.to_dict().items() if k not in ("features", "family")}})
        mlflow.log_metrics({f"test_{k}": v for k, v in metrics.items() if not math.isnan(v)})
        if baseline:
            mlflow.log_metrics({f"baseline_{k}": v for k, v in baseline.items() if not math.isnan(v)})
        if champion_metrics:
            mlflow.log_metrics({f"champion_{k}": v for k, v in champion_metrics.items() if not math.isnan(v)})
        level_rows = rows_for(train, FAMILY_LEVEL[family])
        scores = detector.score(test)
        with tempfile.TemporaryDirectory() as tmp:
            for path in _plots(family, test, scores, rule.decisions(test.assign(score=scores)).to_numpy(), Path(tmp)):
                mlflow.log_artifact(str(path), artifact_path="plots")
        version = registry.log_detector(detector, rule, level_rows, name, {"gate": reasons})
        mlflow.set_tag("gate", "promoted" if promote else "kept champion")
    registry.set_alias(name, registry.CHALLENGER, version)
    if promote:
        registry.set_alias(name, config.mlflow.alias, version)
    return version
