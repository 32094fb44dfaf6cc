"""The feature computation: one small, bounded state machine per Flink job.

:class:`JobFeatureState` consumes a job's input events in event-time order and, at each
evaluation point (a checkpoint or a job-status poll), returns feature rows named as in
``feature_store/definitions.py``. It is plain Python with JSON-serialisable state, so the very
same code runs in the batch path (``applyInPandas`` over a sorted history) and in the streaming
path (``transformWithState``, its state stored as one JSON value per job): that is what
makes offline and online features equal, not two implementations kept in step.

Memory is bounded per job: the last few checkpoints, a thinned long horizon, the last few polls
per vertex. A job idle for longer than ``idle_timeout_ms`` (event time) starts afresh, and a
finished or cancelled job is dropped, so state grows with live jobs, never with jobs ever seen.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from feature_store.definitions import (
    LONG_WINDOW_MS,
    METRIC_POLLS_AVERAGED,
    RESTART_WINDOW_MS,
    SHORT_WINDOW_CHECKPOINTS,
    VERTEX_FEATURES,
)

KIND_RANK = {"vertex_metrics": 0, "checkpoint": 1, "job_status": 2}  # polls update before they are evaluated
TERMINAL_STATES = {"FINISHED", "CANCELED", "FAILED"}
LONG_BUFFER_POINTS = 240
HEAP_POLLS = 20
DEFAULT_IDLE_TIMEOUT_MS = 30 * 60_000


def event_order_key(event: dict) -> tuple[int, int, str]:
    """Total order of a job's events: event time, then kind, then content (a stable tie-break)."""
    return (int(event["ts"]), KIND_RANK.get(event["kind"], 3), content_hash(event))


def content_hash(event: dict) -> str:
    return hashlib.blake2b(json.dumps(event, sort_keys=True).encode(), digest_size=8).hexdigest()


# --- small statistics, pure Python (n <= 240) ------------------------------------------------------


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares slope and R^2; None with fewer than three points. A flat series has R^2 0."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
    return slope, r2


def relative_trend(points: Sequence[Sequence[float]]) -> tuple[float | None, float | None]:
    """(slope per hour over the mean, R^2) of ``[(ts_ms, value), ...]``; Nones when not computable."""
    points = [p for p in points if p[1] is not None]
    fit = linear_fit([p[0] / 3_600_000.0 for p in points], [p[1] for p in points])
    if fit is None:
        return None, None
    mean = sum(p[1] for p in points) / len(points)
    return (fit[0] / mean if mean > 0 else None), fit[1]


def deceleration(points: Sequence[Sequence[float]]) -> float | None:
    """Later-half slope over earlier-half slope; None unless the earlier half clearly grew."""
    points = [p for p in points if p[1] is not None]
    if len(points) < 8:
        return None
    half = len(points) // 2
    early = linear_fit([p[0] / 3_600_000.0 for p in points[:half]], [p[1] for p in points[:half]])
    late = linear_fit([p[0] / 3_600_000.0 for p in points[half:]], [p[1] for p in points[half:]])
    mean = sum(p[1] for p in points) / len(points)
    if early is None or late is None or mean <= 0 or early[0] / mean < 0.01:
        return None
    return late[0] / early[0]


def state_trends(short: Sequence[Sequence[float]], long: Sequence[Sequence[float]]) -> tuple:
    """(relative slope, R^2) over the short window, the same over the long one, and deceleration."""
    return (*relative_trend(short), *relative_trend(long), deceleration(long))


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _max(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _spread(values: Sequence[float | None]) -> tuple[float | None, float | None, int | None]:
    """(max over mean, coefficient of variation, argmax) of per-subtask values."""
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    if len(known) < 2:
        return None, None, None
    vals = [v for _, v in known]
    mean = sum(vals) / len(vals)
    if mean <= 0:
        return None, None, None
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    hot = max(known, key=lambda kv: kv[1])[0]
    return max(vals) / mean, std / mean, hot


def _ratio(value: float | None, scale: float = 1000.0) -> float | None:
    return None if value is None else value / scale


@dataclass
class JobFeatureState:
    """Everything a job's features need, bounded; serialisable with :meth:`to_json`."""

    cluster: str = ""
    job_id: str = ""
    job_name: str = ""
    last_seen_ts: int | None = None
    last_key: list | None = None  # order key of the last consumed event
    age_checkpoints: int = 0
    checkpoints: list = field(default_factory=list)  # [ts, failed, e2e_ms, persisted_inflight]
    completed: list = field(default_factory=list)  # last completed: [ts, total, checkpointed, {vid: [state, max_sub]}]
    completed_long: list = field(default_factory=list)  # thinned over LONG_WINDOW_MS, same entries
    vertex_names: dict = field(default_factory=dict)
    vertex_checkpoint: dict = field(default_factory=dict)  # vid: {states, delays, alignments}
    barrier_waits: dict = field(default_factory=dict)  # vid: [[ts, max start delay, max alignment], ...]
    polls: dict = field(default_factory=dict)  # vid: [[busy_max, busy_mean, bp_max, bp_mean, idle_mean, in_pool, out_pool, [records...]], ...]
    status: dict = field(default_factory=dict)
    heap: list = field(default_factory=list)  # [[ts, ratio], ...]
    restarts: list = field(default_factory=list)  # [[ts, num_restarts], ...]
    terminated: bool = False
    last_failure: list | None = None  # [ts, failure message] of the latest FAILED checkpoint

    # --- persistence ---------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "JobFeatureState":
        return cls(**json.loads(text))

    # --- consuming events ------------------------------------------------------------------------

    def is_idle_at(self, ts: int, idle_timeout_ms: int) -> bool:
        return self.last_seen_ts is not None and ts - self.last_seen_ts > idle_timeout_ms

    def consume(self, event: dict, idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS) -> list[dict] | None:
        """Apply one event; return the feature rows it triggers (none for vertex metrics).

        Events must come in :func:`event_order_key` order; one at or before the last consumed
        (a duplicate delivery, or out of order) is ignored and reported by returning ``None``.
        """
        key = list(event_order_key(event))
        if self.last_key is not None and key <= self.last_key:
            return None
        ts = key[0]
        if self.is_idle_at(ts, idle_timeout_ms) or self.terminated:
            self.__init__()  # type: ignore[misc]  # the job went away and came back: start afresh
        self.cluster, self.job_id, self.job_name = event["cluster"], event["job_id"], event.get("job_name", "")
        self.last_seen_ts, self.last_key = ts, key
        kind = event["kind"]
        if kind == "vertex_metrics":
            self._poll(event)
            return []
        if kind == "checkpoint":
            self._checkpoint(event)
        elif kind == "job_status":
            self._job_status(event)
        else:
            return []
        return self.evaluate(ts, kind)

    def consume_all(self, events: Iterable[dict], idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS) -> list[dict]:
        """Consume events in event-time order (sorting them first); the feature rows they trigger."""
        rows: list[dict] = []
        for event in sorted(events, key=event_order_key):
            produced = self.consume(event, idle_timeout_ms)
            if produced:
                rows.extend(produced)
        return rows

    def _poll(self, event: dict) -> None:
        vid = event["vertex_id"]
        self.vertex_names[vid] = event["vertex_name"]
        subs = sorted(event["subtasks"], key=lambda s: s["index"])
        col = lambda name: [s.get(name) for s in subs]  # noqa: E731
        entry = [
            _max(col("busy_time_ms_per_s")), _mean(col("busy_time_ms_per_s")),
            _max(col("backpressured_time_ms_per_s")), _mean(col("backpressured_time_ms_per_s")),
            _mean(col("idle_time_ms_per_s")), _max(col("in_pool_usage")), _max(col("out_pool_usage")),
            col("records_in_per_s"),
        ]
        history = self.polls.setdefault(vid, [])
        history.append(entry)
        del history[:-METRIC_POLLS_AVERAGED]

    def _checkpoint(self, event: dict) -> None:
        ts = int(event["ts"])
        self.age_checkpoints += 1
        failed = event["status"] != "COMPLETED"
        if failed:
            self.last_failure = [ts, event.get("failure_message")]
        self.checkpoints.append([ts, int(failed), event.get("end_to_end_duration_ms"), event.get("persisted_data_bytes")])
        del self.checkpoints[:-SHORT_WINDOW_CHECKPOINTS]
        per_vertex = {}
        for vertex in event.get("vertices") or []:
            vid = vertex["vertex_id"]
            self.vertex_names[vid] = vertex["vertex_name"]
            subs = sorted(vertex.get("subtasks") or [], key=lambda s: s["index"])
            states = [s.get("state_size_bytes") for s in subs]
            delays = [s.get("start_delay_ms") for s in subs]
            self.vertex_checkpoint[vid] = {
                "states": states if not failed else self.vertex_checkpoint.get(vid, {}).get("states", []),
                "delays": delays, "alignments": [s.get("alignment_duration_ms") for s in subs],
            }
            if subs:
                series = self.barrier_waits.setdefault(vid, [])
                series.append([ts, _max(delays), _max(self.vertex_checkpoint[vid]["alignments"])])
                del series[:-SHORT_WINDOW_CHECKPOINTS]
            if not failed:
                per_vertex[vid] = [vertex.get("state_size_bytes"), _max(states)]
        if failed:
            return
        entry = [ts, event["state_size_bytes"], event["checkpointed_size_bytes"], per_vertex]
        self.completed.append(entry)
        del self.completed[:-SHORT_WINDOW_CHECKPOINTS]
        spacing = LONG_WINDOW_MS / LONG_BUFFER_POINTS
        if not self.completed_long or ts - self.completed_long[-1][0] >= spacing:
            self.completed_long.append(entry)
        self.completed_long = [e for e in self.completed_long if e[0] >= ts - LONG_WINDOW_MS]

    def _job_status(self, event: dict) -> None:
        ts = int(event["ts"])
        self.status = {k: event.get(k) for k in (
            "state", "checkpoint_interval_ms", "checkpoint_timeout_ms", "max_state_size_bytes",
            "checkpoints_in_progress", "jm_heap_used_bytes", "jm_heap_max_bytes")}
        used, maximum = event.get("jm_heap_used_bytes"), event.get("jm_heap_max_bytes")
        if used is not None and maximum:
            self.heap.append([ts, used / maximum])
            del self.heap[:-HEAP_POLLS]
        self.restarts.append([ts, event["num_restarts"]])
        self.restarts = [r for r in self.restarts if r[0] >= ts - RESTART_WINDOW_MS]
        if event["state"] in TERMINAL_STATES:
            self.terminated = True

    # --- features --------------------------------------------------------------------------------

    def evaluate(self, ts: int, trigger_kind: str) -> list[dict]:
        base = {"cluster": self.cluster, "job_id": self.job_id, "job_name": self.job_name, "ts": ts,
                "trigger_kind": trigger_kind, "is_late": False, "job_state": self.status.get("state"),
                "last_failure_message": self.last_failure[1] if self.last_failure else None}
        job = self._job_features()
        rows = [{**base, "vertex_id": None, "vertex_name": None, **job, **dict.fromkeys(VERTEX_FEATURES)}]
        vertex_bp = {vid: _mean(p[3] for p in polls) for vid, polls in self.polls.items()}
        busy = {vid: _mean(p[0] for p in polls) for vid, polls in self.polls.items()}
        busiest = max((v for v in busy if busy[v] is not None), key=lambda v: busy[v], default=None)
        for vid in sorted(self.vertex_names):
            # Vertex rows carry the job's features too: a vertex is judged in its job's context.
            rows.append({**base, "vertex_id": vid, "vertex_name": self.vertex_names[vid], **job,
                         **self._vertex_features(vid, vertex_bp, busy, busiest)})
        return rows

    def _limit(self) -> float | None:
        limit = self.status.get("max_state_size_bytes")
        return float(limit) if limit else None

    def _job_features(self) -> dict[str, Any]:
        f: dict[str, Any] = {"job_age_checkpoints": float(self.age_checkpoints),
                             "checkpoint_interval_ms": self.status.get("checkpoint_interval_ms")}
        short = [[e[0], e[1]] for e in self.completed]
        long = [[e[0], e[1]] for e in self.completed_long]
        f["state_size_bytes"] = self.completed[-1][1] if self.completed else None
        (f["state_rel_slope_per_h"], f["state_r2"], f["state_rel_slope_long_per_h"], f["state_r2_long"],
         f["state_deceleration"]) = state_trends(short, long)
        steps = [b[1] - a[1] for a, b in zip(short, short[1:])]
        f["state_frac_increasing"] = sum(s > 0 for s in steps) / len(steps) if steps else None
        f["checkpointed_rel_slope_per_h"], _ = relative_trend([[e[0], e[2]] for e in self.completed])
        fit = linear_fit([p[0] / 1000.0 for p in short], [p[1] for p in short]) if len(short) >= 3 else None
        input_rate = self._input_rate()
        f["state_growth_bytes_per_record"] = fit[0] / input_rate if fit and input_rate else None
        limit = self._limit()
        largest = [[e[0], _max(v[1] for v in e[3].values())] for e in self.completed]
        current = largest[-1][1] if largest else None
        f["limit_ratio"] = current / limit if limit and current is not None else None
        f["limit_eta_s"] = None
        if limit and current is not None:
            points = [p for p in largest if p[1] is not None]
            sub_fit = linear_fit([p[0] / 1000.0 for p in points], [p[1] for p in points])
            if current >= limit:
                f["limit_eta_s"] = 0.0
            elif sub_fit and sub_fit[0] > 0:
                f["limit_eta_s"] = (limit - current) / sub_fit[0]
        f["limit_known"] = 1.0 if limit else 0.0
        cps = self.checkpoints
        f["checkpoint_failed_fraction"] = sum(c[1] for c in cps) / len(cps) if cps else None
        consecutive = 0
        for c in reversed(cps):
            if not c[1]:
                break
            consecutive += 1
        f["checkpoint_consecutive_failures"] = float(consecutive) if cps else None
        latest_e2e = cps[-1][2] if cps else None
        interval, timeout = self.status.get("checkpoint_interval_ms"), self.status.get("checkpoint_timeout_ms")
        f["checkpoint_duration_over_interval"] = latest_e2e / interval if latest_e2e is not None and interval else None
        f["checkpoint_duration_over_timeout"] = latest_e2e / timeout if latest_e2e is not None and timeout else None
        f["checkpoint_duration_rel_slope_per_h"], _ = relative_trend([[c[0], c[2]] for c in cps])
        f["checkpoints_in_progress"] = self.status.get("checkpoints_in_progress")
        f["restarts_in_window"] = float(self.restarts[-1][1] - min(r[1] for r in self.restarts)) if self.restarts else None
        f["jm_heap_ratio"] = self.heap[-1][1] if self.heap else None
        f["jm_heap_rel_slope_per_h"], _ = relative_trend(self.heap)
        f["persisted_inflight_bytes"] = cps[-1][3] if cps else None
        f["persisted_inflight_rel_slope_per_h"], _ = relative_trend([[c[0], c[3]] for c in cps])
        return {k: (None if v is None else float(v)) for k, v in f.items()}

    def _input_rate(self) -> float | None:
        """The job's throughput: the largest total input rate of any vertex (records/s)."""
        totals = []
        for polls in self.polls.values():
            latest = polls[-1][7]
            if any(r is not None for r in latest):
                totals.append(sum(r for r in latest if r is not None))
        return max(totals) if totals else None

    def _vertex_features(self, vid: str, vertex_bp: dict, busy: dict, busiest: str | None) -> dict[str, Any]:
        f: dict[str, Any] = {}
        short = [[e[0], e[3][vid][0]] for e in self.completed if vid in e[3]]
        long = [[e[0], e[3][vid][0]] for e in self.completed_long if vid in e[3]]
        f["vertex_state_size_bytes"] = short[-1][1] if short else None
        (f["vertex_state_rel_slope_per_h"], f["vertex_state_r2"], f["vertex_state_rel_slope_long_per_h"],
         f["vertex_state_r2_long"], f["vertex_state_deceleration"]) = state_trends(short, long)
        limit = self._limit()
        largest = self.completed[-1][3].get(vid, [None, None])[1] if self.completed else None
        f["vertex_limit_ratio"] = largest / limit if limit and largest is not None else None
        polls = self.polls.get(vid, [])
        f["busy_max"] = _ratio(_mean(p[0] for p in polls))
        f["busy_mean"] = _ratio(_mean(p[1] for p in polls))
        f["backpressured_max"] = _ratio(_mean(p[2] for p in polls))
        f["backpressured_mean"] = _ratio(_mean(p[3] for p in polls))
        f["idle_mean"] = _ratio(_mean(p[4] for p in polls))
        others = [bp for other, bp in vertex_bp.items() if other != vid and bp is not None]
        f["downstream_of_backpressure"] = (f["busy_max"] * max(others) / 1000.0
                                           if f["busy_max"] is not None and others else None)
        f["is_busiest_vertex"] = (1.0 if busiest == vid else 0.0) if busiest is not None else None
        f["in_pool_max"] = _mean(p[5] for p in polls)
        f["out_pool_max"] = _mean(p[6] for p in polls)
        detail = self.vertex_checkpoint.get(vid, {})
        f["start_delay_max_ms"] = _max(detail.get("delays", []))
        f["alignment_max_ms"] = _max(detail.get("alignments", []))
        waits = self.barrier_waits.get(vid, [])
        f["start_delay_rel_slope_per_h"], _ = relative_trend([[w[0], w[1]] for w in waits])
        f["alignment_rel_slope_per_h"], _ = relative_trend([[w[0], w[2]] for w in waits])
        records = [_mean(p[7][k] if k < len(p[7]) else None for p in polls)
                   for k in range(max((len(p[7]) for p in polls), default=0))]
        f["records_in_max_over_mean"], f["records_in_cv"], hot_records = _spread(records)
        f["state_max_over_mean"], f["state_cv"], hot_state = _spread(detail.get("states", []))
        delays = [d for d in detail.get("delays", []) if d is not None]
        median = sorted(delays)[len(delays) // 2] if delays else None
        f["start_delay_max_over_median"] = max(delays) / max(median, 1.0) if delays and len(delays) >= 2 else None
        records_skew, state_skew = f["records_in_max_over_mean"] or 0.0, f["state_max_over_mean"] or 0.0
        hot = hot_records if records_skew >= state_skew else hot_state
        f["hot_subtask"] = hot if hot is not None else (hot_state if hot_state is not None else None)
        f["busy_reported"] = (1.0 if polls and polls[-1][0] is not None else 0.0) if polls else None
        f["state_reported"] = (1.0 if any(s is not None for s in detail.get("states", [])) else 0.0) if detail else None
        return {k: (None if v is None else float(v)) for k, v in f.items()}


def features_for_events(events: Iterable[dict], idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS) -> list[dict]:
    """The batch definition: every job's events in order through its own state machine."""
    by_job: dict[tuple[str, str], list[dict]] = {}
    for event in events:
        by_job.setdefault((event["cluster"], event["job_id"]), []).append(event)
    rows: list[dict] = []
    for _, job_events in sorted(by_job.items()):
        rows.extend(JobFeatureState().consume_all(job_events, idle_timeout_ms))
    return rows
