"""How good a family's decisions are, as on-call people feel it.

Row level: precision, recall and F1 of the decisions against the point-in-time labels.
Incident level, per entity (the job for job-level families, the vertex otherwise):
*false incidents per job-day* (an incident opening, i.e. a decision switching on, while the
entity is not in that fault) and *detection delay* after the labelled onset, in seconds and in
checkpoints, for every fault that was caught; faults never caught count against
``fault_recall``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

DAY_MS = 86_400_000
ENTITY = ("cluster", "job_id", "vertex_id")


def evaluate(frame: pd.DataFrame, decided: Sequence[bool], family: str) -> dict[str, float]:
    """Metrics of ``decided`` (one per row of ``frame``) for ``family``.

    ``frame`` needs ``cluster, job_id, vertex_id, ts, trigger_kind, label, onset_ts``.
    """
    rows = frame.assign(_decided=np.asarray(decided, dtype=bool), _positive=(frame["label"] == family).to_numpy())
    tp = int((rows._decided & rows._positive).sum())
    fp = int((rows._decided & ~rows._positive).sum())
    fn = int((~rows._decided & rows._positive).sum())
    metrics = {
        "precision": tp / (tp + fp) if tp + fp else 0.0,
        "recall": tp / (tp + fn) if tp + fn else 0.0,
    }
    p, r = metrics["precision"], metrics["recall"]
    metrics["f1"] = 2 * p * r / (p + r) if p + r else 0.0

    false_incidents, delays_s, delays_checkpoints, faults = _incidents(rows)
    job_days = _job_days(rows)
    metrics["false_incidents_per_job_day"] = false_incidents / job_days if job_days else 0.0
    metrics["faults"] = float(faults)
    metrics["fault_recall"] = len(delays_s) / faults if faults else 0.0
    for name, values in (("delay_s", delays_s), ("delay_checkpoints", delays_checkpoints)):
        metrics[f"{name}_median"] = float(np.median(values)) if values else float("nan")
        metrics[f"{name}_p90"] = float(np.percentile(values, 90)) if values else float("nan")
    return metrics


def detection_delays(frame: pd.DataFrame, decided: Sequence[bool], family: str) -> list[float]:
    """Seconds from each caught fault's onset to its first decision (for the delay histogram)."""
    rows = frame.assign(_decided=np.asarray(decided, dtype=bool), _positive=(frame["label"] == family).to_numpy())
    return _incidents(rows)[1]


def _incidents(rows: pd.DataFrame) -> tuple[int, list[float], list[int], int]:
    """False incident openings, per-fault delays (s, checkpoints) and the number of faults.

    Vectorised: the calibration calls this for every candidate post-rule.
    """
    group = rows.groupby([rows[c].fillna("") for c in ENTITY], sort=False).ngroup().to_numpy()
    ts = rows["ts"].to_numpy(dtype="int64")
    order = np.lexsort((ts, group))
    g, t = group[order], ts[order]
    decided, positive = rows["_decided"].to_numpy()[order], rows["_positive"].to_numpy()[order]
    first_of_entity = np.r_[True, g[1:] != g[:-1]] if len(g) else np.zeros(0, dtype=bool)
    previous = np.r_[False, decided[:-1]] if len(g) else np.zeros(0, dtype=bool)
    opened = decided & ~(previous & ~first_of_entity)
    false_incidents = int((opened & ~positive).sum())

    ordered = pd.DataFrame({"g": g, "t": t, "row_onset": rows["onset_ts"].to_numpy()[order],
                            "checkpoint": (rows["trigger_kind"] == "checkpoint").to_numpy()[order]})
    onsets = ordered[positive].groupby("g")["row_onset"].first().astype("int64")
    caught_at = ordered[positive & decided].groupby("g")["t"].first()
    caught = pd.DataFrame({"onset": onsets}).join(caught_at.rename("at"), how="inner")
    window = ordered.merge(caught, left_on="g", right_index=True)
    window = window[(window["t"] >= window["onset"]) & (window["t"] <= window["at"]) & window["checkpoint"]]
    checkpoints = window.groupby("g").size().reindex(caught.index, fill_value=0)
    delays_s = ((caught["at"] - caught["onset"]) / 1000.0).tolist()
    return false_incidents, delays_s, [int(c) for c in checkpoints], len(onsets)


def _job_days(rows: pd.DataFrame) -> float:
    spans = rows.groupby(["cluster", "job_id"])["ts"].agg(lambda ts: ts.max() - ts.min())
    return float(spans.sum()) / DAY_MS
