"""Point-in-time labels: the fault under way at each feature row's own time, defined once.

A fault labels a row when it began at or before the row's ``ts`` and, if it ends (``end_ts``: a
leak that is fixed), ended after it: the rows after a fix are healthy, as the resolved incident
says. Leaks, backpressure and skew are localised: on a vertex row they count only for their own
vertex (or when the fault names no vertex); on the job row, every fault of the job counts.
Checkpoint failures and anomalies are the job's, on every row. With several faults under way,
the earliest wins. A row is labelled from what was true at its own time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.families import LOCALISED as LOCALISED_FAMILIES
LABEL_COLUMNS = (("label", "string"), ("onset_ts", "long"), ("label_subtask", "long"))


def label_rows(rows: pd.DataFrame, truth: dict) -> pd.DataFrame:
    """``rows`` (one job's feature rows) with ``label``, ``onset_ts`` and ``label_subtask`` added."""
    label = np.full(len(rows), "healthy", dtype=object)
    onset = pd.array([pd.NA] * len(rows), dtype="Int64")
    subtask = pd.array([pd.NA] * len(rows), dtype="Int64")
    ts = rows["ts"].to_numpy()
    vertex = rows["vertex_id"]
    for fault in sorted(truth.get("faults") or [], key=lambda f: f["onset_ts"]):
        here = vertex.isna().to_numpy() | (fault["family"] not in LOCALISED_FAMILIES) | (fault.get("vertex_id") is None)
        if fault.get("vertex_id") is not None:
            here = here | (vertex == fault["vertex_id"]).to_numpy()
        applies = (ts >= fault["onset_ts"]) & here & (label == "healthy")
        if fault.get("end_ts") is not None:
            applies &= ts < fault["end_ts"]
        label[applies] = fault["family"]
        onset[applies] = fault["onset_ts"]
        if fault.get("subtask_index") is not None:
            subtask[applies] = fault["subtask_index"]
    return rows.assign(label=label, onset_ts=onset, label_subtask=subtask)
