"""A state's trajectory: how fast it grows now, with what confidence, and where it levels off.

Two questions a leak detector must answer without being fooled by noise:

* **Does the state still grow?** :func:`growth_bounds` fits a line to the state over a window of
  *time* (:data:`GROWTH_WINDOW_MS`, extended to :data:`GROWTH_MIN_POINTS` checkpoints when they
  come slower than that), so it means the same at a 200 ms and a 60 s interval, and returns the
  relative slope with its confidence bounds: 95 % to hold an open leak, also 99.9 % to open one
  (asked at every checkpoint, a 95 % bound reads a flat state as growing about once an hour),
  that one over at least :data:`OPENING_MIN_POINTS` checkpoints (a strict quantile on few points
  would hold a real leak back for minutes). Checkpoint sizes wobble with the input and with
  RocksDB's flushes, and consecutive wobbles are alike, so the slope's standard error is widened
  by the residuals' lag-1 autocorrelation (fewer independent points than checkpoints). A flat
  state's wiggle gives bounds around zero; a slow leak's bounds sit above zero once the window
  has seen enough of it.
* **What shape is the growth?** :func:`trajectory_fit` compares, over the job's history, a line
  with growth that decelerates toward an asymptote (``A - B exp(-t / tau)``: a bounded key space
  filling, windows filling, TTLs beginning to expire). When the saturating curve explains the
  data far better than the line, has bent within the data, and leaves no significant linear
  growth beside it (``a + c t - B exp(-t / tau)``: a slow leak on top of a warm-up), the state
  is filling toward ``A``: it says where it levels off and when.

Pure functions of ``[(ts_ms, value), ...]``, no I/O: plain Python over the few dozen points of
the growth window, numpy for the history's curve fits.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Sequence

import numpy as np

GROWTH_WINDOW_MS = 120_000  # "still growing": the slope over the last two minutes
RECENT_MIN_SPAN_MS = 15_000  # growth since its last change of pace, over at least this long
GROWTH_MIN_POINTS = 10  # the window reaches back at least this many checkpoints (a 60 s interval: ten minutes)
OPENING_MIN_POINTS = 20  # and to open a leak, at least this many (a 10 s interval: 200 s)
RECENT_MIN_POINTS = 4
WINDOW_POINTS = 40  # the growth window's buffer is thinned to about this many points
TRAJECTORY_POINTS = 64  # the history's buffer: thinned by halves to at most this many points
TRAJECTORY_MIN_POINTS = 12
REFIT_POINTS = 4  # the history's curve is fitted again after this many new points
FORECAST_WINDOW_MS = 300_000  # a metric's trend toward its limit: the last five minutes
FORECAST_MIN_POINTS = 10  # and at least this many points of it
TRAJECTORY_MIN_SPAN_MS = 120_000
# Saturating curves tried, as fractions of the history's span: up to one and a half spans, a fill
# seen for a fraction of its time constant already bends measurably; beyond, it is a line.
TAU_FRACTIONS = np.geomspace(0.03, 1.5, 32)
SATURATING_SSE_RATIO = 0.5  # the curve must leave at most half the line's squared error
PLATEAU_WITHIN = 0.01  # "levelled off": within 1 % of the asymptote
# Linear growth beside the curve that makes it a leak after all: the leak rule's minimum growth.
LINEAR_BESIDE_PER_H = 0.05
CURVE_GROWTH_FACTOR = 1.5  # a fill's growth now is the curve's within this factor either way (or 5 %/h)
BESIDE_SHARE = 0.5  # of the curve's growth now
FINE_TAUS = 25  # the time constants tried between the grid's neighbours of its best
NOISE_FLOOR = 0.002  # of the state's mean, for the curve's fits
BEND_NOISE_FLOOR = 0.0002  # and for the bend's: a stop is a sharp feature of a few points
MIN_AUTOCORRELATION, MAX_AUTOCORRELATION = 0.0, 0.9
# Two-sided 95 % quantiles of Student's t by degrees of freedom (2.0 beyond the table).
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
        12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}
# Two-sided 99.9 % quantiles (3.29 beyond the table): the bound a leak opens on. The test is asked
# at every checkpoint, some thirty independent two-minute windows a job-hour: a one-sided 2.5 % error
# is a flat state read as growing about once an hour, 0.05 % about once in seventy job-hours.
_T999 = {1: 636.6, 2: 31.60, 3: 12.92, 4: 8.61, 5: 6.87, 6: 5.96, 7: 5.41, 8: 5.04, 9: 4.78, 10: 4.59,
         12: 4.32, 15: 4.07, 20: 3.85, 30: 3.65, 40: 3.55, 60: 3.46, 120: 3.37}


def _t_quantile(table: dict[int, float], beyond: float, dof: int) -> float:
    """The table's quantile for ``dof`` degrees of freedom: its entry at or below it (conservative
    between entries), ``beyond`` past its last."""
    if dof <= 0:
        return math.inf
    if dof > max(table):
        return beyond
    return table[max(d for d in table if d <= dof)]


@functools.cache
def t95(dof: int) -> float:
    """Student's t two-sided 95 % quantile for ``dof`` degrees of freedom."""
    return _t_quantile(_T95, 2.0, dof)


@functools.cache
def t999(dof: int) -> float:
    """Student's t two-sided 99.9 % quantile for ``dof`` degrees of freedom."""
    return _t_quantile(_T999, 3.29, dof)


class GrowthBounds(NamedTuple):
    """A window's relative slope per hour with its bounds: 95 % (``low``, ``high``) and the
    99.9 % lower bound (``opening_low``)."""
    slope: float
    low: float
    high: float
    opening_low: float


def window(points: Sequence[Sequence[float]], span_ms: float, min_points: int) -> list:
    """The trailing points covering ``span_ms`` of time, or the last ``min_points`` if that is more."""
    if not points:
        return []
    start = points[-1][0] - span_ms
    first = len(points)
    while first > 0 and points[first - 1][0] >= start:
        first -= 1
    return list(points[min(first, max(0, len(points) - min_points)):])


def growth_bounds(points: Sequence[Sequence[float]]) -> GrowthBounds | None:
    """The least-squares slope of ``points`` (``[(ts_ms, value), ...]``, None values skipped) per
    hour relative to their mean, with its 95 % confidence bounds and its 99.9 % lower bound, the
    standard error widened for autocorrelated residuals; None with fewer than three points, no
    spread in time or a mean that is not positive."""
    xs, ys = [], []
    for point in points:
        if point[1] is not None:
            xs.append(point[0] / 3_600_000.0)
            ys.append(float(point[1]))
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    if my <= 0:
        return None
    sxx = sxy = 0.0
    for x, y in zip(xs, ys):
        sxx += (x - mx) * (x - mx)
        sxy += (x - mx) * (y - my)
    if sxx <= 0:
        return None
    slope = sxy / sxx
    residuals = [y - my - slope * (x - mx) for x, y in zip(xs, ys)]
    rss = sum(r * r for r in residuals)
    lag = sum(a * b for a, b in zip(residuals, residuals[1:]))
    rho = min(MAX_AUTOCORRELATION, max(MIN_AUTOCORRELATION, lag / rss)) if rss > 0 else 0.0
    se = math.sqrt(rss / (n - 2) / sxx * (1 + rho) / (1 - rho)) if n > 2 else math.inf
    half = t95(n - 2) * se
    return GrowthBounds(slope / my, (slope - half) / my, (slope + half) / my, (slope - t999(n - 2) * se) / my)


class _CentredLine(NamedTuple):
    """A least-squares line through ``(t, y)`` about the means: what its fit and its residuals are."""
    t_mean: float
    y_mean: float
    tc: np.ndarray  # the times less their mean
    sxx: float
    slope: float
    residuals: np.ndarray
    rss: float


def _centred_line(t: np.ndarray, y: np.ndarray) -> _CentredLine:
    n = len(t)
    t_mean, y_mean = t.sum() / n, y.sum() / n  # what .mean() computes, without its overhead on a few points
    tc, yc = t - t_mean, y - y_mean
    sxx = float(tc @ tc)
    slope = float(tc @ yc) / sxx
    r = yc - slope * tc
    return _CentredLine(t_mean, y_mean, tc, sxx, slope, r, float(r @ r))


def _autocorrelation(residuals: np.ndarray, rss: float) -> float:
    """The residuals' lag-1 autocorrelation, clipped to what the standard errors are widened by."""
    if rss <= 0:
        return 0.0
    return min(MAX_AUTOCORRELATION, max(MIN_AUTOCORRELATION, float(residuals[1:] @ residuals[:-1]) / rss))


def _line_trend(line: _CentredLine, n: int) -> tuple[float, float, float, int]:
    rho = _autocorrelation(line.residuals, line.rss)
    half = t95(n - 2) * math.sqrt(line.rss / (n - 2) / line.sxx * (1 + rho) / (1 - rho)) if n > 2 else math.inf
    return line.slope, half, float(line.y_mean - line.slope * line.t_mean), n


def line_fit(t: np.ndarray, y: np.ndarray) -> tuple[float, float, float, int]:
    """``(slope, half_width, value_at_0, n)`` of the least-squares line through ``(t, y)`` (``t``
    in seconds, 0 at the last point), the 95 % half-width of its slope widened for
    autocorrelated residuals."""
    return _line_trend(_centred_line(t, y), len(t))


def recent_trend(points: Sequence[Sequence[float]]) -> tuple[float, float, float, int] | None:
    """The trend *since the last change of pace* of ``points`` (:func:`recent_trend_since`)."""
    found = recent_trend_since(points)
    return None if found is None else found[0]


def recent_trend_since(points: Sequence[Sequence[float]], min_points: int = RECENT_MIN_POINTS,
                       ) -> tuple[tuple[float, float, float, int], int] | None:
    """The trend *since the last change of pace* of ``points`` (``[(ts_ms, value), ...]``), and
    the index (among the points with a value) of the first point after the bend, 0 without one:
    ``((slope, half_width, value_now, n), first)``, per second, with the 95 % half-width of the slope
    (widened for autocorrelated residuals) and the fitted value at the last point. A line with a
    bend (a hinge) is fitted, the bend anywhere that leaves at least :data:`RECENT_MIN_SPAN_MS`
    and ``min_points`` from it on (the bend's own included); where the bend explains the data
    better than a straight line (an F-test), the segment after it is the trend, else the whole
    line. A metric that grew and then stopped (or took off) reads as such a few points after, not
    once the window has forgotten its past."""
    pts = [(p[0], p[1]) for p in points if p[1] is not None]
    n = len(pts)
    if n < 3 or pts[-1][0] <= pts[0][0]:
        return None
    first = pts[0][1]
    if all(p[1] == first for p in pts):
        return (0.0, 0.0, float(first), n), 0  # a constant (a barrier that never waits): flat, exactly
    t = (np.array([p[0] for p in pts], dtype="float64") - pts[-1][0]) / 1000.0  # 0 at the last: well conditioned
    y = np.array([p[1] for p in pts], dtype="float64")

    line = _centred_line(t, y)
    # The bends: every point from the second on whose time leaves the minimum span after it (times ascend).
    end = min(int(np.searchsorted(t, t[-1] - RECENT_MIN_SPAN_MS / 1000.0, side="right")), n - min_points + 1)
    if n < 6 or end <= 1:
        return _line_trend(line, n), 0
    # y = a + s t + d max(t - t_b, 0) for every bend at once: by Frisch-Waugh, the hinge's share of
    # the line's residuals is (h.r)^2 / |h|^2, h the hinge less its own fit on the line; the bend
    # that explains most is fitted alone.
    after = np.maximum(t[None, :] - t[1:end, None], 0.0)  # bends x points
    after_sum, after_t, after_squares = after.sum(axis=1), after @ t, (after * after).sum(axis=1)
    after_tc = after_t - after_sum * line.t_mean  # the hinges' products with the centred times
    spread = after_squares - after_sum * after_sum / n - after_tc * after_tc / line.sxx
    explained = np.divide((after @ line.residuals) ** 2, spread, out=np.zeros_like(spread), where=spread > 0)
    i = int(np.argmax(explained))
    if spread[i] <= 0:
        return _line_trend(line, n), 0
    # The hinge about its mean: the fit's intercept is the mean, and its slope and the hinge's step
    # solve the centred 2 x 2 normal equations (better conditioned than the raw 3 x 3 ones).
    b, hinge_mean = i + 1, float(after_sum[i]) / n
    hinge = after[i] - hinge_mean
    cross, squares = float(after_tc[i]), float(hinge @ hinge)
    det = line.sxx * squares - cross * cross
    if det <= 0:
        return _line_trend(line, n), 0
    ty, hy = float(line.tc @ y), float(hinge @ y)
    before, step = (squares * ty - cross * hy) / det, (line.sxx * hy - cross * ty) / det
    r = (y - line.y_mean) - before * line.tc - step * hinge
    rss = float(r @ r)
    floor = n * (BEND_NOISE_FLOOR * (float(np.abs(y).sum()) / n)) ** 2
    if line.rss <= max(rss, floor) * (1.0 + t95(n - 3) ** 2 / (n - 3)):
        return _line_trend(line, n), 0  # no bend the data insist on: the whole window's line
    # The slope after the bend is before + step; its variance from the covariance of both.
    tail = r[b:]
    rho = _autocorrelation(tail, float(tail @ tail))
    variance = (squares + line.sxx - 2 * cross) / det * max(rss, floor) / (n - 3) * (1 + rho) / (1 - rho)
    slope = before + step
    # The fit at t = 0 (the last point), past the bend.
    now = float(line.y_mean - before * line.t_mean + step * (-float(t[b]) - hinge_mean))
    return (slope, t95(n - 3) * math.sqrt(max(variance, 0.0)), now, n), b


def recent_growth_low(points: Sequence[Sequence[float]]) -> float | None:
    """The lower 95 % bound of the state's growth since its last change of pace
    (:func:`recent_trend`), per hour relative to the window's mean: above 0 while it still grows."""
    trend = recent_trend(points)
    values = [p[1] for p in points if p[1] is not None]
    mean = sum(values) / len(values) if values else 0.0
    if trend is None or mean <= 0:
        return None
    slope, half, _, _ = trend
    return (slope - half) * 3600.0 / mean


def _best_tau(t: np.ndarray, y: np.ndarray, span: float) -> tuple[float, float, float, float]:
    """(tau, A, B, rss) of the best ``y = A + B exp(-t / tau)`` over the grid of time constants,
    every one fitted at once (closed-form least squares per column)."""
    taus = TAU_FRACTIONS * span
    x = np.exp(-t[:, None] / taus[None, :])
    dx = x - x.mean(axis=0)
    dy = y - y.mean()
    sxx = (dx * dx).sum(axis=0)
    b = np.divide(dx.T @ dy, sxx, out=np.zeros_like(sxx), where=sxx > 0)
    a = y.mean() - b * x.mean(axis=0)
    rss = ((y[:, None] - a[None, :] - b[None, :] * x) ** 2).sum(axis=0)
    i = int(np.argmin(rss))
    return float(taus[i]), float(a[i]), float(b[i]), float(rss[i])


def trajectory_fit(points: Sequence[Sequence[float]]) -> dict | None:
    """The shape of the growth over ``points`` (``[(ts_ms, value), ...]`` since the job started,
    thinned): ``{"saturating": bool, "plateau": A, "plateau_eta_s": seconds until within
    :data:`PLATEAU_WITHIN` of it from the last point, "curve_growth_per_h": the curve's relative
    growth in the middle of the growth window}`` (None but ``saturating`` unless it saturates); None with too short
    a history. Whether the state's growth *now* agrees with the curve is the caller's to check
    (:func:`fills_toward_plateau`).""" 
    pts = [(p[0], p[1]) for p in points if p[1] is not None]
    if len(pts) < TRAJECTORY_MIN_POINTS or pts[-1][0] - pts[0][0] < TRAJECTORY_MIN_SPAN_MS:
        return None
    t = (np.array([p[0] for p in pts], dtype="float64") - pts[0][0]) / 1000.0
    y = np.array([p[1] for p in pts], dtype="float64")
    n, span, mean = len(t), float(t[-1]), float(y.mean())
    not_saturating = {"saturating": False, "plateau": None, "plateau_eta_s": None, "curve_growth_per_h": None}
    if mean <= 0 or float(y.max() - y.min()) <= 0:
        return not_saturating
    line = np.polyfit(t, y, 1)
    line_rss = float(((y - np.polyval(line, t)) ** 2).sum())
    tau, plateau, amplitude, rss = _best_tau(t, y, span)
    rising = amplitude < 0 and plateau > 0  # A - |B| exp(-t/tau): filling toward A
    if not (rising and rss <= SATURATING_SSE_RATIO * line_rss):
        return not_saturating
    # Linear growth beside the curve makes it a leak once it is a real part of the growth now:
    # a fill's own small misfits (a hash table doubling its buckets) are absorbed by it too.
    curve_slope_now = -amplitude / tau * math.exp(-span / tau)
    if _linear_growth_beside(t, y, span, max(LINEAR_BESIDE_PER_H * mean / 3600.0, BESIDE_SHARE * curve_slope_now)):
        return not_saturating
    # The curve reaches within PLATEAU_WITHIN of A at tau * ln(|B| / (PLATEAU_WITHIN * A)).
    reach = tau * math.log(max(abs(amplitude) / (PLATEAU_WITHIN * plateau), 1.0))
    # The curve's growth where the growth window's slope applies (its middle): decelerating
    # growth is faster there than at the last point.
    at = max(0.0, span - GROWTH_WINDOW_MS / 2000.0)
    level = plateau + amplitude * math.exp(-at / tau)
    growth_now = -amplitude / tau * math.exp(-at / tau) * 3600.0 / level if level > 0 else math.inf
    return {"saturating": True, "plateau": plateau, "plateau_eta_s": max(0.0, reach - span),
            "curve_growth_per_h": growth_now}


def fills_toward_plateau(fit: dict | None, growth: GrowthBounds | None, recent_low: float | None = None) -> bool:
    """Whether the state is filling toward the curve's plateau: the history saturates and the
    growth now (:func:`growth_bounds` over the recent window) is what the curve says. Not
    certainly faster (at most half as fast again, or 5 %/h more): a leak outgrowing a fill. Nor,
    while it still grows at a pace it has held since its last change of pace (``recent_low``,
    :func:`recent_growth_low`, above zero), certainly slower (the curve's growth more than half
    as fast again as the window's upper bound and 5 %/h more): the curve bent through a kink, a
    TTL warm-up's end, that a slow leak goes on after at its own pace. A fill slows down with
    its curve; after a kink into a plateau the state stops growing."""
    if not fit or not fit["saturating"]:
        return False
    if growth is None:
        return True
    expected = fit["curve_growth_per_h"]
    if growth.low > max(CURVE_GROWTH_FACTOR * expected, expected + LINEAR_BESIDE_PER_H):
        return False
    steady = recent_low is not None and recent_low > 0.0 and growth.low >= LINEAR_BESIDE_PER_H
    return not (steady and growth.high < expected / CURVE_GROWTH_FACTOR - LINEAR_BESIDE_PER_H)


def _with_line(t: np.ndarray, y: np.ndarray, taus: np.ndarray, mean: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(rss, lower bound of c) of ``a + c t + b exp(-t / tau)`` for every ``tau`` at once; the
    bound at 95 % with its error widened for autocorrelated residuals."""
    n = len(t)
    x = np.exp(-t[:, None] / taus[None, :])  # n x k
    k = len(taus)
    normal = np.empty((k, 3, 3))
    normal[:, 0, 0], normal[:, 0, 1], normal[:, 1, 1] = n, t.sum(), t @ t
    normal[:, 0, 2], normal[:, 1, 2], normal[:, 2, 2] = x.sum(axis=0), t @ x, (x * x).sum(axis=0)
    normal[:, 1, 0], normal[:, 2, 0], normal[:, 2, 1] = normal[:, 0, 1], normal[:, 0, 2], normal[:, 1, 2]
    rhs = np.stack([np.full(k, y.sum()), np.full(k, t @ y), y @ x], axis=1)
    try:
        beta = np.linalg.solve(normal, rhs[:, :, None])[:, :, 0]  # k x 3
        inverse_cc = np.linalg.inv(normal)[:, 1, 1]
    except np.linalg.LinAlgError:
        return None
    residuals = y[:, None] - beta[:, 0][None, :] - beta[:, 1][None, :] * t[:, None] - beta[:, 2][None, :] * x
    # Checkpoint sizes are never exact to better than a fraction of a per cent (keys arrive at
    # random, serialisation pads): below that floor a residual says nothing about the model.
    rss = np.maximum((residuals * residuals).sum(axis=0), n * (NOISE_FLOOR * mean) ** 2)
    lag = (residuals[1:] * residuals[:-1]).sum(axis=0)
    rho = np.clip(np.divide(lag, rss, out=np.zeros_like(rss), where=rss > 0), MIN_AUTOCORRELATION, MAX_AUTOCORRELATION)
    se = np.sqrt(np.maximum(rss / (n - 3) * inverse_cc * (1 + rho) / (1 - rho), 0.0))
    return rss, beta[:, 1] - t95(n - 3) * se


def _linear_growth_beside(t: np.ndarray, y: np.ndarray, span: float, minimum: float) -> bool:
    """Whether ``a + c t + b exp(-t / tau)`` has a linear growth ``c`` above ``minimum`` (per
    second) with 95 % confidence for every plausible ``tau``
    (those whose fit is within an F-test's reach of the best: F(1, n - 3)'s 95 % point is
    t95(n - 3) squared), ``tau`` searched on the grid and then finely around its best: ``c``
    trades off against ``tau``, so a coarse grid would read a ``tau`` slightly off as growth.
    A slow leak on top of a warm-up that levels off, which the saturating curve alone hides."""
    n = len(t)
    if n <= 5:
        return False
    mean = float(y.mean())
    coarse = TAU_FRACTIONS * span
    found = _with_line(t, y, coarse, mean)
    if found is None:
        return False
    i = int(np.argmin(found[0]))
    fine = np.geomspace(coarse[max(i - 1, 0)], coarse[min(i + 1, len(coarse) - 1)], FINE_TAUS)
    refined = _with_line(t, y, fine, mean)
    if refined is None:
        return False
    rss = np.r_[found[0], refined[0]]
    lower = np.r_[found[1], refined[1]]
    plausible = rss <= rss.min() * (1.0 + t95(n - 3) ** 2 / (n - 3))
    return bool((lower[plausible] > minimum).all())


def line_eta_band(points: Sequence[Sequence[float]], limit: float | None) -> dict | None:
    """The 95 % band of a straight line's ETA: when the last value of ``points`` (``[(ts_ms,
    value), ...]``) reaches ``limit`` on the least-squares line through all of them at its
    steepest and at its flattest slope (the line's own ETA is ``(limit - last) / slope``):
    ``{"eta_low_s", "eta_high_s", "fitted_over_s"}``, the latest None where the line may not rise
    at all, both 0 once the last value is at the limit; None without a limit, three points, a
    spread in time or a rising line."""
    pts = [(p[0], p[1]) for p in points if p[1] is not None]
    if not limit or len(pts) < 3:
        return None
    t = (np.array([p[0] for p in pts], dtype="float64") - pts[-1][0]) / 1000.0
    span = float(-t[0])
    if span <= 0:
        return None
    gap = limit - float(pts[-1][1])
    if gap <= 0:
        return {"eta_low_s": 0.0, "eta_high_s": 0.0, "fitted_over_s": span}
    slope, half, _, _ = line_fit(t, np.array([p[1] for p in pts], dtype="float64"))
    if slope <= 0:
        return None
    steepest, flattest = slope + half, slope - half
    return {"eta_low_s": gap / steepest, "eta_high_s": gap / flattest if flattest > 0 else None,
            "fitted_over_s": span}


def thin_append(buffer: list, entry: list, spacing_ms: float) -> bool:
    """Append ``entry`` (time first) if it is at least ``spacing_ms`` after the buffer's last."""
    if not buffer or entry[0] - buffer[-1][0] >= spacing_ms:
        buffer.append(entry)
        return True
    return False


def halve(buffer: list) -> list:
    """Every other entry, the last kept: the history's buffer at twice the spacing."""
    kept = buffer[-1::-2][::-1]
    return kept
