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
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from typing import Iterable, Sequence

import orjson

from feature_store import trajectory as growth
from feature_store.definitions import (
    FAILURE_COUNT_WINDOW_MS,
    FLAT_MIN_POINTS,
    FLAT_MIN_SPAN_MS,
    HEAP_POLLS,
    INPUT_RATE_SPACING_MS,
    INPUT_RATE_WINDOW_MS,
    LONG_WINDOW_MS,
    METRIC_POLLS_AVERAGED,
    RESTART_WINDOW_MS,
    SHORT_WINDOW_CHECKPOINTS,
)
from feature_store.event_order import (
    CLOCK_OF_KIND,
    DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_LATENESS_MS,
    LATE,
    OUT_OF_ORDER,
    RECENT_CHECKPOINT_IDS,
    TERMINAL_STATES,
    stream_position,
)
from feature_store.feature_rows import JOB, FeatureRows
from feature_store.numeric import LongTimes, is_flat, known_values, max_known, mean_known, trailing_span

# Checkpoints a stopping job aborts (cancel, suspend, failover of the JobManager): not a failure
# of the job's checkpointing, so they are not counted as one.
STOPPING_FAILURES = ("Coordinator is suspending", "is shutting down", "Job is cancelling", "job has been cancelled")
LONG_BUFFER_POINTS = 240


def _censored_delays(subtasks: Sequence[dict], delays: list, duration_ms: float | None) -> list:
    """A failed checkpoint's start delays: a subtask that never acknowledged it had not taken its
    barrier when it failed, so it waited at least the checkpoint's duration. Unknown, a bottleneck
    whose checkpoints all expire would read as one that was never waited on."""
    if duration_ms is None:
        return delays
    return [duration_ms if delay is None and sub.get("end_to_end_duration_ms") is None else delay
            for sub, delay in zip(subtasks, delays)]


def barrier_delays(subtasks: Sequence[dict], failed: bool, duration_ms: float | None) -> tuple[list, list]:
    """A vertex's subtasks' start delays (censored on a failed checkpoint) and alignments."""
    delays = [s.get("start_delay_ms") for s in subtasks]
    if failed:
        delays = _censored_delays(subtasks, delays, duration_ms)
    return delays, [s.get("alignment_duration_ms") for s in subtasks]


@dataclass
class JobFeatureState(FeatureRows):
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
    input_rates: dict = field(default_factory=dict)  # vid: [[ts, records in/s of all subtasks], ...], thinned
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
    # The growth test's window (growth.GROWTH_WINDOW_MS, or the last OPENING_MIN_POINTS checkpoints
    # if they come slower: the opening bound's; holding reads its last GROWTH_MIN_POINTS), thinned:
    # [ts, total, {vid: state}].
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
            max_known(busy), mean_known(busy), max_known(backpressured), mean_known(backpressured),
            mean_known([s.get("idle_time_ms_per_s") for s in subs]), max_known([s.get("in_pool_usage") for s in subs]),
            max_known([s.get("out_pool_usage") for s in subs]), [s.get("records_in_per_s") for s in subs],
        ]
        history = self.polls.setdefault(vid, [])
        history.append(entry)
        del history[:-METRIC_POLLS_AVERAGED]
        known = known_values(entry[7])
        if known:
            ts, rates = int(event["ts"]), self.input_rates.setdefault(vid, [])
            if not rates or ts - rates[-1][0] >= INPUT_RATE_SPACING_MS:
                rates.append([ts, sum(known)])
            while rates[0][0] < ts - INPUT_RATE_WINDOW_MS:
                del rates[0]
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
            delays, alignments = barrier_delays(subs, failed, event.get("end_to_end_duration_ms"))
            self.vertex_checkpoint[vid] = {
                "states": states if not failed else self.vertex_checkpoint.get(vid, {}).get("states", []),
                "delays": delays, "alignments": alignments,
            }
            if subs:
                series = self.barrier_waits.setdefault(vid, [])
                series.append([ts, max_known(delays), max_known(self.vertex_checkpoint[vid]["alignments"])])
                del series[:-SHORT_WINDOW_CHECKPOINTS]
            if not failed:
                per_vertex[vid] = [vertex.get("state_size_bytes"), max_known(states)]
        if failed:
            return
        entry = [ts, event["state_size_bytes"], event["checkpointed_size_bytes"], per_vertex,
                 max_known(sizes[1] for sizes in per_vertex.values())]
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
        window = trailing_span(source, FLAT_MIN_POINTS, FLAT_MIN_SPAN_MS)
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
        del window[:min(keep, max(0, len(window) - growth.OPENING_MIN_POINTS))]
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