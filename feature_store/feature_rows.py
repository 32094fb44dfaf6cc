"""The feature rows of one evaluation: the job's row and one per vertex, each block of features
computed from the part of the job's state it reads (the checkpoint history, the status polls,
each vertex's metric polls, the growth window and trajectory, the long horizon), and memoised
until that part changes.

:class:`FeatureRows` is the reading half of :class:`~feature_store.job_features.JobFeatureState`
(which it is mixed into): it reads the state's fields and never changes the history, only the
caches that name what they were computed from. The names of the features are those of
``feature_store/definitions.py``.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, NamedTuple, Sequence

from feature_store import trajectory as growth
from feature_store.definitions import (BARRIER_WAIT_FORECAST_COLUMNS, INPUT_RATE_MIN_SPAN_MS, TIMEOUT_FORECAST_COLUMNS,
                                      VERTEX_FEATURES)
from feature_store.failure_forecast import Cadence, cadence_of, failure_eta
from feature_store.numeric import (
    LongTimes,
    barrier_wait,
    hot_excess,
    known_values,
    linear_fit,
    long_trends,
    max_known,
    mean_known,
    ratio_to,
    relative_trend,
    spread_of,
)

JOB = "job"  # the key of job-level entries in per-vertex maps


class FeatureRows:
    """The features of a :class:`~feature_store.job_features.JobFeatureState` at an evaluation
    point (:meth:`evaluate`), by block."""

    def evaluate(self, ts: int, trigger_kind: str) -> list[dict]:
        base = {"cluster": self.cluster, "job_id": self.job_id, "job_name": self.job_name, "ts": ts,
                "trigger_kind": trigger_kind, "is_late": False, "job_state": self.status.get("state"),
                "last_failure_message": self.last_failure[1] if self.last_failure else None}
        forecast_version = self._forecast_version()
        since_checkpoint_s = self._since_checkpoint_s(ts)
        # The memoised parts are floats already (converted once, when computed, not for every row).
        polled = {vid: self._memoised(("polls", vid), self._poll_seq.get(vid, 0), self._poll_features, vid)
                  for vid in self.polls}
        busiest = max((v for v, p in polled.items() if p.busy_max is not None), key=lambda v: polled[v].busy_max,
                      default=None)
        job = self._job_features(forecast_version, ts, since_checkpoint_s)
        job["busiest_input_over_usual"] = polled[busiest].features["records_in_over_usual"] if busiest else None
        rows = [{**base, "vertex_id": None, "vertex_name": None, **job, **NO_VERTEX_FEATURES}]
        checkpoint_version = (self.age_checkpoints, self._limit())
        for vid in sorted(self.vertex_names):
            # Vertex rows carry the job's features too: a vertex is judged in its job's context.
            checkpointed, hot_state, state_skew = self._memoised(
                ("checkpoints", vid), checkpoint_version, self._vertex_checkpoint_features, vid)
            barrier = self._forecast_at(("barrier", vid), forecast_version, self._barrier_wait_forecast, vid,
                                        BARRIER_WAIT_FORECAST_COLUMNS, ts, since_checkpoint_s)
            polls = polled.get(vid, NO_POLLS)
            others = [p.backpressured_mean for other, p in polled.items()
                      if other != vid and p.backpressured_mean is not None]
            others_max = [p.backpressured_max for other, p in polled.items()
                          if other != vid and p.backpressured_max is not None]
            # The hot subtask: of records or of state, whichever is more skewed (of state if records are unknown).
            hot = polls.hot_subtask if polls.records_skew >= state_skew else hot_state
            hot = hot if hot is not None else hot_state
            rows.append({**base, "vertex_id": vid, "vertex_name": self.vertex_names[vid], **job, **checkpointed, **barrier,
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

    def _job_features(self, forecast_version: tuple, ts: int, since_checkpoint_s: float) -> dict[str, Any]:
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
        f.update(self._forecast_at(("timeout", JOB), forecast_version, self._timeout_forecast, JOB,
                                   TIMEOUT_FORECAST_COLUMNS, ts, since_checkpoint_s))
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
        f["state_over_prior_max"] = ratio_to(f["state_size_bytes"], self.retired_max.get(JOB))
        f["state_over_plateau"] = ratio_to(f["state_size_bytes"], self.plateau.get(JOB))
        f.update(self._growth_features(JOB, "state_"))
        steps = [b[1] - a[1] for a, b in zip(short, short[1:])]
        f["state_frac_increasing"] = sum(s > 0 for s in steps) / len(steps) if steps else None
        f["checkpointed_rel_slope_per_h"], _ = relative_trend([[e[0], e[2]] for e in self.completed])
        fit = linear_fit([p[0] / 1000.0 for p in short], [p[1] for p in short]) if len(short) >= 3 else None
        limit = self._limit()
        largest = [[e[0], e[4]] for e in self.completed]
        current = largest[-1][1] if largest else None
        f["limit_ratio"] = current / limit if limit and current is not None else None
        f["state_limit_bytes"] = limit
        f["limit_eta_s"] = None
        band = None
        if limit and current is not None:
            points = [p for p in largest if p[1] is not None]
            sub_fit = linear_fit([p[0] / 1000.0 for p in points], [p[1] for p in points])
            if current >= limit:
                f["limit_eta_s"] = 0.0
            elif sub_fit and sub_fit[0] > 0:
                f["limit_eta_s"] = (limit - current) / sub_fit[0]
            if f["limit_eta_s"] is not None:
                band = growth.line_eta_band(points, limit)
        f["limit_eta_low_s"] = band and band["eta_low_s"]
        # A checkpoint over the limit fails when it is taken: the first one after the line crosses it.
        interval_s = (self.status.get("checkpoint_interval_ms") or 0) / 1000.0
        latest = band["eta_high_s"] if band else None
        f["limit_eta_high_s"] = None if latest is None else latest + interval_s
        f["limit_fitted_over_s"] = band and band["fitted_over_s"]
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

    def _forecast_version(self) -> tuple:
        """What the timeout forecasts are computed from, besides their series: a new checkpoint,
        another timeout or interval."""
        return self.age_checkpoints, self.status.get("checkpoint_timeout_ms"), self.status.get("checkpoint_interval_ms")

    def _since_checkpoint_s(self, ts: int) -> float:
        """Seconds from the last checkpoint's end (where the timeout forecasts count from) to ``ts``."""
        return max(0.0, (ts - self.checkpoints[-1][0]) / 1000.0) if self.checkpoints else 0.0

    def _cadence(self) -> Cadence | None:
        """The checkpoints' cadence the timeout forecasts step through, once per checkpoint."""
        return self._memoised(("cadence", JOB), self._forecast_version(),
                              lambda _: cadence_of(self.checkpoints, self.status.get("checkpoint_interval_ms")), JOB)

    def _timeout_forecast(self, _: str, in_flight_at_ms: int | None = None) -> tuple[dict, float | None]:
        """When the first checkpoint fails on the trend of completed checkpoints' duration (and
        when the checkpoint triggered next ends on it)."""
        timeout = self.status.get("checkpoint_timeout_ms")
        eta = failure_eta(self.durations, timeout, self._cadence(), in_flight_at_ms)
        columns = _floats({"checkpoint_timeout_ms": timeout, **_forecast_columns(eta, TIMEOUT_FORECAST_COLUMNS)})
        return columns, eta and eta["in_flight_until_s"]

    def _barrier_wait_forecast(self, vid: str, in_flight_at_ms: int | None = None) -> tuple[dict, float | None]:
        """When the first checkpoint fails on the trend of a vertex's barrier wait (largest start
        delay plus largest alignment) over its last checkpoints, completed or failed."""
        waits = [[w[0], barrier_wait(w[1], w[2])] for w in self.barrier_waits.get(vid, [])]
        eta = failure_eta(waits, self.status.get("checkpoint_timeout_ms"), self._cadence(), in_flight_at_ms)
        return _floats(_forecast_columns(eta, BARRIER_WAIT_FORECAST_COLUMNS)), eta and eta["in_flight_until_s"]

    def _forecast_at(self, key: tuple, version: tuple, compute: Callable[..., tuple], argument: str,
                     columns: tuple[str, str, str, str], ts: int, since_s: float) -> dict[str, float | None]:
        """A timeout forecast's columns at ``ts``: made at the last checkpoint's end and counted
        down from it, made again where the checkpoint in flight has run past the end its trend
        gave it (it lasts at least until ``ts``), once for each status poll that still reports it."""
        forecast, in_flight_until_s = self._memoised(key, version, compute, argument)
        if (in_flight_until_s is not None and since_s > in_flight_until_s
                and (self.status.get("checkpoints_in_progress") or 0) >= 1):
            forecast, _ = self._memoised(("in flight", *key), (version, self._status_seq),
                                         lambda _: compute(argument, ts), argument)
        return _aged(forecast, columns, since_s)

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
            known = known_values(polls[-1][7])
            if known:
                totals.append(sum(known))
        return max(totals) if totals else None

    def _vertex_checkpoint_features(self, vid: str) -> tuple[dict[str, float | None], int | None, float]:
        """A vertex's features of the job's checkpoint history (and the state limit); its subtask
        with the most state, and the state's max over mean (0 if unknown) that chooses the hot subtask."""
        f: dict[str, Any] = {}
        short = [[e[0], e[3][vid][0]] for e in self.completed if vid in e[3]]
        f["vertex_state_size_bytes"] = short[-1][1] if short else None
        f["vertex_state_over_prior_max"] = ratio_to(f["vertex_state_size_bytes"], self.retired_max.get(vid))
        f["vertex_state_over_plateau"] = ratio_to(f["vertex_state_size_bytes"], self.plateau.get(vid))
        f["vertex_state_rel_slope_per_h"], f["vertex_state_r2"] = relative_trend(short)
        f.update(self._growth_features(vid, "vertex_state_"))
        (f["vertex_state_rel_slope_long_per_h"], f["vertex_state_r2_long"],
         f["vertex_state_deceleration"]) = self._long_trends(vid)
        limit = self._limit()
        largest = self.completed[-1][3].get(vid, [None, None])[1] if self.completed else None
        f["vertex_limit_ratio"] = largest / limit if limit and largest is not None else None
        detail = self.vertex_checkpoint.get(vid, {})
        f["start_delay_max_ms"] = max_known(detail.get("delays", []))
        f["alignment_max_ms"] = max_known(detail.get("alignments", []))
        waits = self.barrier_waits.get(vid, [])
        f["start_delay_rel_slope_per_h"], _ = relative_trend([[w[0], w[1]] for w in waits])
        f["alignment_rel_slope_per_h"], _ = relative_trend([[w[0], w[2]] for w in waits])
        f["state_max_over_mean"], f["state_cv"], hot_state = spread_of(detail.get("states", []))
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
        f: dict[str, Any] = {"busy_max": mean_known(columns[0]), "busy_mean": mean_known(columns[1]),
                             "backpressured_max": mean_known(columns[2]), "backpressured_mean": mean_known(columns[3]),
                             "idle_mean": mean_known(columns[4]), "in_pool_max": mean_known(columns[5]),
                             "out_pool_max": mean_known(columns[6])}
        per_poll = columns[7]
        width = max(map(len, per_poll), default=0)
        if all(len(subtasks) == width for subtasks in per_poll):
            records = [mean_known(subtask) for subtask in zip(*per_poll)]
        else:  # the parallelism changed within the window: a subtask missing from a poll counts as unknown
            records = [mean_known([subtasks[k] if k < len(subtasks) else None for subtasks in per_poll])
                       for k in range(width)]
        f["records_in_max_over_mean"], f["records_in_cv"], hot_records = spread_of(records)
        f["records_in_hot_excess"] = hot_excess(records)
        f["records_in_over_usual"] = self._over_usual(vid, known_values(records))
        f["busy_reported"] = (1.0 if polls and polls[-1][0] is not None else 0.0) if polls else None
        compared = f["busy_max"], f["backpressured_mean"], f["backpressured_max"]
        for name in ("busy_max", "busy_mean", "backpressured_max", "backpressured_mean", "idle_mean"):
            if f[name] is not None:
                f[name] = f[name] / 1000.0
        return PollFeatures(_floats(f), *compared, hot_records, f["records_in_max_over_mean"] or 0.0)

    def _over_usual(self, vid: str, records: Sequence[float]) -> float | None:
        """The vertex's input rate now (its subtasks' together) over its median of the rate history."""
        rates = self.input_rates.get(vid, [])
        if not records or not rates or rates[-1][0] - rates[0][0] < INPUT_RATE_MIN_SPAN_MS:
            return None
        usual = statistics.median(rate for _, rate in rates)
        return sum(records) / usual if usual > 0 else None

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

    def _growth_features(self, key: str, prefix: str) -> dict[str, float | None]:
        """The growth test and the shape of the growth of the job's state (``key`` JOB) or a vertex's."""
        # The growth window is thinned: checkpoints faster than its spacing leave it as it was.
        window = self.growth_window
        window_stamp = (len(window), window[0][0], window[-1][0]) if window else None
        bounds, opening, recent = self._memoised(("growth", key), window_stamp, self._growth_tests, key)
        # Refitted every few points the history gains (or when it is thinned), not at every checkpoint.
        stamp = [len(self.trajectory) // growth.REFIT_POINTS, self.trajectory_spacing_ms,
                 self.trajectory[0][0] if self.trajectory else None]
        cached = self.trajectory_fits.get(key)
        if cached is None or cached[0] != stamp:
            cached = self.trajectory_fits[key] = [stamp, growth.trajectory_fit(_state_series(self.trajectory, key))]
        fit = cached[1]
        filling = growth.fills_toward_plateau(fit, bounds, recent)
        return {f"{prefix}growth_low_per_h": bounds.low if bounds else None,
                f"{prefix}growth_high_per_h": bounds.high if bounds else None,
                f"{prefix}growth_opening_low_per_h": opening.opening_low if opening else None,
                f"{prefix}recent_growth_low_per_h": recent,
                f"{prefix}filling": (1.0 if filling else 0.0) if fit is not None else None,
                f"{prefix}plateau_bytes": fit["plateau"] if filling else None,
                f"{prefix}plateau_eta_s": fit["plateau_eta_s"] if filling else None}

    def _growth_tests(self, key: str) -> tuple:
        """The growth window's bounds (to hold), its opening bound and the growth since the last
        change of pace, of the job's state (``key`` JOB) or a vertex's."""
        buffered = _state_series(self.growth_window, key)
        # Opening a leak reads the whole buffer (at least OPENING_MIN_POINTS checkpoints); the rest
        # its last two minutes or GROWTH_MIN_POINTS. With checkpoints every few seconds both are the same.
        points = growth.window(buffered, growth.GROWTH_WINDOW_MS, growth.GROWTH_MIN_POINTS)
        bounds = growth.growth_bounds(points)
        opening = bounds if len(points) == len(buffered) else growth.growth_bounds(buffered)
        return bounds, opening, growth.recent_growth_low(points)

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


class PollFeatures(NamedTuple):
    """A vertex's features of its metric polls, as a feature row holds them (busy and
    backpressured times as fractions of a second), and what its job's other vertices compare."""

    features: dict[str, float | None]
    busy_max: float | None  # ms/s, mean over the polls of the busiest subtask's
    backpressured_mean: float | None  # ms/s
    backpressured_max: float | None  # ms/s
    hot_subtask: int | None  # the subtask with the most input records
    records_skew: float  # their max over mean, 0 if unknown: against the state's, which hot subtask to name


def _state_series(entries: list, key: str) -> list:
    """``[[ts, state], ...]`` of the job (``key`` JOB) or a vertex from growth entries ``[ts, total, {vid: state}]``."""
    return [[e[0], e[1] if key == JOB else e[2].get(key)] for e in entries]


def _floats(features: dict[str, Any]) -> dict[str, float | None]:
    """Feature values as floats (None stays None): what a feature row holds."""
    return {k: (None if v is None else float(v)) for k, v in features.items()}


# The poll features of a vertex never polled (it shows only in checkpoints).
NO_POLLS = PollFeatures(dict.fromkeys(("busy_max", "busy_mean", "backpressured_max", "backpressured_mean", "idle_mean",
                                       "in_pool_max", "out_pool_max", "records_in_max_over_mean", "records_in_cv",
                                       "records_in_hot_excess", "records_in_over_usual", "busy_reported")),
                        None, None, None, None, 0.0)
# The vertex features of a job's own row.
NO_VERTEX_FEATURES = dict.fromkeys(VERTEX_FEATURES)


def _aged(forecast: dict[str, float | None], columns: tuple[str, str, str, str], since_s: float) -> dict:
    """A timeout forecast counted from the last checkpoint's end, counted from ``since_s`` later
    (at least 0: the failure is due)."""
    if not since_s or forecast.get(columns[0]) is None:
        return forecast
    return {**forecast, **{c: max(0.0, forecast[c] - since_s) for c in columns[:3] if forecast.get(c) is not None}}


def _forecast_columns(eta: dict | None, columns: tuple[str, str, str, str]) -> dict[str, float | None]:
    """A ``failure_forecast.failure_eta`` forecast (None: none) as its features' columns."""
    return dict(zip(columns, (eta and eta[key] for key in ("eta_s", "eta_low_s", "eta_high_s", "fitted_over_s"))))
