"""The feature computation: one small, bounded state machine per Flink job.

:class:`JobFeatureState` consumes a job's input events in the order they arrived and, at each
evaluation point (a checkpoint or a job-status poll), returns feature rows named as in
``feature_store/definitions.py``. It is plain Python with JSON-serialisable state, so the very
same code runs in the batch path (``applyInPandas`` over a recorded history, in its order) and in
the streaming path (``transformWithState``, its state stored with the job's other state): that
is what makes offline and online features equal, not two implementations kept in step.

**Order.** A job's events come in *streams* that are each in order at the source: its
checkpoints, its status polls, each vertex's metric samples. The streams interleave loosely: a
collector reports a checkpoint at its next poll, after vertex samples taken later (on real
Flink, up to a poll behind the job's latest event). So an event is used as it arrives unless it
is *late*: not after the last event of its own stream (a duplicate delivery, or a reordering),
more than the allowed lateness behind the job's latest event, or older than the end of a
finished job. Nothing waits for stragglers, and the same arrival order gives the same features in
a replay.

Memory is bounded per job: the last few checkpoints, a thinned long horizon, the last few polls
per vertex. A job idle for longer than ``idle_timeout_ms`` (event time) starts afresh, and so does
a job seen again after it finished (a new run); the live job forgets idle jobs (see
:mod:`pipelines.detection.processor`), so state grows with live jobs, never with jobs ever seen.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import orjson

from feature_store import trajectory as growth

from feature_store.definitions import (
    FAILURE_COUNT_WINDOW_MS,
    FLAT_MAX_GROWTH,
    FLAT_MAX_SPREAD,
    FLAT_MIN_POINTS,
    FLAT_MIN_SPAN_MS,
    LONG_WINDOW_MS,
    METRIC_POLLS_AVERAGED,
    RESTART_WINDOW_MS,
    SHORT_WINDOW_CHECKPOINTS,
    VERTEX_FEATURES,
)

# The order of one poll's events when they share a timestamp: samples before the evaluations that read them.
KIND_RANK = {"vertex_metrics": 0, "checkpoint": 1, "job_status": 2}
TERMINAL_STATES = {"FINISHED", "CANCELED", "FAILED"}
# Checkpoints a stopping job aborts (cancel, suspend, failover of the JobManager): not a failure
# of the job's checkpointing, so they are not counted as one.
STOPPING_FAILURES = ("Coordinator is suspending", "is shutting down", "Job is cancelling", "job has been cancelled")
JOB = "job"  # the key of job-level entries in per-vertex maps
LONG_BUFFER_POINTS = 240
HEAP_POLLS = 20
DEFAULT_IDLE_TIMEOUT_MS = 30 * 60_000
DEFAULT_LATENESS_MS = 10_000
RECENT_CHECKPOINT_IDS = 32  # what a duplicate checkpoint is recognised by (older ones are late anyway)
LATE, OUT_OF_ORDER = "late", "out_of_order"  # why an event is not used


def time_order(event: dict) -> tuple[int, int]:
    """Event time, then the kind's place in a poll: how a recording is sorted when its arrival
    order is not known (the simulator's and the lab's datasets)."""
    return int(event["ts"]), KIND_RANK.get(event["kind"], 3)


# Whose clock stamps an event: a checkpoint's times are the JobManager's, a sample's the collector's.
# Lateness is judged against the latest event of the same clock, so that skew between the two
# clocks (up to features.max_source_delay_s, the watermark's delay) drops nothing.
CLOCK_OF_KIND = {"checkpoint": "jobmanager", "vertex_metrics": "collector", "job_status": "collector"}


def stream_position(event: dict) -> tuple[str, int]:
    """The stream an event belongs to, and its place in it: event time, or for a checkpoint its
    id (concurrent checkpoints may finish out of id order, and several at the same millisecond)."""
    kind = event["kind"]
    if kind == "checkpoint":
        return kind, int(event["checkpoint_id"])
    if kind == "vertex_metrics":
        return f"vertex/{event['vertex_id']}", int(event["ts"])
    return kind, int(event["ts"])


# --- small statistics, pure Python (n <= 240) ------------------------------------------------------


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares slope and R^2; None with fewer than three points. A flat series has R^2 0."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sxy = syy = 0.0
    for x, y in zip(xs, ys):  # one pass: this runs for every vertex at every evaluation
        dx, dy = x - mx, y - my
        sxx += dx * dx
        sxy += dx * dy
        syy += dy * dy
    if sxx == 0:
        return None
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
    return slope, r2


def relative_trend(points: Sequence[Sequence[float]]) -> tuple[float | None, float | None]:
    """(slope per hour over the mean, R^2) of ``[(ts_ms, value), ...]``; Nones when not computable."""
    xs, ys = [], []
    for point in points:  # the fit of linear_fit, inlined: this runs several times per vertex and evaluation
        if point[1] is not None:
            xs.append(point[0] / 3_600_000.0)
            ys.append(point[1])
    n = len(xs)
    if n < 3:
        return None, None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sxy = syy = 0.0
    for x, y in zip(xs, ys):
        dx, dy = x - mx, y - my
        sxx += dx * dx
        sxy += dx * dy
        syy += dy * dy
    if sxx == 0:
        return None, None
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
    return (sxy / sxx / my if my > 0 else None), r2


def _centred(xs: Sequence[float]) -> tuple[list[float], float]:
    """The x side of a least-squares fit: the deviations from the mean, and their sum of squares."""
    mx = sum(xs) / len(xs)
    dxs = [x - mx for x in xs]
    sxx = 0.0
    for dx in dxs:
        sxx += dx * dx
    return dxs, sxx


def _fit_centred(xside: tuple[list[float], float], ys: Sequence[float], my: float) -> tuple[float, float] | None:
    """Slope and R^2 of ``ys`` (mean ``my``) over the x side of :func:`_centred`: the sums of
    :func:`linear_fit`, added in the same order, so the same values come out."""
    dxs, sxx = xside
    if sxx == 0:
        return None
    sxy = syy = 0.0
    for dx, y in zip(dxs, ys):
        dy = y - my
        sxy += dx * dy
        syy += dy * dy
    return sxy / sxx, (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0


class LongTimes:
    """The time side of the long-horizon fits over one list of times (hours): the whole span and
    its earlier and later halves, centred once. A job's series and each of its vertices' share
    their times (one thinned buffer), so one instance serves them all when the buffer moves."""

    __slots__ = ("n", "whole", "halves")

    def __init__(self, hours: Sequence[float]) -> None:
        self.n = n = len(hours)
        self.whole = _centred(hours) if n >= 3 else None
        self.halves = (_centred(hours[:n // 2]), _centred(hours[n // 2:])) if n >= 8 else None

    def trends(self, ys: Sequence[float]) -> list:
        """[relative slope per hour, R^2, deceleration] of ``ys`` (one value per time, none
        unknown): :func:`relative_trend` and the later half's slope over the earlier half's, the
        latter None unless the earlier half clearly grew."""
        if self.whole is None:
            return [None, None, None]
        my = sum(ys) / self.n
        fit = _fit_centred(self.whole, ys, my)
        rel_slope, r2 = (fit[0] / my if my > 0 else None, fit[1]) if fit else (None, None)
        decel = None
        if self.halves is not None and my > 0:
            half = self.n // 2
            early_ys, late_ys = ys[:half], ys[half:]
            early = _fit_centred(self.halves[0], early_ys, sum(early_ys) / half)
            if early is not None and early[0] / my >= 0.01:
                late = _fit_centred(self.halves[1], late_ys, sum(late_ys) / (self.n - half))
                decel = late[0] / early[0] if late is not None else None
        return [rel_slope, r2, decel]


def long_trends(points: Sequence[Sequence[float]]) -> list:
    """[relative slope per hour, R^2, deceleration] over the long horizon of ``[(ts_ms, value), ...]``,
    the unknown values left out."""
    points = [p for p in points if p[1] is not None]
    return LongTimes([p[0] / 3_600_000.0 for p in points]).trends([p[1] for p in points])


# The helpers below run for every subtask column at every evaluation. A sequence without an
# unknown value (the rule) is used as it is, not copied: the same values added in the same order.


def _known(values: Iterable[float | None]) -> Sequence[float]:
    """``values`` without the unknown ones, in order (the sequence itself when none is unknown)."""
    if type(values) is not list and type(values) is not tuple:
        values = list(values)
    return [v for v in values if v is not None] if None in values else values


def _mean(values: Iterable[float | None]) -> float | None:
    known = _known(values)
    return sum(known) / len(known) if known else None


def _max(values: Iterable[float | None]) -> float | None:
    known = _known(values)
    return max(known) if known else None


def _spread(values: Sequence[float | None]) -> tuple[float | None, float | None, int | None]:
    """(max over mean, coefficient of variation, argmax) of per-subtask values."""
    if None in values:
        places = [i for i, v in enumerate(values) if v is not None]
        vals = [values[i] for i in places]
    else:
        places, vals = None, values
    n = len(vals)
    if n < 2:
        return None, None, None
    mean = sum(vals) / n
    if mean <= 0:
        return None, None, None
    std = math.sqrt(sum([(v - mean) ** 2 for v in vals]) / n)
    top = max(vals)
    hot = vals.index(top)  # the first subtask at the maximum
    return top / mean, std / mean, hot if places is None else places[hot]


def hot_excess(values: Sequence[float | None]) -> float | None:
    """How much more than its fair share the busiest subtask takes, scaled to [0, 1]:
    0 when every subtask gets ``1/n``, 1 when one gets everything. Unlike max over mean (at most
    ``n``) it reads the same at any parallelism."""
    known = _known(values)
    total = sum(known)
    if len(known) < 2 or total <= 0:
        return None
    n = len(known)
    return max(0.0, (max(known) / total - 1.0 / n) / (1.0 - 1.0 / n))


def _trailing(entries: list, min_points: int, min_span_ms: int) -> list:
    """The shortest suffix of ``entries`` (``[ts, ...]``, in time order) with at least
    ``min_points`` entries spanning at least ``min_span_ms``; all of them if none is that long."""
    for start in range(len(entries) - min_points, -1, -1):
        if entries[-1][0] - entries[start][0] >= min_span_ms:
            return entries[start:]
    return entries


def is_flat(points: Sequence[Sequence[float]]) -> bool:
    """A plateau: enough points over a long enough span whose fitted trend changes the state by
    at most ``FLAT_MAX_GROWTH`` of its mean over the span (RocksDB's sizes jitter with flushes
    and compactions, so the trend decides, with a looser bound on the spread)."""
    points = [p for p in points if p[1] is not None]
    if len(points) < FLAT_MIN_POINTS or points[-1][0] - points[0][0] < FLAT_MIN_SPAN_MS:
        return False
    values = [p[1] for p in points]
    mean = sum(values) / len(values)
    if mean <= 0 or (max(values) - min(values)) / mean > FLAT_MAX_SPREAD:
        return False
    fit = linear_fit([p[0] for p in points], values)
    growth = abs(fit[0]) * (points[-1][0] - points[0][0]) / mean if fit else 0.0
    return growth <= FLAT_MAX_GROWTH


def _censored_delays(subtasks: Sequence[dict], delays: list, duration_ms: float | None) -> list:
    """A failed checkpoint's start delays: a subtask that never acknowledged it had not taken its
    barrier when it failed, so it waited at least the checkpoint's duration. Unknown, a bottleneck
    whose checkpoints all expire would read as one that was never waited on."""
    if duration_ms is None:
        return delays
    return [duration_ms if delay is None and sub.get("end_to_end_duration_ms") is None else delay
            for sub, delay in zip(subtasks, delays)]


def _over(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


@dataclass
class JobFeatureState:
    """Everything a job's features need, bounded; serialisable with :meth:`to_json`."""

    cluster: str = ""
    job_id: str = ""
    job_name: str = ""
    last_seen_ts: int | None = None  # of the event consumed last
    latest_ts: int | None = None  # the latest event time consumed
    clock_latest: dict = field(default_factory=dict)  # clock (CLOCK_OF_KIND): the latest event time it stamped
    streams: dict = field(default_factory=dict)  # stream: time of its last consumed event (checkpoints: recent ids)
    age_checkpoints: int = 0
    checkpoints: list = field(default_factory=list)  # [ts, failed, e2e_ms, persisted_inflight]
    completed: list = field(default_factory=list)  # last completed: [ts, total, checkpointed, {vid: [state, max_sub]}, max_sub]
    completed_long: list = field(default_factory=list)  # thinned over LONG_WINDOW_MS: [ts, total, [state of vertex i]]
    long_vertices: list = field(default_factory=list)  # the vertex ids ``completed_long``'s lists follow
    vertex_names: dict = field(default_factory=dict)
    vertex_checkpoint: dict = field(default_factory=dict)  # vid: {states, delays, alignments}
    barrier_waits: dict = field(default_factory=dict)  # vid: [[ts, max start delay, max alignment], ...]
    polls: dict = field(default_factory=dict)  # vid: [[busy_max, busy_mean, bp_max, bp_mean, idle_mean, in_pool, out_pool, [records...]], ...]
    status: dict = field(default_factory=dict)
    heap: list = field(default_factory=list)  # [[ts, ratio], ...]
    restarts: list = field(default_factory=list)  # [[ts, num_restarts]] where it changed, the window's start on
    terminated: bool = False
    last_failure: list | None = None  # [ts, failure message] of the latest FAILED checkpoint
    first_seen_ts: int | None = None
    first_checkpoint: list | None = None  # [trigger_ts, checkpoint_id] of the first checkpoint seen
    restarted_ts: int | None = None  # when num_restarts last went up
    failed_counts: list = field(default_factory=list)  # [[ts, counted failures], ...] (Flink's counter, less the excused)
    failed_polled: list | None = None  # [ts, checkpoints_failed_total] of the latest status
    failed_excused: int = 0  # counter increments that were trigger failures while the run's tasks started
    run_first_checkpoint_ts: int | None = None  # trigger time of the current run's first checkpoint in history
    retired_max: dict = field(default_factory=dict)  # JOB or vid: largest state that left the short window
    plateau: dict = field(default_factory=dict)  # JOB or vid: the highest level its state held flat
    recent: list = field(default_factory=list)  # completed entries of the last FLAT_MIN_SPAN_MS * 1.5, thinned
    # The growth test's window (growth.GROWTH_WINDOW_MS, or the last GROWTH_MIN_POINTS checkpoints
    # if they come slower), thinned: [ts, total, {vid: state}].
    growth_window: list = field(default_factory=list)
    # The state's history since the job was first seen, halved when full: [ts, total, {vid: state}].
    trajectory: list = field(default_factory=list)
    trajectory_spacing_ms: float = 1000.0
    trajectory_fits: dict = field(default_factory=dict)  # JOB or vid: [stamp, fit] (refitted when the history moved)
    # Completed checkpoints' end-to-end durations over growth.FORECAST_WINDOW_MS (at least
    # FORECAST_MIN_POINTS), thinned: [ts, duration_ms]; what the timeout forecast fits.
    durations: list = field(default_factory=list)
    # Long-horizon fits, {JOB or vid: [stamp, trends]}: they change only when the thinned long
    # buffer does (every LONG_WINDOW_MS / LONG_BUFFER_POINTS), not at every evaluation. Kept in
    # the state because the stream rebuilds the machine from it at every call; the stamp (length, first and last time) names
    # the buffer's content exactly, as entries are only appended later in time or dropped from
    # the front. Lists, not tuples, so a stamp read back from JSON compares equal.
    long_trend_cache: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Features of inputs unchanged since an earlier evaluation, in memory only: a checkpoint's
        # evaluation reuses the vertex metrics' features of the last poll, a poll's the checkpoint
        # history's. The counters say when a vertex's polls or the job's status last changed.
        self._memo: dict = {}
        self._poll_seq: dict = {}
        self._status_seq = 0
        self._long_json: tuple[list, orjson.Fragment] | None = None  # completed_long's JSON, by its stamp
        self._long_times: tuple[list, LongTimes] | None = None  # completed_long's times centred, in one evaluation

    def _long_stamp(self) -> list:
        """What names ``completed_long``'s content exactly: its length, last and first time (its
        entries never change; they are only appended later in time or dropped from the front)."""
        buffer = self.completed_long
        return [len(buffer), buffer[-1][0] if buffer else None, buffer[0][0] if buffer else None]

    def _long_trends(self, key: str) -> list:
        """The long-horizon trends of the job's state (``key`` JOB) or a vertex's, fitted again
        only when the long buffer changed (its stamp). The job and its vertices share the
        buffer's times: they are centred once for all of them (:class:`LongTimes`)."""
        stamp = self._long_stamp()
        cached = self.long_trend_cache.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        buffer = self.completed_long
        if key == JOB:
            ys = [e[1] for e in buffer]
        elif key in self.long_vertices:
            i = self.long_vertices.index(key)
            ys = [e[2][i] if i < len(e[2]) else None for e in buffer]
        else:
            ys = []
        if None in ys:  # a value unknown at some times (a vertex not in every checkpoint): its own times
            trends = long_trends([[e[0], y] for e, y in zip(buffer, ys)])
        else:
            if self._long_times is None or self._long_times[0] != stamp:
                self._long_times = (stamp, LongTimes([e[0] / 3_600_000.0 for e in buffer]))
            trends = self._long_times[1].trends(ys) if ys else [None, None, None]
        self.long_trend_cache[key] = [stamp, trends]
        return trends

    # --- persistence ---------------------------------------------------------------------------

    def orjson_fields(self) -> dict:
        """The state's fields as ``orjson.dumps`` writes them (a shallow view), ``completed_long``
        as its JSON, serialised again only when the buffer changed (at most once every 22.5 s).
        The stream writes a job's whole state at every micro-batch the job has events in, and
        that buffer grows to a large part of it over the long horizon, where it is the same from
        one write to the next: 240 entries of a few numbers, thousands of objects to walk."""
        fields = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        stamp = self._long_stamp()
        if self._long_json is None or self._long_json[0] != stamp:
            self._long_json = (stamp, orjson.Fragment(orjson.dumps(self.completed_long,
                                                                   option=orjson.OPT_SERIALIZE_NUMPY)))
        fields["completed_long"] = self._long_json[1]
        return fields

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "JobFeatureState":
        return cls(**json.loads(text))

    # --- consuming events ------------------------------------------------------------------------

    def is_idle_at(self, ts: int, idle_timeout_ms: int) -> bool:
        return self.latest_ts is not None and ts - self.latest_ts > idle_timeout_ms

    def _starts_afresh(self, event: dict, idle_timeout_ms: int) -> bool:
        """The job went away and came back (silent for the idle timeout, or a new run after it ended).
        A new run shows first in a status that is not terminal, which the collector publishes before
        that poll's checkpoints; a checkpoint seen after the end belongs to the run that ended, even
        when the JobManager's clock, ahead of the collector's, stamps it after the end."""
        ts = int(event["ts"])
        if self.is_idle_at(ts, idle_timeout_ms):
            return True
        return self.terminated and event["kind"] == "job_status" and event["state"] not in TERMINAL_STATES and \
            ts > self.clock_latest.get(CLOCK_OF_KIND["job_status"], self.latest_ts)

    def refusal(self, event: dict, idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
                lateness_ms: int = DEFAULT_LATENESS_MS) -> str | None:
        """Why the job cannot use ``event`` now (:data:`LATE` or :data:`OUT_OF_ORDER`), or None."""
        if self.latest_ts is None:
            return None
        ts = int(event["ts"])
        if self._starts_afresh(event, idle_timeout_ms):
            return None
        own = self.clock_latest.get(CLOCK_OF_KIND[event["kind"]])
        if self.terminated or (own is not None and ts < own - lateness_ms):
            return LATE
        stream, position = stream_position(event)
        last = self.streams.get(stream)
        if stream == "checkpoint":
            return OUT_OF_ORDER if last is not None and position in last else None
        return OUT_OF_ORDER if last is not None and position <= last else None

    def consume(self, event: dict, idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
                lateness_ms: int = DEFAULT_LATENESS_MS) -> list[dict] | None:
        """Apply one event (in arrival order); return the feature rows it triggers (none for
        vertex metrics), or None for an event the job cannot use (see :meth:`refusal`)."""
        if self.refusal(event, idle_timeout_ms, lateness_ms) is not None:
            return None
        ts = int(event["ts"])
        if self.latest_ts is not None and self._starts_afresh(event, idle_timeout_ms):
            self.__init__()  # type: ignore[misc]
        self.cluster, self.job_id, self.job_name = event["cluster"], event["job_id"], event.get("job_name", "")
        stream, position = stream_position(event)
        if stream == "checkpoint":
            self.streams[stream] = (self.streams.get(stream, []) + [position])[-RECENT_CHECKPOINT_IDS:]
        else:
            self.streams[stream] = position
        self.last_seen_ts = ts
        self.latest_ts = ts if self.latest_ts is None else max(self.latest_ts, ts)
        clock = CLOCK_OF_KIND[event["kind"]]
        self.clock_latest[clock] = max(self.clock_latest.get(clock, ts), ts)
        if self.first_seen_ts is None:
            self.first_seen_ts = ts
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

    def consume_all(self, events: Iterable[dict], idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
                    lateness_ms: int = DEFAULT_LATENESS_MS) -> list[dict]:
        """Consume events in the order given (their arrival order); the feature rows they trigger."""
        rows: list[dict] = []
        for event in events:
            produced = self.consume(event, idle_timeout_ms, lateness_ms)
            if produced:
                rows.extend(produced)
        return rows

    def _poll(self, event: dict) -> None:
        vid = event["vertex_id"]
        self.vertex_names[vid] = event["vertex_name"]
        subs = sorted(event["subtasks"], key=itemgetter("index"))
        busy = [s.get("busy_time_ms_per_s") for s in subs]
        backpressured = [s.get("backpressured_time_ms_per_s") for s in subs]
        entry = [
            _max(busy), _mean(busy), _max(backpressured), _mean(backpressured),
            _mean([s.get("idle_time_ms_per_s") for s in subs]), _max([s.get("in_pool_usage") for s in subs]),
            _max([s.get("out_pool_usage") for s in subs]), [s.get("records_in_per_s") for s in subs],
        ]
        history = self.polls.setdefault(vid, [])
        history.append(entry)
        del history[:-METRIC_POLLS_AVERAGED]
        self._poll_seq[vid] = self._poll_seq.get(vid, 0) + 1

    def _checkpoint(self, event: dict) -> None:
        ts = int(event["ts"])
        failed = event["status"] != "COMPLETED"
        if failed and any(m in (event.get("failure_message") or "") for m in STOPPING_FAILURES):
            return
        self.age_checkpoints += 1
        if self.run_first_checkpoint_ts is None:
            self.run_first_checkpoint_ts = int(event.get("trigger_ts") or ts)
        if self.first_checkpoint is None and event.get("checkpoint_id") is not None:
            self.first_checkpoint = [event.get("trigger_ts") or ts, event["checkpoint_id"]]
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
            if failed:
                delays = _censored_delays(subs, delays, event.get("end_to_end_duration_ms"))
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
        entry = [ts, event["state_size_bytes"], event["checkpointed_size_bytes"], per_vertex,
                 _max(sizes[1] for sizes in per_vertex.values())]
        self.completed.append(entry)
        for retired in self.completed[:-SHORT_WINDOW_CHECKPOINTS]:
            self._retire(JOB, retired[1])
            for vid, sizes in retired[3].items():
                self._retire(vid, sizes[0])
        del self.completed[:-SHORT_WINDOW_CHECKPOINTS]
        if not self.recent or ts - self.recent[-1][0] >= FLAT_MIN_SPAN_MS / 20:
            self.recent.append(entry)
        self.recent = [e for e in self.recent if e[0] >= ts - FLAT_MIN_SPAN_MS * 1.5]
        # A plateau: the latest stretch of at least FLAT_MIN_POINTS checkpoints spanning
        # FLAT_MIN_SPAN_MS (from the recent buffer when checkpoints come faster than that).
        source = self.completed if ts - self.completed[0][0] >= FLAT_MIN_SPAN_MS else self.recent
        window = _trailing(source, FLAT_MIN_POINTS, FLAT_MIN_SPAN_MS)
        self._plateau(JOB, [[e[0], e[1]] for e in window])
        for vid in per_vertex:
            self._plateau(vid, [[e[0], e[3][vid][0]] for e in window if vid in e[3]])
        self._grow(ts, entry[1], {vid: sizes[0] for vid, sizes in per_vertex.items()})
        if event.get("end_to_end_duration_ms") is not None:
            self._add_duration(ts, event["end_to_end_duration_ms"])
        spacing = LONG_WINDOW_MS / LONG_BUFFER_POINTS
        if not self.completed_long or ts - self.completed_long[-1][0] >= spacing:
            # What the long-horizon trends read, the vertices by their place in long_vertices (a
            # job's state is read and written whole at every micro-batch: ids repeated in 240
            # entries were most of it).
            for vid in per_vertex:
                if vid not in self.long_vertices:
                    self.long_vertices.append(vid)
            self.completed_long.append([ts, entry[1], [per_vertex[vid][0] if vid in per_vertex else None
                                                       for vid in self.long_vertices]])
        self.completed_long = [e for e in self.completed_long if e[0] >= ts - LONG_WINDOW_MS]

    def _grow(self, ts: int, total: float | None, states: dict) -> None:
        """Add a completed checkpoint to the growth window and the trajectory."""
        point = [ts, total, states]
        window = self.growth_window
        growth.thin_append(window, point, growth.GROWTH_WINDOW_MS / growth.WINDOW_POINTS)
        start = ts - growth.GROWTH_WINDOW_MS
        keep = next((i for i, e in enumerate(window) if e[0] >= start), len(window))
        del window[:min(keep, max(0, len(window) - growth.GROWTH_MIN_POINTS))]
        if growth.thin_append(self.trajectory, point, self.trajectory_spacing_ms):
            if len(self.trajectory) > growth.TRAJECTORY_POINTS:
                self.trajectory = growth.halve(self.trajectory)
                self.trajectory_spacing_ms *= 2
            self.trajectory = [e for e in self.trajectory if e[0] >= ts - LONG_WINDOW_MS]

    def rebuild_growth_history(self) -> None:
        """The growth window, the trajectory and the durations from the checkpoint buffers a state
        stored before they existed (the long one, the recent and the short ones): a job that was
        already watched keeps its history across the upgrade instead of warming up again."""
        points = {e[0]: [e[0], e[1], dict(zip(self.long_vertices, e[2]))] for e in self.completed_long}
        for entry in self.recent + self.completed:
            points[entry[0]] = [entry[0], entry[1], {vid: sizes[0] for vid, sizes in entry[3].items()}]
        self.growth_window, self.trajectory, self.trajectory_spacing_ms = [], [], 1000.0
        self.trajectory_fits, self.durations = {}, []
        for ts, total, states in sorted(points.values(), key=lambda p: p[0]):
            self._grow(ts, total, {vid: state for vid, state in states.items() if state is not None})
        for ts, failed, duration_ms, _ in self.checkpoints:
            if not failed and duration_ms is not None:
                self._add_duration(ts, duration_ms)

    def _add_duration(self, ts: int, duration_ms: float) -> None:
        """Add a completed checkpoint's end-to-end duration to what the timeout forecast fits."""
        growth.thin_append(self.durations, [ts, duration_ms], growth.FORECAST_WINDOW_MS / growth.WINDOW_POINTS)
        self.durations = growth.window(self.durations, growth.FORECAST_WINDOW_MS, growth.FORECAST_MIN_POINTS)

    def _growth_features(self, key: str, prefix: str) -> dict[str, float | None]:
        """The growth test and the shape of the growth of the job's state (``key`` JOB) or a vertex's."""
        def series(entries: list) -> list:
            return [[e[0], e[1] if key == JOB else e[2].get(key)] for e in entries]

        points = series(self.growth_window)
        bounds = growth.growth_bounds(points)
        recent = growth.recent_growth_low(points)
        # Refitted every few points the history gains (or when it is thinned), not at every checkpoint.
        stamp = [len(self.trajectory) // growth.REFIT_POINTS, self.trajectory_spacing_ms,
                 self.trajectory[0][0] if self.trajectory else None]
        cached = self.trajectory_fits.get(key)
        if cached is None or cached[0] != stamp:
            cached = self.trajectory_fits[key] = [stamp, growth.trajectory_fit(series(self.trajectory))]
        fit = cached[1]
        filling = growth.fills_toward_plateau(fit, bounds)
        return {f"{prefix}growth_low_per_h": bounds[1] if bounds else None,
                f"{prefix}growth_high_per_h": bounds[2] if bounds else None,
                f"{prefix}recent_growth_low_per_h": recent,
                f"{prefix}filling": (1.0 if filling else 0.0) if fit is not None else None,
                f"{prefix}plateau_bytes": fit["plateau"] if filling else None,
                f"{prefix}plateau_eta_s": fit["plateau_eta_s"] if filling else None}

    def _job_status(self, event: dict) -> None:
        ts = int(event["ts"])
        self._status_seq += 1
        self.status = {k: event.get(k) for k in (
            "state", "checkpoint_interval_ms", "checkpoint_timeout_ms", "max_state_size_bytes",
            "checkpoints_in_progress", "jm_heap_used_bytes", "jm_heap_max_bytes")}
        used, maximum = event.get("jm_heap_used_bytes"), event.get("jm_heap_max_bytes")
        if used is not None and maximum:
            self.heap.append([ts, used / maximum])
            del self.heap[:-HEAP_POLLS]
        if self.restarts and event["num_restarts"] > self.restarts[-1][1]:
            self.restarted_ts = ts
            self.run_first_checkpoint_ts = None
        # Only where the counter changed: the value at any poll is the last change before it (a
        # status poll every few seconds made this most of a job's state).
        if not self.restarts or event["num_restarts"] != self.restarts[-1][1]:
            self.restarts.append([ts, event["num_restarts"]])
        while len(self.restarts) > 1 and self.restarts[1][0] <= ts - RESTART_WINDOW_MS:
            del self.restarts[0]  # the first entry holds the value at the window's start
        total = event.get("checkpoints_failed_total")
        if total is not None:
            previous = self.failed_polled
            if previous is not None and total > previous[1] and (
                    self.run_first_checkpoint_ts is None or previous[0] <= self.run_first_checkpoint_ts):
                # Flink counts a checkpoint it could not trigger because the tasks were not running
                # yet (every job start, every restart) as failed, without a history entry; a real
                # failure of a started run shows in the history.
                self.failed_excused += total - previous[1]
            self.failed_polled = [ts, total]
            self.failed_counts.append([ts, total - self.failed_excused])
            self.failed_counts = [c for c in self.failed_counts if c[0] >= ts - FAILURE_COUNT_WINDOW_MS]
        if event["state"] in TERMINAL_STATES:
            self.terminated = True

    def _plateau(self, key: str, points: list) -> None:
        """Remember the highest level a plateau reached: growth past it is not warm-up."""
        if is_flat(points):
            level = max(p[1] for p in points if p[1] is not None)
            self.plateau[key] = max(self.plateau.get(key, level), level)

    def _retire(self, key: str, size: float | None) -> None:
        if size is not None:
            self.retired_max[key] = max(self.retired_max.get(key, size), size)

    def _started_ts(self) -> int | None:
        """When the job's current run began: the last restart, else the first thing seen of it,
        or earlier when its first checkpoint's id says it ran before we saw it (ids start at 1)."""
        if self.restarted_ts is not None:
            return self.restarted_ts
        start = self.first_seen_ts
        interval = self.status.get("checkpoint_interval_ms")
        if start is not None and self.first_checkpoint and interval:
            start = min(start, int(self.first_checkpoint[0] - (self.first_checkpoint[1] - 1) * interval))
        return start

    # --- features --------------------------------------------------------------------------------

    def evaluate(self, ts: int, trigger_kind: str) -> list[dict]:
        base = {"cluster": self.cluster, "job_id": self.job_id, "job_name": self.job_name, "ts": ts,
                "trigger_kind": trigger_kind, "is_late": False, "job_state": self.status.get("state"),
                "last_failure_message": self.last_failure[1] if self.last_failure else None}
        job = self._job_features()
        rows = [{**base, "vertex_id": None, "vertex_name": None, **job, **NO_VERTEX_FEATURES}]
        # The memoised parts are floats already (converted once, when computed, not for every row).
        polled = {vid: self._memoised(("polls", vid), self._poll_seq.get(vid, 0), self._poll_features, vid)
                  for vid in self.polls}
        busiest = max((v for v, p in polled.items() if p.busy_max is not None), key=lambda v: polled[v].busy_max,
                      default=None)
        checkpoint_version = (self.age_checkpoints, self._limit())
        for vid in sorted(self.vertex_names):
            # Vertex rows carry the job's features too: a vertex is judged in its job's context.
            checkpointed, hot_state, state_skew = self._memoised(
                ("checkpoints", vid), checkpoint_version, self._vertex_checkpoint_features, vid)
            polls = polled.get(vid, NO_POLLS)
            others = [p.backpressured_mean for other, p in polled.items()
                      if other != vid and p.backpressured_mean is not None]
            others_max = [p.backpressured_max for other, p in polled.items()
                          if other != vid and p.backpressured_max is not None]
            # The hot subtask: of records or of state, whichever is more skewed (of state if records are unknown).
            hot = polls.hot_subtask if polls.records_skew >= state_skew else hot_state
            hot = hot if hot is not None else hot_state
            rows.append({**base, "vertex_id": vid, "vertex_name": self.vertex_names[vid], **job, **checkpointed,
                         **polls.features,
                         "downstream_of_backpressure": (polls.busy_max / 1000.0 * max(others) / 1000.0
                                                        if polls.busy_max is not None and others else None),
                         "others_backpressured_max": max(others_max) / 1000.0 if others_max else None,
                         "is_busiest_vertex": (1.0 if busiest == vid else 0.0) if busiest is not None else None,
                         "hot_subtask": None if hot is None else float(hot)})
        # The centred times served this evaluation's long fits, the job's and every vertex's: not
        # kept for the next (three lists of up to 240 floats a job: about as much memory as its JSON).
        self._long_times = None
        return rows

    def _memoised(self, key: tuple, version: Any, compute: Callable[[str], Any], argument: str) -> Any:
        """``compute(argument)``, again only when ``version`` (of its inputs) moved since the last call."""
        hit = self._memo.get(key)
        if hit is None or hit[0] != version:
            hit = self._memo[key] = (version, compute(argument))
        return hit[1]

    def _limit(self) -> float | None:
        limit = self.status.get("max_state_size_bytes")
        return float(limit) if limit else None

    def _job_features(self) -> dict[str, Any]:
        started = self._started_ts()
        f: dict[str, Any] = {"job_age_checkpoints": float(self.age_checkpoints),
                             "job_age_s": (self.last_seen_ts - started) / 1000.0 if started is not None else None,
                             "checkpoint_interval_ms": self.status.get("checkpoint_interval_ms")}
        checkpointed, fit = self._memoised(("checkpoints", JOB), (self.age_checkpoints, self._limit()),
                                           self._job_checkpoint_features, JOB)
        f.update(checkpointed)
        f.update(self._memoised(("status", JOB), self._status_seq, self._job_status_features, JOB))
        input_rate = self._input_rate()
        f["state_growth_bytes_per_record"] = fit[0] / input_rate if fit and input_rate else None
        cps = self.checkpoints
        latest_e2e = cps[-1][2] if cps else None
        interval, timeout = self.status.get("checkpoint_interval_ms"), self.status.get("checkpoint_timeout_ms")
        f["checkpoint_duration_over_interval"] = latest_e2e / interval if latest_e2e is not None and interval else None
        f["checkpoint_duration_over_timeout"] = latest_e2e / timeout if latest_e2e is not None and timeout else None
        f.update(self._memoised(("timeout", JOB), (self.age_checkpoints, timeout), self._timeout_forecast, JOB))
        for name in ("job_age_s", "checkpoint_interval_ms", "state_growth_bytes_per_record",
                     "checkpoint_duration_over_interval", "checkpoint_duration_over_timeout"):
            if f[name] is not None:
                f[name] = float(f[name])  # the memoised parts are floats already
        return f

    def _job_checkpoint_features(self, _: str) -> tuple[dict[str, float | None], tuple | None]:
        """The job features of its checkpoint history (and the state limit), and the fit of its
        state's size (bytes per second) that the growth per record divides."""
        f: dict[str, Any] = {}
        short = [[e[0], e[1]] for e in self.completed]
        f["state_size_bytes"] = self.completed[-1][1] if self.completed else None
        f["state_rel_slope_per_h"], f["state_r2"] = relative_trend(short)
        f["state_rel_slope_long_per_h"], f["state_r2_long"], f["state_deceleration"] = self._long_trends(JOB)
        f["state_over_prior_max"] = _over(f["state_size_bytes"], self.retired_max.get(JOB))
        f["state_over_plateau"] = _over(f["state_size_bytes"], self.plateau.get(JOB))
        f.update(self._growth_features(JOB, "state_"))
        steps = [b[1] - a[1] for a, b in zip(short, short[1:])]
        f["state_frac_increasing"] = sum(s > 0 for s in steps) / len(steps) if steps else None
        f["checkpointed_rel_slope_per_h"], _ = relative_trend([[e[0], e[2]] for e in self.completed])
        fit = linear_fit([p[0] / 1000.0 for p in short], [p[1] for p in short]) if len(short) >= 3 else None
        limit = self._limit()
        largest = [[e[0], e[4]] for e in self.completed]
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
        f["checkpoint_duration_rel_slope_per_h"], _ = relative_trend([[c[0], c[2]] for c in cps])
        f["persisted_inflight_bytes"] = cps[-1][3] if cps else None
        f["persisted_inflight_rel_slope_per_h"], _ = relative_trend([[c[0], c[3]] for c in cps])
        return _floats(f), fit

    def _timeout_forecast(self, _: str) -> dict[str, float | None]:
        """When completed checkpoints' duration reaches the checkpoint timeout, on its trend."""
        eta = growth.limit_eta(self.durations, self.status.get("checkpoint_timeout_ms"))
        return _floats({"checkpoint_timeout_ms": self.status.get("checkpoint_timeout_ms"),
                        "checkpoint_timeout_eta_s": eta and eta["eta_s"],
                        "checkpoint_timeout_eta_low_s": eta and eta["eta_low_s"],
                        "checkpoint_timeout_eta_high_s": eta and eta["eta_high_s"],
                        "checkpoint_duration_fitted_over_s": eta and eta["fitted_over_s"]})

    def _job_status_features(self, _: str) -> dict[str, float | None]:
        """The job features of its status polls."""
        f: dict[str, Any] = {"checkpoints_in_progress": self.status.get("checkpoints_in_progress")}
        f["restarts_in_window"] = float(self.restarts[-1][1] - min(r[1] for r in self.restarts)) if self.restarts else None
        counts = self.failed_counts
        f["checkpoint_failures_counted"] = float(max(0, counts[-1][1] - counts[0][1])) if counts else None
        f["jm_heap_ratio"] = self.heap[-1][1] if self.heap else None
        f["jm_heap_rel_slope_per_h"], _ = relative_trend(self.heap)
        return _floats(f)

    def _input_rate(self) -> float | None:
        """The job's throughput: the largest total input rate of any vertex (records/s)."""
        totals = []
        for polls in self.polls.values():
            known = _known(polls[-1][7])
            if known:
                totals.append(sum(known))
        return max(totals) if totals else None

    def _vertex_checkpoint_features(self, vid: str) -> tuple[dict[str, float | None], int | None, float]:
        """A vertex's features of the job's checkpoint history (and the state limit); its subtask
        with the most state, and the state's max over mean (0 if unknown) that chooses the hot subtask."""
        f: dict[str, Any] = {}
        short = [[e[0], e[3][vid][0]] for e in self.completed if vid in e[3]]
        f["vertex_state_size_bytes"] = short[-1][1] if short else None
        f["vertex_state_over_prior_max"] = _over(f["vertex_state_size_bytes"], self.retired_max.get(vid))
        f["vertex_state_over_plateau"] = _over(f["vertex_state_size_bytes"], self.plateau.get(vid))
        f["vertex_state_rel_slope_per_h"], f["vertex_state_r2"] = relative_trend(short)
        f.update(self._growth_features(vid, "vertex_state_"))
        (f["vertex_state_rel_slope_long_per_h"], f["vertex_state_r2_long"],
         f["vertex_state_deceleration"]) = self._long_trends(vid)
        limit = self._limit()
        largest = self.completed[-1][3].get(vid, [None, None])[1] if self.completed else None
        f["vertex_limit_ratio"] = largest / limit if limit and largest is not None else None
        detail = self.vertex_checkpoint.get(vid, {})
        f["start_delay_max_ms"] = _max(detail.get("delays", []))
        f["alignment_max_ms"] = _max(detail.get("alignments", []))
        waits = self.barrier_waits.get(vid, [])
        f["start_delay_rel_slope_per_h"], _ = relative_trend([[w[0], w[1]] for w in waits])
        f["alignment_rel_slope_per_h"], _ = relative_trend([[w[0], w[2]] for w in waits])
        f["state_max_over_mean"], f["state_cv"], hot_state = _spread(detail.get("states", []))
        f["state_hot_excess"] = hot_excess(detail.get("states", []))
        delays = [d for d in detail.get("delays", []) if d is not None]
        median = sorted(delays)[len(delays) // 2] if delays else None
        f["start_delay_max_over_median"] = max(delays) / max(median, 1.0) if delays and len(delays) >= 2 else None
        f["state_reported"] = (1.0 if any(s is not None for s in detail.get("states", [])) else 0.0) if detail else None
        return _floats(f), hot_state, f["state_max_over_mean"] or 0.0

    def _poll_features(self, vid: str) -> "PollFeatures":
        """A vertex's features of its metric polls, and what its job's other vertices compare."""
        polls = self.polls.get(vid, [])
        # Each column of the polls at once (this runs for every vertex polled since the last
        # evaluation); the means add the same values in the same order as one by one.
        columns = list(zip(*polls)) if polls else [()] * 8
        f: dict[str, Any] = {"busy_max": _mean(columns[0]), "busy_mean": _mean(columns[1]),
                             "backpressured_max": _mean(columns[2]), "backpressured_mean": _mean(columns[3]),
                             "idle_mean": _mean(columns[4]), "in_pool_max": _mean(columns[5]),
                             "out_pool_max": _mean(columns[6])}
        per_poll = columns[7]
        width = max(map(len, per_poll), default=0)
        if all(len(subtasks) == width for subtasks in per_poll):
            records = [_mean(subtask) for subtask in zip(*per_poll)]
        else:  # the parallelism changed within the window: a subtask missing from a poll counts as unknown
            records = [_mean([subtasks[k] if k < len(subtasks) else None for subtasks in per_poll])
                       for k in range(width)]
        f["records_in_max_over_mean"], f["records_in_cv"], hot_records = _spread(records)
        f["records_in_hot_excess"] = hot_excess(records)
        f["busy_reported"] = (1.0 if polls and polls[-1][0] is not None else 0.0) if polls else None
        compared = f["busy_max"], f["backpressured_mean"], f["backpressured_max"]
        for name in ("busy_max", "busy_mean", "backpressured_max", "backpressured_mean", "idle_mean"):
            if f[name] is not None:
                f[name] = f[name] / 1000.0
        return PollFeatures(_floats(f), *compared, hot_records, f["records_in_max_over_mean"] or 0.0)


class PollFeatures(NamedTuple):
    """A vertex's features of its metric polls, as a feature row holds them (busy and
    backpressured times as fractions of a second), and what its job's other vertices compare."""

    features: dict[str, float | None]
    busy_max: float | None  # ms/s, mean over the polls of the busiest subtask's
    backpressured_mean: float | None  # ms/s
    backpressured_max: float | None  # ms/s
    hot_subtask: int | None  # the subtask with the most input records
    records_skew: float  # their max over mean, 0 if unknown: against the state's, which hot subtask to name


def _floats(features: dict[str, Any]) -> dict[str, float | None]:
    """Feature values as floats (None stays None): what a feature row holds."""
    return {k: (None if v is None else float(v)) for k, v in features.items()}


# The poll features of a vertex never polled (it shows only in checkpoints).
NO_POLLS = PollFeatures(dict.fromkeys(("busy_max", "busy_mean", "backpressured_max", "backpressured_mean", "idle_mean",
                                       "in_pool_max", "out_pool_max", "records_in_max_over_mean", "records_in_cv",
                                       "records_in_hot_excess", "busy_reported")), None, None, None, None, 0.0)
# The vertex features of a job's own row.
NO_VERTEX_FEATURES = dict.fromkeys(VERTEX_FEATURES)


def features_for_events(events: Iterable[dict], idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
                        lateness_ms: int = DEFAULT_LATENESS_MS) -> list[dict]:
    """The batch definition: every job's events, in the order given, through its own state machine."""
    by_job: dict[tuple[str, str], list[dict]] = {}
    for event in events:
        by_job.setdefault((event["cluster"], event["job_id"]), []).append(event)
    rows: list[dict] = []
    for _, job_events in sorted(by_job.items()):
        rows.extend(JobFeatureState().consume_all(job_events, idle_timeout_ms, lateness_ms))
    return rows
