"""The growth test and the shape of growth (feature_store/trajectory.py) on series whose truth is known."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from feature_store.trajectory import (BEND_NOISE_FLOOR, GROWTH_MIN_POINTS, GROWTH_WINDOW_MS, OPENING_MIN_POINTS,
                                      TRAJECTORY_POINTS, fills_toward_plateau, growth_bounds, halve, line_eta_band,
                                      recent_growth_low, recent_trend_since, t95, t999, trajectory_fit, window)

MB = 1024 * 1024


def series(f, seconds: float, interval_s: float, seed: int = 0) -> list[list[float]]:
    """``[(ts_ms, f(t, rng)), ...]`` every ``interval_s`` for ``seconds``."""
    rng = random.Random(seed)
    return [[round(i * interval_s * 1000), f(i * interval_s, rng)] for i in range(1, int(seconds / interval_s) + 1)]


def growing(points, to_open: bool = False) -> bool:
    """The leak family's test at 5 %/h: the window's 95 % lower bound (to open a leak, also the
    99.9 % one over at least OPENING_MIN_POINTS checkpoints), and growth since its last change of
    pace."""
    recent = window(points, GROWTH_WINDOW_MS, GROWTH_MIN_POINTS)
    bounds, since = growth_bounds(recent), recent_growth_low(recent)
    if not (bounds and since is not None and bounds.low >= 0.05 and since > 0):
        return False
    opening = growth_bounds(window(points, GROWTH_WINDOW_MS, OPENING_MIN_POINTS)) if to_open else None
    return not to_open or (opening is not None and opening.opening_low >= 0.05)


def thinned(points, n=TRAJECTORY_POINTS):
    while len(points) > n:
        points = halve(points)
    return points


@pytest.mark.parametrize("interval_s", [0.2, 3.0, 60.0])
def test_a_flat_state_that_wiggles_does_not_grow_at_any_interval(interval_s):
    flat = series(lambda t, r: 7 * MB * (1 + 0.0005 * r.gauss(0, 1)), 30 * 60, interval_s)
    verdicts = [growing(flat[:i]) for i in range(GROWTH_MIN_POINTS, len(flat), max(1, len(flat) // 200))]
    assert not any(verdicts)


@pytest.mark.parametrize("seed", [4, 5])
def test_an_hour_of_a_noisy_flat_state_reads_as_growing_now_and_then_but_never_opens_a_leak(seed):
    flat = series(lambda t, r: 300 * MB * (1 + 0.01 * r.gauss(0, 1)), 60 * 60, 3.0, seed=seed)
    checked = range(GROWTH_MIN_POINTS, len(flat))  # every checkpoint of the hour
    assert sum(growing(flat[:i]) for i in checked) > 0  # the 95 % bound that holds an open leak is fooled
    assert not any(growing(flat[:i], to_open=True) for i in checked)


@pytest.mark.parametrize("interval_s", [0.2, 3.0, 60.0])
def test_a_slow_leak_grows_at_any_interval(interval_s):
    # 2.7 KB/s on a few MB: over 100 %/h, with RocksDB-like 2 % noise; to open, with 1 %.
    leak = series(lambda t, r: (2.4 * MB + 2700 * t) * (1 + 0.02 * r.gauss(0, 1)), 40 * 60, interval_s)
    verdicts = [growing(leak[:i]) for i in range(len(leak) // 2, len(leak), max(1, len(leak) // 100))]
    assert sum(verdicts) >= 0.9 * len(verdicts)
    quieter = series(lambda t, r: (2.4 * MB + 2700 * t) * (1 + 0.01 * r.gauss(0, 1)), 40 * 60, interval_s)
    checked = range(len(quieter) // 2, len(quieter), max(1, len(quieter) // 100))
    opening = [growing(quieter[:i], to_open=True) for i in checked]
    assert sum(opening) >= 0.9 * len(opening)


def test_a_leak_with_slow_checkpoints_opens_soon_after_the_95_percent_bound_reads_it():
    # Checkpoints every 10 s: twelve in the two-minute window, too few for a 99.9 % bound alone
    # (t = 4.59 at ten degrees of freedom); the opening window reaches back twenty.
    for seed in range(3):
        leak = series(lambda t, r: 50 * MB * (1 + 0.003 * r.gauss(0, 1)) + 5000 * max(0.0, t - 600), 3600, 10.0, seed)
        first = [next(p[0] for i, p in enumerate(leak) if i >= 3 and growing(leak[:i + 1], to_open)) / 1000
                 for to_open in (False, True)]
        assert 600 < first[0] <= first[1] <= first[0] + 120, first


def test_growth_that_stops_reads_as_stopped_within_a_few_checkpoints_not_a_window_later():
    climb = series(lambda t, r: 1 * MB + 10_000 * min(t, 300) + 200 * r.gauss(0, 1), 420, 3.0)
    assert growing([p for p in climb if p[0] <= 300_000])
    stopped_at = next(p[0] for p in climb if p[0] > 300_000 and not growing([q for q in climb if q[0] <= p[0]]))
    assert stopped_at - 300_000 <= 30_000  # the window is two minutes: its plain slope would take about that


@pytest.mark.parametrize("seed", range(6))
def test_the_bend_of_the_recent_trend_is_the_best_fitting_one_and_its_line_the_least_squares_one(seed):
    # A climb that stops (or takes off) somewhere in the window: the hinge picked must leave the
    # least squared error of every hinge allowed, and the slope after it be that hinge's own fit.
    rng = random.Random(seed)
    stop, rate, after = rng.uniform(20, 70), rng.uniform(500, 5_000), rng.choice([0.0, 0.2, 3.0])
    points = series(lambda t, r: 1 * MB + rate * min(t, stop) + rate * after * max(t - stop, 0) + 300 * r.gauss(0, 1),
                    100, 2.0, seed)
    (slope, half, now, n), bend = recent_trend_since(points)
    assert n == len(points) and bend > 0
    t = (np.array([p[0] for p in points], dtype="float64") - points[-1][0]) / 1000.0
    y = np.array([p[1] for p in points], dtype="float64")

    def design(b):
        return np.stack([np.ones(len(t)), t, np.maximum(t - t[b], 0.0)], axis=1)

    def fit(b):
        beta, *_ = np.linalg.lstsq(design(b), y, rcond=None)
        return float(((y - design(b) @ beta) ** 2).sum()), beta

    allowed = [b for b in range(1, len(t) - 3) if t[b] <= t[-1] - 15]
    best = min(allowed, key=lambda b: fit(b)[0])
    rss, beta = fit(best)
    assert bend == best
    assert slope == pytest.approx(beta[1] + beta[2], rel=1e-9, abs=1e-6)
    assert now == pytest.approx(beta[0] - beta[2] * t[best], rel=1e-12)
    # Its 95 % half-width: the OLS covariance of both slopes (the noise floored), widened for the
    # autocorrelation of the residuals after the bend.
    floor = n * (BEND_NOISE_FLOOR * float(np.abs(y).mean())) ** 2
    cov = np.linalg.inv(design(best).T @ design(best)) * max(rss, floor) / (n - 3)
    tail = (y - design(best) @ beta)[best:]
    rho = min(0.9, max(0.0, float(tail[1:] @ tail[:-1]) / float(tail @ tail)))
    expected = t95(n - 3) * math.sqrt((cov[1, 1] + cov[2, 2] + 2 * cov[1, 2]) * (1 + rho) / (1 - rho))
    assert half == pytest.approx(expected, rel=1e-6)
    assert slope == pytest.approx(rate * after, rel=0.25, abs=60)


def test_the_slope_s_bounds_widen_with_noise_and_hold_the_true_slope():
    line = series(lambda t, r: 1e6 + 100 * t + 5_000 * r.gauss(0, 1), 120, 2.0)
    slope, low, high, opening_low = growth_bounds(line)
    true = 100 * 3600 / (1e6 + 100 * 61)  # per hour, over the mean
    assert opening_low < low < true < high and low < slope < high
    quiet = growth_bounds(series(lambda t, r: 1e6 + 100 * t + 50 * r.gauss(0, 1), 120, 2.0))
    assert quiet[2] - quiet[1] < (high - low) / 10
    assert growth_bounds([[0, 1.0], [1, 2.0]]) is None  # too few points
    assert t95(3) > t95(30) > 1.9 and t999(30) > t95(30) and t999(1000) > 3.2


@pytest.mark.parametrize("tau_s", [40, 90, 300])
def test_a_bounded_key_space_filling_is_recognised_and_says_where_it_levels_off(tau_s):
    keys = 5 * MB
    fill = series(lambda t, r: keys * (1 - math.exp(-t / tau_s)) * (1 + 0.005 * r.gauss(0, 1)), 8 * tau_s, 3.0)
    fit = trajectory_fit(thinned(fill))
    assert fit["saturating"]
    assert fit["plateau"] == pytest.approx(keys, rel=0.05)
    assert fills_toward_plateau(fit, growth_bounds(window(fill, GROWTH_WINDOW_MS, GROWTH_MIN_POINTS)))


def test_linear_growth_and_a_leak_beside_a_fill_are_not_fills():
    linear = series(lambda t, r: (1 * MB + 3_000 * t) * (1 + 0.02 * r.gauss(0, 1)), 1800, 5.0)
    assert not trajectory_fit(thinned(linear))["saturating"]
    # A TTL warm-up that levels off at 2 MB, and 300 B/s kept forever on top of it.
    leak_on_fill = series(lambda t, r: 2 * MB * (1 - math.exp(-t / 60)) + 300 * t + 2_000 * r.gauss(0, 1), 1800, 3.0)
    fit = trajectory_fit(thinned(leak_on_fill))
    assert not fills_toward_plateau(fit, growth_bounds(window(leak_on_fill, GROWTH_WINDOW_MS, GROWTH_MIN_POINTS)))


def leak_verdict(points) -> bool:
    """Growing certainly enough to open a leak, and not a fill (the history's curve and the growth now)."""
    recent = window(points, GROWTH_WINDOW_MS, GROWTH_MIN_POINTS)
    filling = fills_toward_plateau(trajectory_fit(thinned(points)), growth_bounds(recent), recent_growth_low(recent))
    return growing(points, to_open=True) and not filling


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_slow_leak_after_a_ttl_warm_up_is_no_fill_within_a_minute_of_its_horizon_and_its_healthy_twin_never_leaks(seed):
    # A 180 s TTL over 10 KB/s of new keys: linear until the first keys expire, then flat; in the
    # leak a fifth of them is kept forever, so the state goes on at 2 KB/s after the kink. The
    # curve bends through the kink and says the growth slows on; the leak's does not.
    ttl, rate = 180.0, 10_000.0
    leak = series(lambda t, r: (0.8 * rate * min(t, ttl) + 0.2 * rate * t) * (1 + 0.002 * r.gauss(0, 1)), 600, 3.0,
                  seed=seed)
    twin = series(lambda t, r: 0.8 * rate * min(t, ttl) * (1 + 0.002 * r.gauss(0, 1)), 600, 3.0, seed=seed)
    horizon_checkpoints = int((ttl + 60) / 3.0)  # the operator's horizon: the TTL and a minute
    deadline = horizon_checkpoints + 20  # and a minute more
    assert any(leak_verdict(leak[:i]) for i in range(horizon_checkpoints, deadline))
    assert not any(leak_verdict(twin[:i]) for i in range(horizon_checkpoints, len(twin)))


def test_a_history_too_short_says_nothing_of_its_shape():
    assert trajectory_fit(series(lambda t, r: 1e6 + t, 60, 3.0)) is None
    assert not fills_toward_plateau(None, (1.0, 0.5, 1.5))


def test_a_line_s_eta_band_holds_the_true_time_to_the_limit_and_narrows_with_less_noise():
    # The largest subtask's state over 12 checkpoints, +1 KB/s, at 60 % of a 2 MB limit at the end.
    limit, rate = 2_000_000, 1_000.0

    def band(noise: float, seed: int) -> tuple[float, dict]:
        points = series(lambda t, r: 1_200_000 - rate * 33 + rate * t + noise * r.gauss(0, 1), 36, 3.0, seed=seed)
        true_eta = (limit - (1_200_000 - rate * 33 + rate * points[-1][0] / 1000)) / rate
        return true_eta, line_eta_band(points, limit)

    held = 0
    for seed in range(20):
        true_eta, found = band(2_000.0, seed)
        assert found["eta_low_s"] < found["eta_high_s"] and found["fitted_over_s"] == 33.0
        held += found["eta_low_s"] <= true_eta <= found["eta_high_s"]
    assert held >= 17  # a 95 % band, widened for autocorrelation: it holds the truth nearly always
    _, quiet = band(20.0, 0)
    _, noisy = band(2_000.0, 0)
    assert quiet["eta_high_s"] - quiet["eta_low_s"] < (noisy["eta_high_s"] - noisy["eta_low_s"]) / 10
    # Noise that may hide a flat line: the band is open above. At the limit: 0. Falling, no limit: none.
    _, flat = band(200_000.0, 0)
    assert flat is None or flat["eta_high_s"] is None
    at_limit = [[i * 3000, 1_000_000 + i * 100_000.0] for i in range(12)]
    assert line_eta_band(at_limit, 1_500_000) == {"eta_low_s": 0.0, "eta_high_s": 0.0, "fitted_over_s": 33.0}
    assert line_eta_band([[i * 3000, 1e6 - i] for i in range(12)], 2e6) is None
    assert line_eta_band(at_limit, None) is None and line_eta_band(at_limit[:2], 2e7) is None
