"""The fleet's feedback as labels, and how a model does on it.

On-call's verdicts (``sentinel feedback``) are labels no dataset has: they are about the jobs the
product watches. A verdict covers the incident's rows in the live feature log, from a few minutes
before it opened (what led to it) to its resolution or latest update, on its own vertex for a
localised family:

* a **false positive**'s rows become negatives for *that family only* (``label = healthy`` in
  its training set; the other families learn nothing from a verdict on another family);
* a **confirmed** incident's rows from its opening on become positives for its family.

The gate replays each verdict's rows through the models and the same policy the job runs and
counts the false positives a model would still open an incident for, and the confirmed ones it
would still catch (:meth:`FleetFeedback.outcome`); a challenger doing worse than the champion on
either is not promoted (:func:`regressed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pandas as pd

from models.detectors import FAMILY_LEVEL, rows_for
from models.evaluation import replay_incidents
from models.registry import LoadedDetector
from pipelines.families import LOCALISED
from pipelines.incidents import policy

FALSE_POSITIVE = "false_positive"
CONFIRMED = "confirmed"
VERDICTS = (FALSE_POSITIVE, CONFIRMED)
# How long before an incident opened its verdict still speaks for the rows (the lead-up the
# detector's persistence window and slopes read).
LOOKBACK_MS = 5 * 60_000
SOURCE = "fleet-feedback"  # the ``source`` of feedback rows in a training set


def window(verdict: Mapping) -> tuple[int, int]:
    """The event time a verdict covers, both ends included."""
    return int(verdict["opened_at"]) - LOOKBACK_MS, int(verdict["last_seen_at"])


@dataclass
class FleetFeedback:
    """The latest verdict per incident, and the live feature rows of their jobs."""

    verdicts: list[dict]
    rows: pd.DataFrame  # live feature rows (the feature log's columns) of the verdicts' jobs

    def __len__(self) -> int:
        return len(self.verdicts)

    def of(self, family: str) -> list[dict]:
        return [v for v in self.verdicts if v["family"] == family]

    def job_rows(self, verdict: Mapping) -> pd.DataFrame:
        """Every feature row of the verdict's job in its window (job and vertex rows)."""
        start, end = window(verdict)
        rows = self.rows
        if rows.empty:
            return rows
        keep = ((rows["cluster"] == verdict["cluster"]) & (rows["job_id"] == verdict["job_id"])
                & (rows["ts"] >= start) & (rows["ts"] <= end))
        return rows[keep].sort_values("ts", kind="stable")

    def entity_rows(self, verdict: Mapping) -> pd.DataFrame:
        """The rows the verdict's family judges: its level, and its vertex for a localised family."""
        family = verdict["family"]
        rows = rows_for(self.job_rows(verdict), FAMILY_LEVEL[family])
        if family in LOCALISED and verdict.get("vertex_id"):
            rows = rows[rows["vertex_id"] == verdict["vertex_id"]]
        return rows

    def training_rows(self, family: str) -> pd.DataFrame:
        """Labelled rows for ``family``'s training set (the columns ``training_set`` adds)."""
        parts = []
        for verdict in self.of(family):
            rows = self.entity_rows(verdict)
            if verdict["verdict"] == CONFIRMED:
                rows = rows[rows["ts"] >= verdict["opened_at"]]
                label, onset = family, verdict["opened_at"]
            else:
                label, onset = "healthy", pd.NA
            if len(rows):
                parts.append(rows.assign(label=label, onset_ts=pd.array([onset] * len(rows), dtype="Int64"),
                                         label_subtask=pd.array([pd.NA] * len(rows), dtype="Int64"), source=SOURCE))
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    def outcome(self, family: str, models: Mapping[str, LoadedDetector], settings: policy.PolicySettings) -> dict:
        """How ``models`` (every family's, as the job runs them) do on ``family``'s verdicts:
        the false positives they would still open an incident of the family for, on the same
        vertex, and the confirmed incidents they would still catch."""
        counts = {"false_positives": 0, "false_positives_refired": 0, "confirmed": 0, "confirmed_caught": 0}
        for verdict in self.of(family):
            rows = self.job_rows(verdict).reset_index(drop=True)
            fired = False
            if len(rows):
                incidents = replay_incidents(rows, models, settings)
                fired = any(i["event"] == "opened" and i["family"] == family
                            and (family not in LOCALISED or not verdict.get("vertex_id")
                                 or i.get("vertex_id") == verdict["vertex_id"]) for i in incidents)
            if verdict["verdict"] == FALSE_POSITIVE:
                counts["false_positives"] += 1
                counts["false_positives_refired"] += int(fired)
            else:
                counts["confirmed"] += 1
                counts["confirmed_caught"] += int(fired)
        return counts


def outcome_line(challenger: Mapping[str, int], champion: Mapping[str, int] | None) -> str:
    """One reason line for the gate's report."""
    def part(m: Mapping[str, int]) -> str:
        return (f"opens again {m['false_positives_refired']} of {m['false_positives']} false positives, "
                f"catches {m['confirmed_caught']} of {m['confirmed']} confirmed")
    return ("on the fleet's feedback: the challenger " + part(challenger)
            + (f" (the champion: {part(champion)})" if champion is not None else ""))


def regressed(challenger: Mapping[str, int], champion: Mapping[str, int]) -> bool:
    """More false positives opened again, or fewer confirmed incidents caught, than the champion."""
    return (challenger["false_positives_refired"] > champion["false_positives_refired"]
            or challenger["confirmed_caught"] < champion["confirmed_caught"])


def latest_verdicts(records: list[dict]) -> list[dict]:
    """The latest verdict per incident (records in the order they were given)."""
    latest: dict[str, dict] = {}
    for record in sorted(records, key=lambda r: r["given_at"]):
        latest[record["incident_id"]] = record
    return list(latest.values())
