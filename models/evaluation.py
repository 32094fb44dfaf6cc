"""How good decisions are: per row, and as on-call people feel them, per run.

* Row level: precision, recall and F1 of a family's decisions against the point-in-time labels
  (for the MLflow log and the static baseline's row-level comparison).
* Incident level: the rows of labelled runs are scored, decided and turned into incidents by the
  **same** post-rules and incident policy the live job runs (:func:`replay_incidents` calls
  :func:`pipelines.incidents.policy.step`), and the incidents are judged against the runs'
  ground truth by :func:`pipelines.incidents.comparison.compare`: faults found (as an incident or a
  symptom), on the right vertex, delays, false incidents, false families. There is no second
  implementation of either.
"""

from __future__ import annotations

from dataclasses import dataclass
from glob import escape
from typing import Collection, Mapping, Sequence

import numpy as np
import pandas as pd

from models.baseline import StaticAlarm
from models.detectors import rows_for
from models.registry import LoadedDetector
from pipelines.families import EXPLAINED_BY, FAMILIES
from pipelines.incidents import policy
from pipelines.incidents.comparison import Comparison, compare
from pipelines.incidents.scoring import score_rows

DAY_MS = 86_400_000


def row_metrics(frame: pd.DataFrame, decided: Sequence[bool], family: str) -> dict[str, float]:
    """Precision, recall and F1 of ``decided`` (one per row of ``frame``) against ``label == family``."""
    decided = np.asarray(decided, dtype=bool)
    positive = (frame["label"] == family).to_numpy()
    tp, fp, fn = int((decided & positive).sum()), int((decided & ~positive).sum()), int((~decided & positive).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return {"precision": precision, "recall": recall,
            "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0}


def job_days(frame: pd.DataFrame) -> float:
    spans = frame.groupby(["cluster", "job_id"])["ts"].agg(lambda ts: ts.max() - ts.min())
    return float(spans.sum()) / DAY_MS


def truth_overrides(truths: Sequence[dict]) -> list[policy.JobOverride]:
    """The operator knowledge a dataset declares per job (the simulator's long warm-ups)."""
    return [policy.JobOverride(escape(t["job_name"]), warmup_horizon_s=t["warmup_horizon_s"])
            for t in truths if t.get("warmup_horizon_s")]


@dataclass(frozen=True)
class Runs:
    """Labelled runs: their feature rows (one frame, every job) and their ground-truth lines."""

    rows: pd.DataFrame
    truths: list[dict]

    def of(self, source: str | None) -> "Runs":
        """Only the runs recorded by ``source`` (``lab``, ``simulator``); None: all."""
        if source is None:
            return self
        truths = [t for t in self.truths if t.get("source", "simulator") == source]
        jobs = {(t["cluster"], t["job_id"]) for t in truths}
        keep = [(c, j) in jobs for c, j in zip(self.rows["cluster"], self.rows["job_id"])]
        return Runs(self.rows[np.asarray(keep, dtype=bool)], truths)

    def of_jobs(self, job_ids: Collection[str]) -> "Runs":
        """Only the runs of these jobs."""
        truths = [t for t in self.truths if t["job_id"] in job_ids]
        return Runs(self.rows[self.rows["job_id"].isin(list(job_ids)).to_numpy()], truths)

    @property
    def empty(self) -> bool:
        return not self.truths


def numbered(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with the index 0..n-1 that score rows point into: as they are when they have it
    (resetting copies every column, and calibration replays the same validation rows dozens of
    times; see BENCHMARKS.md, "Calibration's replay (`evaluation.replay_incidents`)")."""
    index = rows.index
    if isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1:
        return rows
    return rows.reset_index(drop=True)


def replay_incidents(rows: pd.DataFrame, models: Mapping[str, LoadedDetector], settings: policy.PolicySettings,
                     scores: pd.DataFrame | None = None) -> list[dict]:
    """The incidents the live job would publish for ``rows`` with ``models`` (and their post-rules)."""
    rows = numbered(rows)
    scores = score_rows(rows, models) if scores is None else scores
    rules = {family: model.post_rule for family, model in models.items()}
    return policy.step({}, rows, scores, rules, settings)


def judge(runs: Runs, models: Mapping[str, LoadedDetector], settings: policy.PolicySettings,
          scores: pd.DataFrame | None = None) -> Comparison:
    """Replay ``runs`` through ``models`` and the policy; judge the incidents run by run."""
    if runs.empty:
        return Comparison([])
    return compare(runs.truths, replay_incidents(runs.rows, models, settings.with_overrides(
        truth_overrides(runs.truths)), scores))


def excused_false(comparison: Comparison, family: str) -> int:
    """False incidents of ``family`` on runs that have one of its causes: judged alone, a family
    cannot fold a symptom into its cause, so those are left to the full policy to judge."""
    causes = set(EXPLAINED_BY.get(family, ()))
    return sum(1 for run in comparison.runs if causes & set(run.expected)
               for incident in run.false if incident["family"] == family)


def static_alarms(families: Sequence[str] = FAMILIES) -> dict[str, LoadedDetector]:
    """The static-threshold alarms, as models the policy can run (no anomaly alarm exists)."""
    from models.post_rule import PostRule
    return {family: LoadedDetector(f"static-{family}", "baseline", "static", StaticAlarm(family),
                                   PostRule(0.5, 1, 1), {}) for family in families if family in StaticAlarm.FAMILIES}


def family_scores(rows: pd.DataFrame, model: LoadedDetector, family: str) -> pd.DataFrame:
    """The score rows of one family's model over ``rows`` (as :func:`score_rows` makes them)."""
    return score_rows(numbered(rows), {family: model})


def level_rows(rows: pd.DataFrame, level: str) -> pd.DataFrame:
    return rows_for(rows, level)
