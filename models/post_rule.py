"""The post-rule: turns a detector's scores into decisions, separately from the detector.

A decision needs the score over a calibrated threshold in at least ``k`` of the entity's last
``n`` evaluations (persistence: one noisy point is not an incident). The rule is trained on
validation scores and saved with the model it belongs to.

A rule may carry the leak family's **warm-up guard**. Healthy state grows too after a job starts
(windows filling, TTLs not expiring yet), and no metric tells such growth from a leak until the
warm-up is over. How long a job may warm up is the operator's knowledge, not the model's: the
*warm-up horizon* comes from the config (``detection.warmup_horizon_s``, per job in
``detection.job_overrides``) with every decision, and overrides anything the rule was trained
with. While a job is younger than its horizon (since it started or restarted), growth is presumed
to be warm-up unless

* it resumed after a plateau: the state held flat once, and is now ``resume_over_plateau``
  times above the plateau's level (judged at once, whatever the horizon); or
* the job's state limit is forecast to be reached before the horizon is over (a warm-up that
  runs into its limit fails its checkpoints all the same).

Past the horizon, the leak is judged on the growth after it, as the leak family defines it
(:func:`pipelines.families.state_leak.still_growing`: at least ``min_growth_per_h`` of itself
per hour over a window of time with 95 % confidence, to open also with 99.9 % confidence over at
least twenty checkpoints, and still rising since its last change of pace), for
``confirm_after_horizon_s`` past the horizon (a warm-up whose plateau comes just after the horizon
the operator declared is not a leak yet), and unless the state decelerates toward a plateau
below its limit (:func:`~pipelines.families.state_leak.fills_below_limit`: a bounded key space
filling). So a warm-up that reached its plateau is over however steep the climb before it was,
and a slow leak that follows a fast warm-up is one however much the growth slowed. Growth
resumed after a plateau and a limit in reach are judged as above. And a trend fitted to fewer
than ``min_checkpoints`` checkpoints (a job the sentinel has only just started to watch) decides
nothing.

Past the horizon and its confirmation, growth certain enough to open a leak (over a history long
enough to tell a fill, and no fill below the limit) that has held at every checkpoint for
``growth_confirms_after_s`` stands in for the score's persistence and half its threshold: one
score of at least half the threshold among the last ``n`` decides
(:meth:`PostRule.sustained_growth`). A model whose score wavers over a leak that grows this
plainly must not lose it for want of ``k`` readings over the threshold; a model that scores the
growth low throughout still keeps it quiet.

A rule may hold back for a **start-up** time after the job (re)started (``startup_s``): Flink's
rates are meters over the last minute, so for a minute after a start they ramp up unevenly across
subtasks, and the first checkpoints of a job say little about its usual behaviour.

A rule may also require **evidence**: at least one of some feature columns at or above a minimum
(the checkpoint-failure rule wants a failed checkpoint, a checkpoint near its timeout, a pile-up,
a restart or a full JobManager heap; the backpressure rule wants another vertex waiting on this
one). A decision nobody could explain from the incident is not made.

A rule may also require an **impact**: at least one of other feature columns at or above a
minimum, what the fault already does to the job (the backpressure rule's: checkpoints taking a
quarter of their interval, or a vertex waiting on this one more than half the time, Flink's HIGH;
backpressure that neither holds barriers back nor is high is a job running near its capacity).

A rule may name **counter-evidence** (``refused_by``): feature columns at or above a maximum
that refuse the decision (the skew rule's: a vertex itself backpressured half the time, whose
input rates its downstream sets, not its keys).

A rule may name **decisive** evidence: feature columns at or above a minimum that decide without
the score (the checkpoint-failure rule's: a failed checkpoint in the job's own history is the
failure, reported at once, not a checkpoint later when the score has caught up). The guards still
apply.

:meth:`PostRule.decide` (one evaluation, as the live policy calls it) and
:meth:`PostRule.decisions` (every row of a frame at once, for calibration) share one
implementation of the persistence count's threshold and of every guard.

>>> rule = PostRule(threshold=0.5, k=2, n=3)
>>> rule.decide([0.9, 0.1, 0.2]), rule.decide([0.9, 0.1, 0.7])
(False, True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from itertools import product
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd

from pipelines.families.state_leak import (GROWTH_COLUMNS, SHAPE_COLUMNS, fills_below_limit, shape_judged,
                                           still_growing, vertex_own)

# Operators' rule of thumb when nothing else is known: a few minutes covers TTLs and windows of
# that order; longer warm-ups are declared per job (see ``detection.job_overrides``).
DEFAULT_WARMUP_HORIZON_S = 180.0

# The rule's fields that are (column, bound) pairs.
GROUPS = ("evidence", "impact", "decisive", "refused_by")

GUARD_COLUMNS = tuple(dict.fromkeys(("job_age_s", "job_age_checkpoints", "limit_eta_s", "vertex_state_over_plateau",
                                      "state_over_plateau") + GROWTH_COLUMNS + SHAPE_COLUMNS))


class RowDecisions(NamedTuple):
    """:meth:`PostRule.decide_and_hold_rows` at each row."""

    decided: np.ndarray
    held: np.ndarray  # a guard holds the decision back
    growing_since: np.ndarray  # since when (ms) the growth that stands in for persistence has held; NaN: not


@dataclass(frozen=True)
class PostRule:
    threshold: float = 0.5
    k: int = 1
    n: int = 1
    warmup_guard: bool = False
    resume_over_plateau: float = 1.1
    min_checkpoints: int = 6  # with the guard: a trend of fewer checkpoints seen is noise
    min_growth_per_h: float = 0.05
    evidence: tuple[tuple[str, float], ...] = ()
    impact: tuple[tuple[str, float], ...] = ()
    startup_s: float = 0.0  # no decision this soon after the job (re)started
    decisive: tuple[tuple[str, float], ...] = ()
    refused_by: tuple[tuple[str, float], ...] = ()
    confirm_after_horizon_s: float = 0.0  # with the guard: growth must go on this long past the horizon
    growth_confirms_after_s: float = 0.0  # with the guard: growth held this long needs one half score (0: never)

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError("threshold must be in [0, 1]")
        if not 1 <= self.k <= self.n:
            raise ValueError("need 1 <= k <= n")
        if self.resume_over_plateau < 1.0:
            raise ValueError("resume_over_plateau must be >= 1")
        if self.startup_s < 0:
            raise ValueError("startup_s must be >= 0")
        if self.growth_confirms_after_s < 0:
            raise ValueError("growth_confirms_after_s must be >= 0")

    # --- one evaluation ---------------------------------------------------------------------------

    def decide(self, recent_scores: Sequence[float], row: Mapping[str, Any] | None = None,
               horizon_s: float = DEFAULT_WARMUP_HORIZON_S, limit_eta_s: float | None = None,
               growing_for_s: float = 0.0) -> bool:
        """The decision after the last of ``recent_scores`` (oldest first). ``row`` is the feature
        row of the last one (the guards read it); ``limit_eta_s`` overrides its ``limit_eta_s``
        when a configured limit gives a forecast; ``growing_for_s`` is how long the growth that
        stands in for the persistence has held up to this row (:meth:`sustained_growth`)."""
        window = list(recent_scores)[-self.n:]
        count = np.array([sum(s >= self.threshold for s in window)])
        if row is None:
            return bool(count[0] >= self.k)
        columns = {name: np.array([_value(row, name)]) for name in self.guard_columns()}
        if limit_eta_s is not None:
            columns["limit_eta_s"] = np.fmin(columns["limit_eta_s"], [limit_eta_s])
        horizon = np.array([horizon_s], dtype="float64")
        grown = (self.growth_confirms(columns, horizon) & (growing_for_s >= self.growth_confirms_after_s)
                 & any(s >= self.threshold / 2.0 for s in window))
        return bool(self._decided_and_held(count, columns, horizon, grown)[0][0])

    # --- every row of a frame ---------------------------------------------------------------------

    def decisions(self, frame: pd.DataFrame, score: str = "score",
                  entity: Sequence[str] = ("cluster", "job_id", "vertex_id"), ts: str = "ts",
                  horizon_s: float | np.ndarray | pd.Series = DEFAULT_WARMUP_HORIZON_S,
                  history: Mapping[tuple, Sequence[float]] | None = None) -> pd.Series:
        """The decision at every row, each entity's rows taken in time order.

        ``horizon_s`` is one value or one per row; ``history`` maps an entity (a tuple of its
        ``entity`` values, None as "") to the scores it had before these rows (oldest first), so
        a batch continues the persistence count where the previous one left it.
        """
        keys = [frame[c].fillna("") for c in entity]
        past_keys = [key for key, values in (history or {}).items() for _ in list(values)[-self.n:]]
        past_scores = [value for values in (history or {}).values() for value in list(values)[-self.n:]]
        if past_keys:
            keys = [pd.concat([k, pd.Series([key[i] for key in past_keys], dtype=object)], ignore_index=True)
                    for i, k in enumerate(keys)]
        group = pd.MultiIndex.from_arrays(keys).factorize()[0] if len(keys) > 1 else keys[0].factorize()[0]
        n_rows = len(frame)
        columns = {name: (frame[name].to_numpy(dtype="float64") if name in frame else np.full(n_rows, np.nan))
                   for name in self.guard_columns()}
        decided = self.decide_rows(group[:n_rows], frame[score].to_numpy(dtype="float64"),
                                   frame[ts].to_numpy(dtype="float64"), columns, horizon_s,
                                   group[n_rows:], np.asarray(past_scores, dtype="float64"))
        return pd.Series(decided, index=frame.index)

    def decide_rows(self, group: np.ndarray, scores: np.ndarray, times: np.ndarray,
                    columns: Mapping[str, np.ndarray], horizon_s: float | np.ndarray,
                    past_group: np.ndarray | None = None, past_scores: np.ndarray | None = None) -> np.ndarray:
        """:meth:`decisions` on arrays: ``group`` codes each row's entity, ``columns`` holds the
        :meth:`guard_columns` (NaN where unknown), and ``past_group``/``past_scores`` are scores
        the entities had before these rows, oldest first within each entity."""
        return self.decide_and_hold_rows(group, scores, times, columns, horizon_s, past_group, past_scores).decided

    def decide_and_hold_rows(self, group: np.ndarray, scores: np.ndarray, times: np.ndarray,
                             columns: Mapping[str, np.ndarray], horizon_s: float | np.ndarray,
                             past_group: np.ndarray | None = None, past_scores: np.ndarray | None = None,
                             growing_since: Mapping[int, float] | None = None) -> RowDecisions:
        """:meth:`decide_rows`, where a decision is *held* (the score and evidence decide, but the
        warm-up or start-up guard holds it back: a fault that may still be a warm-up), and since
        when the growth that stands in for the persistence has held at each row (:meth:`sustained_growth`;
        ``growing_since`` maps an entity's code to when it began before these rows, in ms)."""
        n_rows = len(scores)
        horizon = np.broadcast_to(np.asarray(horizon_s, dtype="float64"), (n_rows,))
        since = self.sustained_growth(group, times, self.growth_confirms(columns, horizon), growing_since)
        grown = (times - since) >= self.growth_confirms_after_s * 1000.0  # NaN: not growing
        if past_group is not None and len(past_group):
            group = np.r_[group, past_group]
            scores = np.r_[scores, past_scores]
            # Earlier than any row, in their own order.
            times = np.r_[times, -1e18 + np.arange(len(past_group), dtype="float64")]
        order = np.lexsort((times, group))
        g = group[order]
        # Rolling counts of the last n per entity: prefix sums, each window clipped at its entity's start.
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, dtype=np.int64)
        entity_start = starts[np.searchsorted(starts, np.arange(len(g)), side="right") - 1] if len(g) else starts
        i = np.arange(len(g))

        def last_n_at_least(minimum: float) -> np.ndarray:
            prefix = np.r_[0, np.cumsum(scores[order] >= minimum)]
            counts = np.empty(len(g), dtype=np.int64)
            counts[order] = prefix[i + 1] - prefix[np.maximum(i + 1 - self.n, entity_start)]
            return counts[:n_rows]

        if grown.any():
            grown &= last_n_at_least(self.threshold / 2.0) >= 1
        decided, held = self._decided_and_held(last_n_at_least(self.threshold), columns, horizon, grown)
        return RowDecisions(decided, held, since)

    def growth_confirms(self, columns: Mapping[str, np.ndarray], horizon_s: np.ndarray) -> np.ndarray:
        """Where growth stands in for the persistence once it has held for
        ``growth_confirms_after_s``: past the horizon and its confirmation, the vertex's own state
        growing certainly enough to open a leak, over a history long enough to tell a fill, and no
        fill below the limit. Nowhere for a rule without the warm-up guard or with the path off."""
        if not (self.warmup_guard and self.growth_confirms_after_s > 0):
            return np.zeros(len(horizon_s), dtype=bool)
        own = vertex_own(columns)  # the job's growth, which stateless vertices fall back to, would open on each
        return self._grows_past_horizon(own, horizon_s, to_open=True) & shape_judged(own)

    @staticmethod
    def sustained_growth(group: np.ndarray, times: np.ndarray, growing: np.ndarray,
                         since: Mapping[int, float] | None = None) -> np.ndarray:
        """At each row, since when (the row time, ms) ``growing`` has held at every row of its
        entity without a break; NaN where it does not hold. ``since`` continues an entity's run
        from before these rows, where its first row still grows."""
        n_rows = len(times)
        result = np.full(n_rows, np.nan)
        if not growing.any():
            return result
        order = np.lexsort((times, group))
        g, t, grows = group[order], np.asarray(times, dtype="float64")[order], growing[order]
        first_of_entity = np.r_[True, g[1:] != g[:-1]]
        begins = grows & (first_of_entity | ~np.r_[False, grows[:-1]])
        start = np.where(begins, t, np.nan)
        if since:
            carried = begins & first_of_entity
            start[carried] = [since.get(int(code), time) for code, time in zip(g[carried], t[carried])]
        # Each row of a run takes the start of the run it belongs to.
        latest_begin = np.maximum.accumulate(np.where(begins, np.arange(n_rows), 0))
        result[order] = np.where(grows, start[latest_begin], np.nan)
        return result

    # --- the one implementation -------------------------------------------------------------------

    def guard_columns(self) -> tuple[str, ...]:
        """The feature columns the rule's guards and evidence read."""
        return ((GUARD_COLUMNS if self.warmup_guard else ()) + (("job_age_s",) if self.startup_s else ())
                + tuple(c for c, _ in self.evidence + self.impact) + tuple(c for c, _ in self.decisive)
                + tuple(c for c, _ in self.refused_by))

    def _decided_and_held(self, counts: np.ndarray, columns: Mapping[str, np.ndarray], horizon_s: np.ndarray,
                          grown: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        scored = counts >= self.k
        for group in (self.evidence, self.impact):
            if group:
                scored &= _any_at_least(columns, group)
        for column, minimum in self.decisive:
            scored |= np.nan_to_num(columns[column], nan=-np.inf) >= minimum
        for column, maximum in self.refused_by:
            scored &= ~(np.nan_to_num(columns[column], nan=-np.inf) >= maximum)
        scored |= grown  # past the guards already: growth_confirms asks them
        decided = scored.copy()
        if self.warmup_guard:
            decided &= self._past_warmup(columns, horizon_s)
        if self.startup_s:
            decided &= np.nan_to_num(columns["job_age_s"], nan=0.0) >= self.startup_s  # unknown: just started
        return decided, scored & ~decided & self._guarding(columns, horizon_s)

    def _guarding(self, c: Mapping[str, np.ndarray], horizon_s: np.ndarray) -> np.ndarray:
        """Where a guard is still running: the job younger than its warm-up horizon or start-up
        time (past them, a decision the guards refuse is a refusal, not a wait)."""
        age = np.nan_to_num(c["job_age_s"], nan=0.0) if "job_age_s" in c else np.zeros(len(horizon_s))
        running = np.zeros(len(age), dtype=bool)
        if self.warmup_guard:
            running |= age < horizon_s + self.confirm_after_horizon_s
        if self.startup_s:
            running |= age < self.startup_s
        return running

    def past_warmup(self, frame: pd.DataFrame, horizon_s: float | np.ndarray, to_open: bool = True) -> np.ndarray:
        """Where the warm-up guard leaves the decision to the score, at every row of ``frame``
        (with the growth certain enough to open a leak, or, ``to_open`` False, to hold one)."""
        columns = {name: (frame[name].to_numpy(dtype="float64") if name in frame else np.full(len(frame), np.nan))
                   for name in GUARD_COLUMNS}
        return self._past_warmup(columns, np.broadcast_to(np.asarray(horizon_s, dtype="float64"), (len(frame),)),
                                 to_open)

    def _past_warmup(self, c: Mapping[str, np.ndarray], horizon_s: np.ndarray, to_open: bool = True) -> np.ndarray:
        """True where the warm-up guard lets a decision through (NaN: unknown)."""
        age = np.nan_to_num(c["job_age_s"], nan=0.0)  # an unknown age counts as young
        over_plateau = _vertex_else_job(c["vertex_state_over_plateau"], c["state_over_plateau"])
        resumed = np.nan_to_num(over_plateau, nan=0.0) >= self.resume_over_plateau  # null: no plateau yet
        eta = np.nan_to_num(c["limit_eta_s"], nan=np.inf)
        limit_soon = eta <= np.maximum(horizon_s - age, 0.0)
        return self._grows_past_horizon(c, horizon_s, to_open) | ((resumed | limit_soon) & self._seen(c))

    def _grows_past_horizon(self, c: Mapping[str, np.ndarray], horizon_s: np.ndarray, to_open: bool) -> np.ndarray:
        """Past the horizon and its confirmation, seen long enough, and growing, not filling."""
        age = np.nan_to_num(c["job_age_s"], nan=0.0)  # an unknown age counts as young
        confirmed = age >= horizon_s + self.confirm_after_horizon_s
        return confirmed & self._seen(c) & self._growing(c, to_open) & ~fills_below_limit(c)

    def _seen(self, c: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.nan_to_num(c["job_age_checkpoints"], nan=0.0) >= self.min_checkpoints

    def sustains(self, row: Mapping[str, Any]) -> bool:
        """Whether an open incident of this rule's family still holds at ``row`` whatever its
        score: a leak (the rule with the warm-up guard) is over when its state stops growing, not
        when a score dips while it still grows (:meth:`_growing`)."""
        return self.warmup_guard and bool(self._growing({c: np.array([_value(row, c)]) for c in GROWTH_COLUMNS})[0])

    def _growing(self, c: Mapping[str, np.ndarray], to_open: bool = False) -> np.ndarray:
        """Where the state still grows (the leak family's definition, at ``min_growth_per_h``)."""
        return still_growing(c, self.min_growth_per_h, to_open)

    # --- persistence ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), **{name: [list(e) for e in getattr(self, name)]
                                   for name in GROUPS}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PostRule":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        if "warmup_s" in d:  # a rule saved before the horizon moved to the config
            values["warmup_guard"] = bool(d["warmup_s"])
        return cls(**{**values, **{name: tuple(tuple(e) for e in d.get(name, ()))
                                   for name in GROUPS}})

    # --- calibration ------------------------------------------------------------------------------

    @classmethod
    def search(cls, frame: pd.DataFrame, quality: Callable[["PostRule"], tuple], score: str = "score",
               persistence: Sequence[tuple[int, int]] = ((1, 1), (2, 3), (3, 4), (4, 6)),
               thresholds: Sequence[float] | None = None, guards: Mapping[str, Any] | None = None) -> "PostRule":
        """The rule with the best ``quality`` (a sortable key of the candidate rule).

        Ties go to the more conservative rule (higher threshold, then more persistence).
        ``guards`` are the fixed guard and evidence fields every candidate carries.
        """
        grid = thresholds if thresholds is not None else np.round(np.linspace(0.05, 0.95, 19), 2)
        guards = dict(guards or {})
        best: tuple | None = None
        for t, (k, n) in product(grid, persistence):
            rule = cls(float(t), k, n, **guards)
            key = (quality(rule), float(t), n - k + 1)
            if best is None or key > best[0]:
                best = (key, rule)
        return best[1]

    @classmethod
    def calibrate(cls, frame: pd.DataFrame, positive: Iterable[bool], score: str = "score", **grid: Any) -> "PostRule":
        """The rule with the best F1 of per-row decisions on validation rows."""
        y = np.asarray(list(positive), dtype=bool)
        if not y.any():
            raise ValueError("calibration needs positive rows")

        def f1(rule: "PostRule") -> float:
            decided = rule.decisions(frame, score).to_numpy(dtype=bool)
            tp = int((decided & y).sum())
            return 2 * tp / (2 * tp + int((decided & ~y).sum()) + int((~decided & y).sum())) if tp else 0.0

        return cls.search(frame, f1, score, **grid)


def _value(row: Mapping[str, Any], name: str) -> float:
    value = row.get(name)
    return float("nan") if value is None else float(value)


def _vertex_else_job(vertex_values, job_values) -> np.ndarray:
    values = np.asarray(vertex_values, dtype="float64")
    return np.where(np.isnan(values), np.asarray(job_values, dtype="float64"), values)


def _any_at_least(columns: Mapping[str, np.ndarray], group: Sequence[tuple[str, float]]) -> np.ndarray:
    """Where at least one of ``group``'s columns is at or above its minimum (NaN: not)."""
    return np.logical_or.reduce([np.nan_to_num(columns[column], nan=-np.inf) >= minimum for column, minimum in group])
