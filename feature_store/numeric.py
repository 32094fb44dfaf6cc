"""Small statistics of the feature computation, pure Python (series of at most a few hundred
points): least-squares fits and relative trends, the long horizon's fits over shared times,
means and maxima that skip unknown values, the spread over subtasks, and the plateau test.

They run for every vertex at every evaluation, so each is written for that: the sums are added in
one pass and in a fixed order (two ways of computing a fit add the same values in the same order,
so the same floats come out), and a sequence with no unknown value is used as it is, not copied.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from feature_store.definitions import FLAT_MAX_GROWTH, FLAT_MAX_SPREAD, FLAT_MIN_POINTS, FLAT_MIN_SPAN_MS


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


def known_values(values: Iterable[float | None]) -> Sequence[float]:
    """``values`` without the unknown ones, in order (the sequence itself when none is unknown)."""
    if type(values) is not list and type(values) is not tuple:
        values = list(values)
    return [v for v in values if v is not None] if None in values else values


def mean_known(values: Iterable[float | None]) -> float | None:
    known = known_values(values)
    return sum(known) / len(known) if known else None


def max_known(values: Iterable[float | None]) -> float | None:
    known = known_values(values)
    return max(known) if known else None


def spread_of(values: Sequence[float | None]) -> tuple[float | None, float | None, int | None]:
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
    known = known_values(values)
    total = sum(known)
    if len(known) < 2 or total <= 0:
        return None
    n = len(known)
    return max(0.0, (max(known) / total - 1.0 / n) / (1.0 - 1.0 / n))


def trailing_span(entries: list, min_points: int, min_span_ms: int) -> list:
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


def ratio_to(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def barrier_wait(delay_max: float | None, alignment_max: float | None) -> float | None:
    """How long a vertex's barrier waited at a checkpoint: its largest start delay plus its largest
    alignment (either alone where the other is unknown; None where both are)."""
    if delay_max is None and alignment_max is None:
        return None
    return (delay_max or 0.0) + (alignment_max or 0.0)
