"""A batch of scored feature rows in the order the incident policy walks them.

:func:`scored_rows` takes, for each score, the few row columns the decisions read, puts them in
walking order (job, event time, causes before symptoms, vertex) and numbers the jobs and the
(job, family, vertex) entities; :class:`RowRecords` makes the full feature row of a walked row a
dict only when the walk asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from models.post_rule import GROWTH_COLUMNS, PostRule
from pipelines.families import BY_NAME, EVALUATION_ORDER
from pipelines.families.registry import RECENT_COLUMNS
from pipelines.incidents import evidence as ev


ROW_KEYS = ("cluster", "job_id", "job_name", "job_state", "vertex_id", "ts")


@dataclass(frozen=True)
class BatchNames:
    """The state keys of the numbered jobs and (job, family, vertex) entities of a batch."""

    jobs: np.ndarray
    entities: np.ndarray


def scored_rows(rows: pd.DataFrame, scores: pd.DataFrame, rules: Mapping[str, PostRule]) -> tuple[pd.DataFrame, BatchNames]:
    """One row per score, in the order the policy walks them (job, event time, causes first,
    vertex), with the few row columns the decisions read; ``_row`` points back into ``rows``,
    ``_job`` and ``_entity`` number the jobs and (job, family, vertex) entities."""
    positions = rows.index.get_indexer(scores["row"])
    found = positions >= 0
    if not found.all():
        scores, positions = scores[found], positions[found]
    needed = (set(ROW_KEYS) | set(RECENT_COLUMNS.values()) | {"limit_eta_s"} | set(ev.LIMIT_COLUMNS)
              | set(GROWTH_COLUMNS))
    for rule in rules.values():
        needed.update(rule.guard_columns())
    for family in BY_NAME.values():
        needed.update(family.prediction_columns)
    # Built as arrays and put in walking order before they become one frame: taking and
    # re-indexing the frame instead copies it several times over (a backlog's whole batch).
    columns = {c: rows[c].to_numpy()[positions] for c in sorted(needed) if c in rows.columns}
    columns["_row"] = positions
    for name in ("family", "score", "model_name", "model_version", "model_alias"):
        columns[name] = scores[name].to_numpy()
    columns["_vertex"] = pd.Series(columns["vertex_id"]).fillna("").to_numpy()
    cluster, clusters = pd.factorize(columns["cluster"], sort=True)
    job_id, job_ids = pd.factorize(columns["job_id"], sort=True)
    vertex, vertices = pd.factorize(columns["_vertex"], sort=True)
    families, named = pd.factorize(columns["family"])
    family = np.array([EVALUATION_ORDER.index(name) for name in named], dtype=np.int64)[families]
    order = np.lexsort((vertex, family, columns["ts"], job_id, cluster))
    scored = pd.DataFrame({name: values[order] for name, values in columns.items()})
    cluster, job_id, vertex, family = cluster[order], job_id[order], vertex[order], family[order]
    _, job_first, job = np.unique(cluster.astype(np.int64) * len(job_ids) + job_id, return_index=True,
                                  return_inverse=True)
    scored["_job"] = job
    jobs = np.array([f"{clusters[cluster[i]]}/{job_ids[job_id[i]]}" for i in job_first] or [""], dtype=object)
    entity_code = (job.astype(np.int64) * len(EVALUATION_ORDER) + family) * len(vertices) + vertex
    _, first, entity = np.unique(entity_code, return_index=True, return_inverse=True)
    scored["_entity"] = entity
    entities = np.array([f"{EVALUATION_ORDER[family[i]]}/{vertices[vertex[i]]}" for i in first] or [""], dtype=object)
    return scored, BatchNames(jobs, entities)


class RowRecords:
    """The feature rows a walk may need as dicts (NaN as None), made only for the rows it asks
    for: most rows of changing entities change nothing, and making every row a dict first was
    most of the walk's time when training replays whole runs as one batch."""

    def __init__(self, rows: pd.DataFrame, positions: list[int]):
        self._rows, self._positions = rows, sorted(set(positions))
        self._names: list[str] = []
        self._values: list[list] | None = None
        self._index: dict[int, int] = {}

    def __call__(self, position: int) -> dict:
        if self._values is None:
            # Python values, column by column, as ``DataFrame.to_dict("records")`` gives them.
            taken = self._rows.iloc[self._positions]
            self._names = list(taken.columns)  # a list: iterating a pandas Index on every call costs
            self._values = [taken[name].tolist() for name in self._names]
            self._index = {p: k for k, p in enumerate(self._positions)}
        k = self._index[position]
        # NaN is the only value unequal to itself: the cheap test, on every column.
        return {name: (v if (v := values[k]) == v else None) for name, values in zip(self._names, self._values)}
