"""Incident events made by the real policy from hand-made feature rows and scores."""

from __future__ import annotations

import pandas as pd

from models.post_rule import PostRule
from pipelines.contracts import INCIDENT
from pipelines.incidents import policy

MINUTE = 60_000


def rows_and_scores(points, family="state_leak", vertex="v1", job="j1", **features):
    """Feature rows (one per (minute, score)) and their scores for one entity; a feature given as a
    list takes one value per point."""
    rows, scores = [], []
    for i, (minute, score) in enumerate(points):
        extra = {k: (v[i] if isinstance(v, list) else v) for k, v in features.items()}
        rows.append({"cluster": "c", "job_id": job, "job_name": "orders", "vertex_id": vertex,
                     "vertex_name": "Window" if vertex else None, "ts": minute * MINUTE, "trigger_kind": "checkpoint",
                     "is_late": False, "job_state": "RUNNING", "last_failure_message": None, **extra})
        scores.append({"row": i, "family": family, "score": score, "model_name": f"sentinel-{family}",
                       "model_version": "3", "model_alias": "champion"})
    return pd.DataFrame(rows), pd.DataFrame(scores)


def together(*parts):
    """Rows and scores of several entities as one batch."""
    rows, scores, offset = [], [], 0
    for part_rows, part_scores in parts:
        rows.append(part_rows)
        scores.append(part_scores.assign(row=part_scores["row"] + offset))
        offset += len(part_rows)
    return pd.concat(rows, ignore_index=True), pd.concat(scores, ignore_index=True)


def skew_incident(job: str = "j1") -> tuple[dict, dict, dict]:
    """An opened, an escalated and a resolved event of one skew incident, from the real policy."""
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9), (20, 0.1), (21, 0.1), (35, 0.1)], family="skew", job=job,
                                   hot_subtask=2.0, records_in_max_over_mean=4.0)
    opened, resolved = policy.step({}, rows, scores, {"skew": PostRule(0.5, 2, 3)}, policy.PolicySettings())
    escalated = {**opened, "event": "updated", "severity": "critical", "updated_at": opened["updated_at"] + 60_000,
                 "summary": opened["summary"].replace("[warning]", "[critical]"),
                 "labels": {**opened["labels"], "severity": "critical", "event": "updated"}}
    for event in (opened, escalated, resolved):
        assert INCIDENT.errors(event) == []
    return opened, escalated, resolved
