"""When a job's first checkpoint will fail against its timeout: a metric's trend run through the
checkpoints' own cadence.

A trend of checkpoint durations (or of a part of them: the barrier wait) says when the metric
reaches the timeout, but a checkpoint does not fail then. Flink triggers a checkpoint every
interval, or a pause after the last one ended where it ran longer than that (one at a time), and
declares it failed when it expires, the timeout after its trigger. Under backpressure each
checkpoint starts when the last ends, so the durations grow from checkpoint to checkpoint and the
one that fails is seen a whole timeout after it began. :func:`failure_eta` steps through the
coming checkpoints on the trend and returns when the first one expires.

Its band: the trend's slope at the bounds of its 95 % interval (and between them: a steeper trend
can postpone the failure, by one more checkpoint that just completes), and the same points since
the trend's last change of pace read as exponential growth (a line through the log of the
metric), a deepening deficit a line cannot see: its early end where that is sooner. Its late end
allows the JobManager a second to report the expiry.

A checkpoint known to be still in flight past the end its trend gave it lasts at least until then:
the next one starts later, higher on the trend, and the band's late end lets the one in flight
complete as late as just before its own expiry.

Pure functions of ``[(ts_ms, value), ...]`` and a :class:`Cadence`, no I/O.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from feature_store.trajectory import FORECAST_MIN_POINTS, line_fit, recent_trend_since

SLOPE_STEPS = (-1.0, -0.5, 0.0, 0.5, 1.0)  # of the slope's 95 % half-width: where the band is looked for
MAX_STEPS = 200  # coming checkpoints stepped through one by one; beyond, the trend's crossing
LOG_FLOOR = 0.001  # of the limit: the smallest value the exponential reading takes the log of
LATE_TRIGGER, LATE_TRIGGER_MS = 1.05, 50.0  # a trigger this much later than the interval waited for a pause
EXPIRY_REPORTED_WITHIN_MS = 1000.0  # an expired checkpoint's failure is reported this soon (the band's late end)
IN_FLIGHT_MARGIN_MS = 1.0  # a checkpoint in flight completing this close to its own expiry (the band's late end)
SETTLE_ROUNDS = 4  # a checkpoint's duration on a trend read at its own end
# A take-off is a trend from its third point (the bend's own included), one checkpoint sooner than
# a leak's growth test reads it: under backpressure the next checkpoint can be the one that expires.
BEND_MIN_POINTS = 3


class Cadence(NamedTuple):
    """How a job's checkpoints follow each other, in ms: the last one's trigger and end (failed or
    completed), the configured interval, and the shortest pause seen between one's end and the
    next one's trigger."""
    last_trigger_ms: float
    last_end_ms: float
    interval_ms: float
    pause_ms: float


class Trend(NamedTuple):
    """A metric's rising trend in the cadence's time (ms after the last checkpoint end): a line, or
    exponential growth (a line of its log)."""
    level: float  # the value, or its log, at ``origin``
    rate: float  # per ms, > 0
    origin: float
    exponential: bool = False

    def at(self, t: float) -> float:
        x = self.level + self.rate * (t - self.origin)
        return math.exp(min(700.0, x)) if self.exponential else x

    def reaching(self, value: float) -> float:
        """When it reaches ``value``."""
        return self.origin + ((math.log(value) if self.exponential else value) - self.level) / self.rate


def cadence_of(checkpoints: Sequence[Sequence], interval_ms: float | None) -> Cadence | None:
    """The :class:`Cadence` of ``[(end_ts_ms, failed, end_to_end_ms, ...), ...]`` (oldest first;
    an unknown duration taken as none), None without a checkpoint. The pause is seen only where a
    checkpoint was triggered later than the interval after the last (it waited for the last's
    end): else none, Flink's default."""
    timed = [(c[0] - (c[2] or 0.0), c[0]) for c in checkpoints]
    if not timed:
        return None
    interval = float(interval_ms or 0.0)
    late = [b[0] - a[1] for a, b in zip(timed, timed[1:]) if b[0] - a[0] > interval * LATE_TRIGGER + LATE_TRIGGER_MS]
    return Cadence(timed[-1][0], timed[-1][1], interval, max(0.0, min(late)) if late else 0.0)


def failure_eta(points: Sequence[Sequence[float]], limit: float | None, cadence: Cadence | None,
                in_flight_at_ms: float | None = None) -> dict | None:
    """When the first checkpoint fails on the trend since the last change of pace (``recent_trend``)
    of ``points`` (``[(end_ts_ms, value_ms), ...]``, each checkpoint's metric at its end) against
    ``limit`` (the timeout, ms): ``{"eta_s", "eta_low_s", "eta_high_s", "fitted_over_s",
    "in_flight_until_s"}``, seconds from the cadence's last checkpoint end to the expiry of the
    first checkpoint whose metric reaches the limit; the latest None where the trend may not rise
    at all; and when the checkpoint triggered next ends on the trend. ``in_flight_at_ms``: a time
    at which that checkpoint is known to be still in flight, so it lasts at least until then
    (:func:`_first_expiry`). None without a limit, a cadence, enough points or a rising trend."""
    pts = [(p[0], p[1]) for p in points if p[1] is not None]
    if not limit or cadence is None or len(pts) < FORECAST_MIN_POINTS:
        return None
    found = recent_trend_since(pts, BEND_MIN_POINTS)
    if found is None:
        return None
    (slope, half, now, _), first = found
    if slope <= 0:
        return None
    origin = pts[-1][0] - cadence.last_end_ms  # the trend's t = 0, in the cadence's time
    running = None if in_flight_at_ms is None else in_flight_at_ms - cadence.last_end_ms
    linear = [_first_expiry(Trend(now, (slope + step * half) / 1000.0, origin), limit, cadence, running)
              if slope + step * half > 0 else None for step in SLOPE_STEPS]
    eta = linear[SLOPE_STEPS.index(0.0)]
    bounded = [e for e in linear if e is not None]
    low = min(e[0] for e in bounded)
    since = pts[first:]  # the same points since the last change of pace, read as exponential growth
    t = (np.array([p[0] for p in since], dtype="float64") - pts[-1][0]) / 1000.0
    logs = line_fit(t, np.log(np.maximum([p[1] for p in since], limit * LOG_FLOOR)))
    if logs[0] + logs[1] > 0:
        steep = _first_expiry(Trend(logs[2], (logs[0] + logs[1]) / 1000.0, origin, exponential=True), limit, cadence,
                              running)
        low = min(low, steep[0])
    high = None if len(bounded) < len(linear) else max(e[0] for e in bounded)
    just_completing = _next_trigger(cadence) + limit - IN_FLIGHT_MARGIN_MS
    if high is not None and running is not None and eta[1] <= running < just_completing:
        # The checkpoint in flight has outrun the trend, which no longer says when it ends: it may
        # still complete until its own expiry, and the next one then starts that much later.
        high = max(high, _first_expiry(Trend(now, (slope + SLOPE_STEPS[0] * half) / 1000.0, origin), limit, cadence,
                                       just_completing)[0])
    high = None if high is None else high + EXPIRY_REPORTED_WITHIN_MS
    return {"eta_s": eta[0] / 1000.0, "eta_low_s": low / 1000.0, "eta_high_s": None if high is None else high / 1000.0,
            "fitted_over_s": (pts[-1][0] - pts[0][0]) / 1000.0, "in_flight_until_s": eta[1] / 1000.0}


def _first_expiry(trend: Trend, limit: float, cadence: Cadence, running: float | None = None) -> tuple[float, float]:
    """The expiry (ms after the last end) of the first coming checkpoint whose metric, on
    ``trend`` at its end, reaches ``limit``, and the end of the checkpoint triggered next. While
    checkpoints fit in their interval they come on it, so the first that outgrows it (or fails)
    is found from the trend's crossing; from there, trigger by trigger (the trend's crossing again
    where more than :data:`MAX_STEPS` of them are ahead). A checkpoint known to be in flight at
    ``running`` (ms after the last end) lasts at least until then: one slower than its trend
    delays the next trigger, or expires itself."""
    trigger = _next_trigger(cadence)
    duration = _settled(trend, trigger, limit)
    in_flight = running is not None and running > trigger
    if in_flight:
        duration = max(duration, running - trigger)
    first_end = trigger + min(duration, limit)
    if duration >= limit:
        return trigger + limit, first_end
    if in_flight:
        following = max(trigger + cadence.interval_ms, first_end + cadence.pause_ms)
        return _expiry_from(trend, limit, cadence, following), first_end
    return _expiry_from(trend, limit, cadence, trigger, duration), first_end


def _next_trigger(cadence: Cadence) -> float:
    """When the checkpoint after the last is triggered, ms after the last end."""
    return max(cadence.last_trigger_ms - cadence.last_end_ms + cadence.interval_ms, cadence.pause_ms)


def _expiry_from(trend: Trend, limit: float, cadence: Cadence, trigger: float,
                 duration: float | None = None) -> float:
    """:func:`_first_expiry`'s answer from the checkpoint triggered at ``trigger`` on (taking
    ``duration`` on the trend, where the caller has it)."""
    on_interval = min(limit, cadence.interval_ms - cadence.pause_ms)  # the longest a checkpoint on the interval takes
    if duration is None:
        duration = _settled(trend, trigger, limit)
    if on_interval > 0 and duration < on_interval:
        # A checkpoint triggered at T takes at least d where the metric reaches d by T + d.
        behind = trend.reaching(on_interval) - on_interval - trigger
        trigger += max(0.0, math.ceil(behind / cadence.interval_ms)) * cadence.interval_ms
    previous = None
    for _ in range(MAX_STEPS):
        duration = _settled(trend, trigger, limit)
        if duration >= limit:
            return trigger + limit
        # Back to back, durations grow by a factor a checkpoint: too many ahead to step through.
        if previous and (duration <= previous or math.log(limit / duration) > MAX_STEPS * math.log(duration / previous)):
            break
        previous, trigger = duration, max(trigger + cadence.interval_ms, trigger + duration + cadence.pause_ms)
    return max(trigger, trend.reaching(limit) - limit) + limit


def _settled(trend: Trend, trigger: float, limit: float) -> float:
    """The duration of a checkpoint triggered at ``trigger`` on a trend read at its end: ``d =
    trend(trigger + d)``; ``limit`` where the metric outgrows the time it takes. On a line that is
    ``trend(trigger) / (1 - rate)``; an exponential is iterated from below with Aitken's
    extrapolation of the steps."""
    duration = max(0.0, trend.at(trigger))
    if not trend.exponential:
        if duration <= 0.0 or duration >= limit:
            return duration
        if trend.rate >= 1.0:
            return limit
        return duration / (1.0 - trend.rate)
    for _ in range(SETTLE_ROUNDS):
        if duration >= limit:
            return duration
        first = max(0.0, trend.at(trigger + duration))
        second = max(0.0, trend.at(trigger + first))
        step, following = first - duration, second - first
        if abs(following) <= 1e-6 * limit:
            return second
        if step <= 0 or following >= step:
            return limit if following >= step > 0 else second
        duration = second + following * following / (step - following)
    return duration
