"""The first failed checkpoint, forecast through the checkpoints' own cadence."""

import math

import pytest

from feature_store.failure_forecast import Cadence, cadence_of, failure_eta


def _back_to_back(durations_ms, start_ms=0.0):
    """Checkpoints that each start when the last ends (backpressure): ``[(end, failed, e2e), ...]``."""
    out, trigger = [], start_ms
    for d in durations_ms:
        out.append([trigger + d, 0, d])
        trigger += d
    return out


def test_under_backpressure_the_failure_is_the_expiry_of_the_first_checkpoint_that_outgrows_the_timeout():
    # Each checkpoint 1.7 times the last, each starting when the last ends: a straight line in
    # time (slope 1 - 1/1.7). The next takes 58.3 s and completes; the one after would take 99 s,
    # so it expires 60 s after it starts: 118.3 s from now, not when the line crosses 60 s.
    durations = [100 * 1.7 ** k for k in range(12)]
    checkpoints = _back_to_back(durations)
    cadence = cadence_of(checkpoints, 3000)
    assert cadence == Cadence(checkpoints[-1][0] - durations[-1], checkpoints[-1][0], 3000.0, 0.0)
    eta = failure_eta([[c[0], c[2]] for c in checkpoints], 60_000, cadence)
    assert eta["eta_s"] == pytest.approx((durations[-1] * 1.7 + 60_000) / 1000, rel=1e-3)
    assert eta["eta_high_s"] == pytest.approx(eta["eta_s"] + 1, rel=1e-3)  # an exact line: a second to report it
    # Read as exponential growth, the next checkpoint might fail already: the band's early end.
    assert 60.0 <= eta["eta_low_s"] < eta["eta_s"]
    crossing_s = (60_000 - durations[-1]) / ((1 - 1 / 1.7) * 1000)
    assert crossing_s == pytest.approx(62.5, abs=0.1) and eta["eta_s"] > crossing_s + 50


def test_on_its_interval_the_failing_checkpoint_starts_on_the_interval_and_fails_a_timeout_later():
    # Full snapshots 100 ms slower at every checkpoint, 10 s apart (a leak), 3 s timeout: the trend
    # reaches 3 s between two triggers, and the first checkpoint triggered after it fails 3 s later.
    interval, timeout = 10_000, 3000
    checkpoints = [[i * interval + 1000 + 100 * i, 0, 1000 + 100 * i] for i in range(12)]
    cadence = cadence_of(checkpoints, interval)
    assert cadence.pause_ms == 0.0  # every trigger on the interval: no pause seen
    eta = failure_eta([[c[0], c[2]] for c in checkpoints], timeout, cadence)
    # Triggered t ms after the last end (2100 ms), a checkpoint ends at t + d: d = 2100 + s (t + d).
    s = 100 / 10_100
    triggers = [-2100 + k * interval for k in range(1, 100)]
    first = next(t for t in triggers if (2100 + s * t) / (1 - s) >= timeout)
    expected = (first + timeout) / 1000
    assert eta["eta_s"] == pytest.approx(expected, rel=1e-6)
    assert eta["eta_low_s"] <= eta["eta_s"] <= eta["eta_high_s"]


def test_a_flat_or_falling_metric_or_a_missing_limit_or_cadence_forecasts_nothing():
    flat = [[i * 3000, 0, 500.0] for i in range(12)]
    points = [[c[0], c[2]] for c in flat]
    assert failure_eta(points, 60_000, cadence_of(flat, 3000)) is None
    falling = [[i * 3000, 0, 5000.0 - 100 * i] for i in range(12)]
    assert failure_eta([[c[0], c[2]] for c in falling], 60_000, cadence_of(falling, 3000)) is None
    rising = _back_to_back([100 * 1.7 ** k for k in range(12)])
    rising_points = [[c[0], c[2]] for c in rising]
    assert failure_eta(rising_points, None, cadence_of(rising, 3000)) is None
    assert failure_eta(rising_points, 60_000, None) is None
    assert failure_eta(rising_points[:9], 60_000, cadence_of(rising, 3000)) is None  # too few points


def test_the_band_holds_a_noisy_build_up_and_may_not_close_above_where_the_slope_may_be_flat():
    # A noisy line: its band spans the slope's doubt; where the flattest slope is not rising, the
    # band has no late end.
    noise = [0, 900, -700, 400, -900, 600, -300, 800, -500, 100, -800, 700]
    steady = [[i * 10_000 + 1000, 0, 20_000 + 300 * i + noise[i]] for i in range(12)]
    eta = failure_eta([[c[0], c[2]] for c in steady], 60_000, cadence_of(steady, 10_000))
    assert eta["eta_low_s"] < eta["eta_s"]
    assert eta["eta_high_s"] is None or eta["eta_high_s"] > eta["eta_s"]


def test_a_far_failure_is_found_past_the_checkpoints_stepped_one_by_one():
    # 200 ms interval, growth of 1 ms a second: thousands of checkpoints before the timeout.
    checkpoints = [[i * 200 + 50, 0, 50 + 0.2 * i] for i in range(20)]
    eta = failure_eta([[c[0], c[2]] for c in checkpoints], 10_000, cadence_of(checkpoints, 200))
    crossing_s = (10_000 - checkpoints[-1][2]) / 1.0  # 1 ms per s
    assert eta["eta_s"] == pytest.approx(crossing_s, rel=0.02)
    assert math.isfinite(eta["eta_s"])


def test_checkpoints_that_fit_their_interval_are_jumped_over_to_the_same_answer_as_stepping_through_them():
    # 1 s interval, 20 ms more a checkpoint from 100 ms, 30 s timeout: some 1,500 checkpoints on the
    # interval, then a few that outgrow it; the answer is that of stepping through every one.
    interval, timeout = 1000, 30_000
    checkpoints = [[i * interval + 100 + 20 * i, 0, 100 + 20 * i] for i in range(12)]
    eta = failure_eta([[c[0], c[2]] for c in checkpoints], timeout, cadence_of(checkpoints, interval))
    s = 20 / 1020  # per ms of end time
    now = 100 + 20 * 11
    trigger = -now + interval  # after the last end
    while True:
        d = (now + s * trigger) / (1 - s)  # the duration read at its end
        if d >= timeout:
            break
        trigger = max(trigger + interval, trigger + d)
    assert eta["eta_s"] == pytest.approx((trigger + timeout) / 1000, rel=1e-6)


@pytest.mark.parametrize("bend_min_points, next_fails", [(3, True), (4, False)])
def test_a_take_off_is_a_trend_from_its_third_point_so_the_next_checkpoint_can_be_the_one_that_fails(
        monkeypatch, bend_min_points, next_fails):
    # Barriers wait about 350 ms for ten checkpoints 3 s apart, then 4.5 s, then 18.5 s (a sink
    # that suddenly cannot keep up). The take-off is 0.76 s of wait a second: the checkpoint
    # triggered now would wait 77 s, so it expires at the 60 s timeout. Read from its fourth
    # point only, the take-off is averaged with the flat past and that failure a checkpoint later.
    import feature_store.failure_forecast as forecast
    monkeypatch.setattr(forecast, "BEND_MIN_POINTS", bend_min_points)
    wobble = [0, 12, -9, 5, -14, 8, -3, 11, -6, 2]
    checkpoints = [[i * 3000 + 400, 0, 350 + w + 50] for i, w in enumerate(wobble)]
    checkpoints.append([checkpoints[-1][0] + 4900, 0, 4550])
    checkpoints.append([checkpoints[-1][0] + 18_550, 0, 18_550])
    waits = [[c[0], c[2] - 50] for c in checkpoints]
    eta = failure_eta(waits, 60_000, cadence_of(checkpoints, 3000))
    assert (eta["eta_s"] == pytest.approx(60.0, abs=0.5)) is next_fails
    assert eta["eta_low_s"] <= eta["eta_s"] <= eta["eta_high_s"]


def _stepped_expiry(last_ms, slope, limit_ms, trigger_ms):
    """Back to back on a trend linear in end time (``last_ms`` at the last end, ``slope`` per ms):
    a checkpoint triggered at T takes d = (last + slope T) / (1 - slope); the expiry of the first
    that reaches the limit."""
    while True:
        duration = (last_ms + slope * trigger_ms) / (1 - slope)
        if duration >= limit_ms:
            return trigger_ms + limit_ms
        trigger_ms += duration


def test_a_checkpoint_still_in_flight_past_its_trend_lasts_at_least_until_then():
    # Each checkpoint 1.2 times the last, back to back: durations linear in end time, slope 1/6.
    # The trend gives the checkpoint in flight 891 ms; seen still running at 1.5 s, it ends later,
    # every later one starts later on the trend, and the one that fails comes a checkpoint sooner.
    durations = [100 * 1.2 ** k for k in range(12)]
    checkpoints = _back_to_back(durations)
    cadence = cadence_of(checkpoints, 100)
    points = [[c[0], c[2]] for c in checkpoints]
    limit, last, slope = 2000, durations[-1], 1 / 6
    plain = failure_eta(points, limit, cadence)
    assert plain["eta_s"] * 1000 == pytest.approx(_stepped_expiry(last, slope, limit, 0.0), rel=1e-6)
    assert plain["in_flight_until_s"] * 1000 == pytest.approx(last / (1 - slope), rel=1e-6)

    late = failure_eta(points, limit, cadence, in_flight_at_ms=checkpoints[-1][0] + 1500)
    expected = _stepped_expiry(last, slope, limit, 1500.0)
    assert late["eta_s"] * 1000 == pytest.approx(expected, rel=1e-6) and expected < plain["eta_s"] * 1000 - 500
    assert late["in_flight_until_s"] == pytest.approx(1.5)
    # The trend no longer says when it ends: it may complete until just before its own expiry
    # (and the JobManager has a second to report the failure).
    assert late["eta_high_s"] * 1000 == pytest.approx(_stepped_expiry(last, slope, limit, limit - 1.0) + 1000, rel=1e-6)

    # Running for longer than the timeout, it has expired: the failure is due at its expiry.
    expired = failure_eta(points, limit, cadence, in_flight_at_ms=checkpoints[-1][0] + limit + 300)
    assert expired["eta_s"] * 1000 == pytest.approx(limit)
