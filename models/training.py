"""The retraining workflow: features from the offline store, labels, validation, training per
family, evaluation against the baseline and the champion, registration, and the gate.

Datasets are runs: simulated jobs and real Flink lab runs, each with its ground truth. For every
family (causes before their symptoms) a small grid of detectors is fitted on the train runs; the
best by validation average precision gets its post-rule calibrated **at incident level**: each
candidate rule is replayed through the incident policy on the validation runs and judged run by
run (faults found, false incidents, delay); the anomaly rule beside the supervised families' new
models, so an anomaly that opens before its cause counts against it as it will live. Test runs
report how the new models do, next to the static alarms, through the same policy.

Promotion is code: a new version becomes ``challenger``; it becomes ``champion`` only through
the gate, which replays the validation runs of real Flink (the simulated ones when there are
none) with the challenger in place of its family's champion, through the same post-rules and
policy the job runs. It must find at least the faults of its family the champion found, with no
more false incidents and no more false families, and do at least as well as the static alarms
(faults found minus false incidents and families). With the fleet's feedback (``sentinel train
--feedback``), it must also open no more of the incidents on-call called false positives, and
catch no fewer of those on-call confirmed, than the champion. A dry run registers nothing and
moves no alias.

One piece: one workflow that :func:`run_training` runs in order (load, fit, calibrate, gate,
register), each step a function reading the one before; the gate and the calibration replay the
same policy on the same runs, so they are read together (the file is a few lines over the limit).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Callable, Mapping, Sequence

import mlflow
import numpy as np
import pandas as pd
from pyspark.sql import SparkSession
from sklearn.metrics import average_precision_score

from feature_store import offline_store
from feature_store.definitions import SHORT_WINDOW_CHECKPOINTS
from models import feedback as fleet_feedback
from models import registry
from models.detectors import FAMILY_LEVEL, DetectorConfig, make_detector, rows_for
from models.evaluation import Runs, excused_false, judge, numbered, row_metrics, static_alarms, truth_overrides
from models.post_rule import PostRule
from models.registry import LoadedDetector
from models.validation import TrainingSetInvalid, validate_training_set
from pipelines.config import SentinelConfig
from pipelines.datasets import SPLITS
from pipelines.families import ANOMALY, BY_NAME, CHECKPOINT_FAILURE, EXPLAINED_BY, FAMILIES, SUPERVISED
from pipelines.incidents.comparison import Comparison
from pipelines.incidents.policy import PolicySettings

DEFAULT_GRID = {"learning_rate": (0.05, 0.15), "max_depth": (3, 6)}
ANOMALY_GRID = {"n_estimators": (100, 300)}  # the novelty detector has other knobs
CALIBRATION_THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ANOMALY_QUANTILES = (0.95, 0.99, 0.995, 0.999, 0.9999)
# Each family's rule carries the guards its module declares (``Family.post_rule``, written from
# what operators know), is calibrated over its persistence grid, and among rules equally good on
# faults and false incidents the soonest wins by its delay statistic (pipelines/families/).
# Sooner by less than this share of the delay (or these seconds) is a tie, and ties go to the
# more conservative rule: a second sooner on the validation runs does not pay for a lower
# threshold's false incidents on jobs they do not hold.
DELAY_TIE_SHARE, DELAY_TIE_S = 0.05, 2.0
POST_RULE_GUARDS = {family.name: family.guards for family in BY_NAME.values()}


Progress = Callable[[str], None]


@dataclass
class FamilyOutcome:
    family: str
    registered_name: str
    version: str | None
    promoted: bool
    reasons: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # the challenger's, on the test runs
    baseline: dict[str, float] = field(default_factory=dict)  # the static alarms', on the gate's runs
    champion: dict[str, float] = field(default_factory=dict)  # the champion's, on the gate's runs
    challenger_gate: dict[str, float] = field(default_factory=dict)  # the challenger's, on the gate's runs
    champion_version: str | None = None
    feedback: dict[str, float] = field(default_factory=dict)  # the challenger's, on the fleet's verdicts

    def line(self) -> str:
        verdict = "PROMOTED to champion" if self.promoted else "kept the champion"
        m = self.metrics
        return (f"{self.family:<19} v{self.version or '-':<4} {verdict}: " + "; ".join(self.reasons)
                + f"  [test: F1 {m.get('f1', float('nan')):.3f}, faults found {m.get('faults_found', 0):.0f}/"
                  f"{m.get('faults', 0):.0f}, false incidents {m.get('false_incidents', float('nan')):.0f}, "
                  f"median delay {m.get('delay_s_median', float('nan')):.0f}s]")


@dataclass
class Candidate:
    family: str
    detector: object
    rule: PostRule
    validation: dict[str, float]

    def loaded(self, version: str = "candidate", alias: str = "challenger") -> LoadedDetector:
        return LoadedDetector(f"candidate-{self.family}", version, alias, self.detector, self.rule, {})


def positives(frame: pd.DataFrame, family: str) -> np.ndarray:
    """What a family's detector should flag: its own fault; for anomalies, any fault."""
    labels = frame["label"]
    return BY_NAME[family].positives(labels)


def fit_rows(frame: pd.DataFrame, family: str, settings: PolicySettings) -> pd.DataFrame:
    """The rows a family's detector learns from: those where its score decides.

    A leak and a warm-up are the same curve until the warm-up is over, and the post-rule's
    warm-up guard decides rows of a job younger than its horizon by itself (unless the growth
    resumed after a plateau or the limit is in sight): those rows teach the detector nothing
    either way, whatever their label. Nor do a leak's first ``SHORT_WINDOW_CHECKPOINTS``
    checkpoints, before its growth can outlast the slope window.

    Checkpoint failures are also a *symptom* of leaks, backpressure and skew: rows of such a
    fault that show failures are not a lesson for the checkpoint-failure detector; the policy
    folds them into the cause's incident.
    """
    if frame.empty:
        return frame
    if not BY_NAME[family].learns_from_symptom_rows:
        return frame[~symptom_of_another_fault(frame, family)]
    if not BY_NAME[family].warmup_guarded:
        return frame
    horizon = frame["job_name"].map(lambda name: settings.for_job(name).warmup_horizon_s).to_numpy(dtype="float64")
    # The rows where growth is plausible (95 %): flat states that wobble into a chance reading are
    # what the detector must learn to score low, though the rule opens only on growth at 99.9 %.
    decided_by_score = PostRule(**POST_RULE_GUARDS[family]).past_warmup(frame, horizon, to_open=False)
    interval = frame["checkpoint_interval_ms"].astype("float64").fillna(0.0)
    since_onset = frame["ts"].astype("float64") - frame["onset_ts"].astype("float64")
    in_grace = ((frame["label"] == family) & (since_onset < SHORT_WINDOW_CHECKPOINTS * interval).fillna(False)).to_numpy()
    return frame[decided_by_score & ~in_grace]


def symptom_of_another_fault(frame: pd.DataFrame, family: str = CHECKPOINT_FAILURE) -> np.ndarray:
    """Rows of a fault that causes checkpoint failures (a leak, backpressure, skew) showing them."""
    failing = (frame["checkpoint_failed_fraction"].astype("float64").fillna(0.0) > 0) | (
        frame["checkpoint_failures_counted"].astype("float64").fillna(0.0) > 0)
    other = frame["label"].isin(EXPLAINED_BY[family])
    return (failing & other).to_numpy()


def load_splits(spark: SparkSession, config: SentinelConfig, dataset_dirs: Sequence[Path],
                progress: Progress) -> dict[str, Runs]:
    """Labelled feature rows and ground truth per split, over every dataset (features computed
    into the offline store by a backfill, read back as a point-in-time training set)."""
    rows: dict[str, list[pd.DataFrame]] = {}
    truths: dict[str, list[dict]] = {}
    for dataset in dataset_dirs:
        store = config.offline_store / "datasets" / Path(dataset).name
        events, _ = offline_store.dataset_files(dataset)
        if offline_store.backfilled_from(store, events, config.features.idle_timeout_ms):
            progress(f"features of {dataset} are in {store} already")
        else:
            progress(f"computing features of {dataset} into {store}")
            offline_store.backfill(spark, events, store, config.features.idle_timeout_ms)
        for split in SPLITS:
            truth_path = Path(dataset) / split / "ground_truth.jsonl"
            if truth_path.is_file():
                rows.setdefault(split, []).append(offline_store.training_set(spark, store, [truth_path]).toPandas()
                                                  .assign(source=Path(dataset).name))
                truths.setdefault(split, []).extend(offline_store.read_truth_lines(truth_path))
    missing = set(SPLITS) - set(rows)
    if missing:
        raise TrainingSetInvalid(f"the datasets have no {', '.join(sorted(missing))} split")
    return {split: Runs(pd.concat(parts, ignore_index=True), truths[split]) for split, parts in rows.items()}


def source_weights(rows: pd.DataFrame) -> np.ndarray | None:
    """Row weights that give every dataset the same say: the simulator makes rows by the hundred
    thousand, the real-Flink corpus by the thousand, and real Flink is what the detectors must get
    right (without this, a tree learns the simulator's quirks and ignores the lab).

    Rows of the fleet's feedback are not a dataset of their own (a handful of verdicts would get
    a dataset's whole say): each weighs as much as a row of the dataset whose rows weigh most."""
    if "source" not in rows.columns:
        return None
    feedback = (rows["source"] == fleet_feedback.SOURCE).to_numpy()
    datasets = rows["source"][~feedback]
    if datasets.nunique() < 2 and not feedback.any():
        return None
    weights = np.ones(len(rows))
    if datasets.nunique() >= 2:
        counts = datasets.map(datasets.value_counts()).to_numpy(dtype="float64")
        weights[~feedback] = len(datasets) / (datasets.nunique() * counts)
    weights[feedback] = weights[~feedback].max() if (~feedback).any() else 1.0
    return weights


def _fit(family: str, params: dict, seed: int, train: pd.DataFrame):
    detector = make_detector(DetectorConfig(family, seed=seed, **params))
    # The novelty detector learns the healthy rows; a supervised one its family's against the rest.
    target = positives(train, family) if BY_NAME[family].supervised else (train["label"] == "healthy").to_numpy()
    return detector.fit(train, target, sample_weight=source_weights(train))


def train_family(family: str, splits: dict[str, Runs], settings: PolicySettings, seed: int, grid: dict,
                 progress: Progress, feedback: fleet_feedback.FleetFeedback | None = None,
                 others: Mapping[str, LoadedDetector] | None = None) -> Candidate:
    """Fit the grid on the train runs (and the fleet's verdicts on the family), keep the best by
    validation average precision, and calibrate its post-rule on the validation runs at incident
    level (the anomaly rule beside ``others``, the supervised models it will run with)."""
    level = FAMILY_LEVEL[family]
    train = rows_for(splits["train"].rows, level)
    if feedback is not None and len(feedback.of(family)):
        verdict_rows = feedback.training_rows(family)
        n = len(feedback.of(family))
        progress(f"  {family}: on-call's verdicts on {n} incident{'s' if n != 1 else ''}: {len(verdict_rows)} rows")
        if len(verdict_rows):
            # A feature the verdicts' rows never have (all NaN) takes the training rows' dtype, as
            # pandas chose until now: it deprecated leaving all-NA columns out of the choice.
            unknown = [c for c in verdict_rows.columns if c in train.columns and verdict_rows[c].isna().all()]
            train = pd.concat([train, verdict_rows.drop(columns=unknown)], ignore_index=True)
    train = fit_rows(train, family, settings)
    validation_rows = rows_for(splits["validation"].rows, level)
    judged = validation_rows if BY_NAME[family].learns_from_symptom_rows else fit_rows(validation_rows, family, settings)
    best = None
    for values in product(*grid.values()):
        params = dict(zip(grid.keys(), values))
        detector = _fit(family, params, seed, train)
        y = positives(judged, family)
        ap = average_precision_score(y, detector.score(judged)) if y.any() and not y.all() else 0.0
        progress(f"  {family}: {params} -> validation average precision {ap:.3f}")
        if best is None or ap > best[0]:
            best = (ap, detector)
    detector = best[1]
    rule, quality = calibrate_for_incidents(family, detector, splits["validation"], settings, others)
    progress(f"  {family}: {rule} -> validation {quality}")
    return Candidate(family, detector, rule, quality)


def calibrate_for_incidents(family: str, detector, validation: Runs, settings: PolicySettings,
                            others: Mapping[str, LoadedDetector] | None = None) -> tuple[PostRule, dict]:
    """The post-rule whose incidents on the validation runs serve on-call best.

    Each candidate is replayed through the policy and judged run by run, its family alone:
    false incidents on runs with one of its causes are left to the full policy (which folds them
    into the cause). A supervised family should find the most faults net of false incidents,
    then raise the fewest, then find them soonest. The anomaly rule, whose incidents can only be
    false, should open none where nothing explains it, then decide the most faulty rows; with
    ``others`` (the supervised families' models it will run beside) it is judged as the job and
    the gate judge it, see :func:`_anomaly_beside`.
    """
    level = FAMILY_LEVEL[family]
    rows = numbered(validation.rows)
    judged_rows = rows_for(rows, level)
    base = LoadedDetector(f"candidate-{family}", "candidate", "challenger", detector, None, {})
    scores = _scores(rows, {family: base})
    truth_settings = settings.with_overrides(truth_overrides(validation.truths))
    guards = POST_RULE_GUARDS.get(family, {})
    horizon = judged_rows["job_name"].map(lambda n: truth_settings.for_job(n).warmup_horizon_s).to_numpy(dtype="float64")
    family_scores = scores[scores["family"] == family].set_index("row")["score"].reindex(judged_rows.index)
    thresholds = CALIBRATION_THRESHOLDS
    if not BY_NAME[family].supervised:
        # Novelty scores crowd a narrow band: try the top quantiles of the healthy rows' scores too.
        healthy = family_scores[(judged_rows["label"] == "healthy").to_numpy()].dropna()
        if len(healthy):
            thresholds = tuple(sorted(set(thresholds) | {round(float(q), 4) for q in
                                                         np.quantile(healthy, ANOMALY_QUANTILES)}))
    judged = []  # (key, rule, quality, comparison)
    for threshold, (k, n) in product(thresholds, BY_NAME[family].calibration_persistence):
        rule = PostRule(threshold, k, n, **guards)
        comparison = judge(validation, {family: _with_rule(base, rule)}, settings, scores)
        m = comparison.metrics(family)
        false = m["false_incidents"] - excused_false(comparison, family)
        if not BY_NAME[family].supervised:
            decided = rule.decisions(judged_rows.assign(score=family_scores.to_numpy()), horizon_s=horizon)
            recall = row_metrics(judged_rows.assign(label=np.where(positives(judged_rows, family), family, "healthy")),
                                 decided.to_numpy(), family)["recall"]
            key = (-false, recall)
            quality = {"false_incidents": false, "faulty_row_recall": round(recall, 3)}
        else:
            delays = [f["delay_s"] for r in comparison.runs for f in r.found if f["family"] == family]
            delay = float(getattr(np, BY_NAME[family].delay_statistic)(delays)) if delays else math.nan
            key = (m["faults_found"] - false, -false)
            quality = {"faults_found": m["faults_found"], "faults": m["faults"], "false_incidents": false,
                       "delay_s_mean": round(float(np.mean(delays)), 1) if delays else math.nan,
                       "delay_s_median": m["delay_s_median"], "delay_s": delay}
        # Ties go to the more conservative rule: higher threshold, then more persistence.
        judged.append(((key, threshold, n - k + 1), rule, quality, comparison))
    if not BY_NAME[family].supervised and others:
        return _anomaly_beside(judged, base, validation, settings, {f: m for f, m in others.items() if f != family},
                               family)
    best = soonest_among_best(judged)
    return best[1], best[2]


def soonest_among_best(judged: list) -> tuple:
    """Of ``judged`` (``((key, threshold, persistence), rule, quality, ...)``; ``quality["delay_s"]``
    is a supervised family's delay statistic, NaN or absent where there is none): the rules with
    the best key, of them the soonest and those tied with it, and of those the most conservative."""
    top = max(j[0][0] for j in judged)
    best = [j for j in judged if j[0][0] == top]
    delays = [j[2].get("delay_s", math.nan) for j in best]
    known = [d for d in delays if not math.isnan(d)]
    if known:
        within = min(known) + max(DELAY_TIE_S, DELAY_TIE_SHARE * min(known))
        best = [j for j, d in zip(best, delays) if d <= within]
    return max(best, key=lambda j: j[0])


def _with_rule(model: LoadedDetector, rule: PostRule) -> LoadedDetector:
    return LoadedDetector(model.name, model.version, model.alias, model.detector, rule, {})


def _anomaly_beside(judged: list, base: LoadedDetector, validation: Runs, settings: PolicySettings,
                    others: Mapping[str, LoadedDetector], family: str = ANOMALY) -> tuple[PostRule, dict]:
    """The anomaly rule judged beside the supervised models, as the job and the gate judge it.

    Judged alone, an anomaly on a run with a fault is excused as if the policy always folded it
    into its cause's incident; it does not when the anomaly opens first (or the cause is
    missed), and on-call gets a false family. So each candidate's excused runs (faulty runs
    where it opened an anomaly alone) are replayed with ``others`` and what the policy still
    opens there counts. Elsewhere nothing changes: a run where the rule opens no anomaly alone
    gets none beside the others either. The count alone is a lower bound of the count beside
    them, so candidates are tried best bound first and the search stops when no bound beats the
    best found (a handful of replays, not one per candidate).
    """
    causes = set(EXPLAINED_BY[family])
    best = None
    for (key, threshold, persistence), rule, quality, comparison in sorted(judged, key=lambda j: j[0], reverse=True):
        if best is not None and best[0] >= (key, threshold, persistence):
            break
        excused = {run.job_id for run in comparison.runs if causes & set(run.expected)
                   and any(i["family"] == family for i in run.false)}
        false = quality["false_incidents"]
        if excused:
            beside = judge(validation.of_jobs(excused), {**others, family: _with_rule(base, rule)}, settings)
            false += beside.metrics(family)["false_incidents"]
        candidate = ((-false, key[1]), threshold, persistence)
        if best is None or candidate > best[0]:
            best = (candidate, rule, {**quality, "false_incidents": false})
    return best[1], best[2]


def _scores(rows: pd.DataFrame, models: dict[str, LoadedDetector]) -> pd.DataFrame:
    from pipelines.incidents.scoring import score_rows
    return score_rows(rows, models)


def family_metrics(comparison: Comparison, rows: pd.DataFrame, model: LoadedDetector, family: str,
                   settings: PolicySettings, truths: list[dict]) -> dict[str, float]:
    """A family's test metrics: incident level from ``comparison``, and its rows' precision,
    recall and F1 (the rule decides every row, as it would live)."""
    level_rows = rows_for(rows, FAMILY_LEVEL[family])
    truth_settings = settings.with_overrides(truth_overrides(truths))
    horizon = level_rows["job_name"].map(lambda n: truth_settings.for_job(n).warmup_horizon_s).to_numpy(dtype="float64")
    decided = model.post_rule.decisions(level_rows.assign(score=model.detector.score(level_rows)), horizon_s=horizon)
    labelled = level_rows.assign(label=np.where(positives(level_rows, family), family, "healthy"))
    return {**row_metrics(labelled, decided.to_numpy(), family), **comparison.metrics(family)}


def gate(family: str, challenger: dict[str, float], champion: dict[str, float] | None,
         baseline: dict[str, float] | None, runs: str = "validation runs") -> tuple[bool, list[str]]:
    """Promote only with no regression against the champion on the gate's runs (faults found,
    false incidents, false families of the family) and at least the static alarms' net result."""
    reasons, ok = [], True

    def net(m: dict[str, float]) -> float:
        return m["faults_found"] - m["false_incidents"] - m["false_families_on_faulty"]

    if baseline is not None:
        if net(challenger) >= net(baseline):
            reasons.append(f"on the {runs}: {net(challenger):.0f} faults found net of false incidents and families, "
                           f"static alarms {net(baseline):.0f}")
        else:
            ok = False
            reasons.append(f"on the {runs}: {net(challenger):.0f} faults found net of false incidents and families "
                           f"is below the static alarms' {net(baseline):.0f}")
    if champion is None:
        reasons.append("no champion yet")
        return ok, reasons
    checks = (("faults_found", "higher", "faults found"), ("false_incidents", "lower", "false incidents"),
              ("false_families_on_faulty", "lower", "false families on faulty runs"))
    for metric, better, label in checks:
        new, old = challenger[metric], champion[metric]
        if (new < old) if better == "higher" else (new > old):
            ok = False
            reasons.append(f"on the {runs}: {label} {new:.0f} is worse than the champion's {old:.0f}")
    if ok:
        reasons.append(f"on the {runs}: at least as good as the champion on faults found, false incidents and "
                       "false families")
    return ok, reasons


def _plots(family: str, test: pd.DataFrame, scores: np.ndarray, decided: np.ndarray, delays: list[float],
           directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay, PrecisionRecallDisplay

    y = positives(test, family)
    paths = []
    if y.any() and not y.all():
        fig, ax = plt.subplots(figsize=(5, 4))
        PrecisionRecallDisplay.from_predictions(y, scores, ax=ax, name=family)
        paths.append(directory / f"{family}_precision_recall.png")
        fig.savefig(paths[-1])
    fig, ax = plt.subplots(figsize=(4, 4))
    ConfusionMatrixDisplay.from_predictions(y, decided, ax=ax, display_labels=["ok", family], labels=[False, True])
    paths.append(directory / f"{family}_confusion_matrix.png")
    fig.savefig(paths[-1])
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.hist(delays, bins=20)
    ax.set_xlabel("detection delay after onset (s), test runs")
    ax.set_ylabel("faults")
    paths.append(directory / f"{family}_delay_histogram.png")
    fig.savefig(paths[-1])
    plt.close("all")
    return paths


def champions(config: SentinelConfig, families: Sequence[str]) -> dict[str, LoadedDetector]:
    held = {}
    for family in families:
        name = getattr(config.mlflow.models, family)
        if registry.alias_version(name, config.mlflow.alias) is not None:
            held[family] = registry.load_detector(name, config.mlflow.alias)
    return held


def run_training(spark: SparkSession, config: SentinelConfig, dataset_dirs: Sequence[Path],
                 families: Sequence[str] = FAMILIES, dry_run: bool = False, seed: int = 0,
                 grid: dict | None = None, progress: Progress = print,
                 feedback: fleet_feedback.FleetFeedback | None = None) -> list[FamilyOutcome]:
    """The whole workflow; returns one outcome per family (in the order of ``FAMILIES``).

    ``feedback``: on-call's verdicts on the fleet's incidents (``sentinel train --feedback``),
    learnt from as labels and reported by the gate."""
    grid = grid or DEFAULT_GRID
    registry.use_config(config)
    # Candidates are calibrated and gated on their own decisions: a predicted incident opens the same
    # for every candidate and would only blur them.
    settings = PolicySettings.from_config(config).without_predictions()
    splits = load_splits(spark, config, dataset_dirs, progress)
    families = [f for f in FAMILIES if f in families]
    features = sorted({f for fam in families for f in DetectorConfig(fam).features})
    # The anomaly rule alone is still calibrated on faults (of every family): it needs them too.
    labelled = [f for f in families if BY_NAME[f].supervised] or list(SUPERVISED)
    report = validate_training_set(splits["train"].rows, features, labelled, known_labels=SUPERVISED)
    progress(report.text())
    if not report.success:
        raise TrainingSetInvalid(report.text())
    if not dry_run:
        progress(f"MLflow experiment {config.mlflow.experiment!r} at {config.mlflow.tracking_uri}, artifacts in "
                 f"{registry.ensure_experiment(config)}")
    held = champions(config, FAMILIES)
    # The gate judges on real Flink: the lab's validation runs, else the simulated ones.
    gate_runs = splits["validation"].of("lab")
    gate_name = "real-Flink validation runs"
    if gate_runs.empty:
        gate_runs, gate_name = splits["validation"], "validation runs"
    candidates: dict[str, Candidate] = {}
    for family in families:  # causes first, the anomaly rule last
        progress(f"training {family} ({len(rows_for(splits['train'].rows, FAMILY_LEVEL[family]))} rows)")
        family_grid = ANOMALY_GRID if not BY_NAME[family].supervised and grid is DEFAULT_GRID else grid
        # The anomaly rule is calibrated beside the models it will run with: this training's
        # candidates, else the champions.
        others = {**held, **{f: c.loaded() for f, c in candidates.items()}} if not BY_NAME[family].supervised else None
        candidates[family] = train_family(family, splits, settings, seed, family_grid, progress, feedback, others)
    challengers = {family: c.loaded() for family, c in candidates.items()}
    # Every family's new model together, the others' champions where they were not retrained.
    everything = {**held, **challengers}
    test = judge(splits["test"], everything, settings)
    baseline_gate = judge(gate_runs, static_alarms(), settings)
    champion_gate = judge(gate_runs, held, settings) if held else None
    outcomes = []
    for family in families:
        name = getattr(config.mlflow.models, family)
        challenger = challengers[family]
        metrics = family_metrics(test, splits["test"].rows, challenger, family, settings, splits["test"].truths)
        challenger_gate = judge(gate_runs, {**held, family: challenger}, settings).metrics(family)
        baseline = baseline_gate.metrics(family) if BY_NAME[family].has_static_alarm else None
        champion = champion_gate.metrics(family) if family in held else None
        promote, reasons = gate(family, challenger_gate, champion, baseline, gate_name)
        fleet = {}
        if feedback is not None and feedback.of(family):
            fleet = feedback.outcome(family, {**held, family: challenger}, settings)
            fleet_champion = feedback.outcome(family, held, settings) if family in held else None
            reasons.append(fleet_feedback.outcome_line(fleet, fleet_champion))
            if fleet_champion is not None and fleet_feedback.regressed(fleet, fleet_champion):
                promote = False
                reasons.append("on the fleet's feedback: worse than the champion (on-call said otherwise)")
        outcome = FamilyOutcome(family, name, None, promote and not dry_run, reasons, metrics, baseline or {},
                                champion or {}, challenger_gate, held[family].version if family in held else None,
                                fleet)
        if dry_run:
            outcome.reasons.append("dry run: nothing registered, no alias moved" + (" (would promote)" if promote else ""))
        else:
            delays = [f["delay_s"] for r in test.runs for f in r.found if f["family"] == family]
            outcome.version = _log_and_register(outcome, candidates[family], splits, delays, seed, config)
        progress(outcome.line())
        outcomes.append(outcome)
    progress("test runs, every family together: " + "; ".join(
        f"{k} {v:.2f}" for k, v in test.metrics().items() if not math.isnan(v)))
    return outcomes


def _log_and_register(outcome: FamilyOutcome, candidate: Candidate, splits: dict[str, Runs], delays: list[float],
                      seed: int, config: SentinelConfig) -> str:
    family, detector, rule = outcome.family, candidate.detector, candidate.rule
    with mlflow.start_run(run_name=f"train-{family}"):
        mlflow.log_params({"family": family, "seed": seed, **{f"post_rule_{k}": v for k, v in rule.to_dict().items()},
                           **{k: v for k, v in detector.config.to_dict().items() if k not in ("features", "family")}})
        for prefix, values in (("test_", outcome.metrics), ("gate_", outcome.challenger_gate),
                               ("baseline_", outcome.baseline), ("champion_", outcome.champion),
                               ("validation_", candidate.validation), ("feedback_", outcome.feedback)):
            mlflow.log_metrics({f"{prefix}{k}": float(v) for k, v in values.items()
                                if isinstance(v, (int, float)) and not math.isnan(v)})
        test = rows_for(splits["test"].rows, FAMILY_LEVEL[family])
        scores = detector.score(test)
        with tempfile.TemporaryDirectory() as tmp:
            decided = rule.decisions(test.assign(score=scores)).to_numpy()
            for path in _plots(family, test, scores, decided, delays, Path(tmp)):
                mlflow.log_artifact(str(path), artifact_path="plots")
        version = registry.log_detector(detector, rule, rows_for(splits["train"].rows, FAMILY_LEVEL[family]),
                                        outcome.registered_name, {"gate": outcome.reasons})
        mlflow.set_tag("gate", "promoted" if outcome.promoted else "kept champion")
    registry.set_alias(outcome.registered_name, registry.CHALLENGER, version)
    if outcome.promoted:
        registry.set_alias(outcome.registered_name, config.mlflow.alias, version)
    return version


def default_datasets(config: SentinelConfig, seed: int, simulate: Callable[[Path], None]) -> list[Path]:
    """What ``sentinel train`` trains on without ``--dataset``: a simulated dataset under the state
    folder, made by ``simulate(folder)`` once per seed, and the real-Flink corpus
    (``lab.corpus_dir``) when it is there. (The simulator is a layer above this one: the caller
    hands it in.)"""
    generated = Path(config.state_dir) / "datasets" / f"simulated-seed{seed}"
    if not (generated / "manifest.json").is_file():
        simulate(generated)
    corpus = Path(config.lab.corpus_dir)
    return [generated, corpus] if (corpus / "manifest.json").is_file() else [generated]
