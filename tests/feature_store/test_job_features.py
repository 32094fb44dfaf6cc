"""Hand-computed feature values on small series, one family at a time."""

from __future__ import annotations

import math
import random
from dataclasses import asdict

import orjson
import pytest

from feature_store.compute import OUTPUT_COLUMNS
from feature_store.definitions import FEATURE_NAMES, FEATURES, JOB_FEATURES, VERTEX_FEATURES, markdown_table
from feature_store.job_features import LATE, JobFeatureState, features_for_events
from feature_store.numeric import linear_fit, long_trends, relative_trend
from feature_store.trajectory import growth_bounds

JOB = "0123456789abcdef0123456789abcdef"
T0 = 1_700_000_000_000
H = 3_600_000
V1, V2, V3 = "v1" + "0" * 30, "v2" + "0" * 30, "v3" + "0" * 30


def base(ts, kind):
    return {"schema_version": 1, "kind": kind, "cluster": "c", "job_id": JOB, "job_name": "j", "ts": ts}


def checkpoint(ts, state, status="COMPLETED", e2e=1000, subtask_states=None, delays=None, persisted=0, checkpointed=None,
               vertex=V1):
    subtask_states = subtask_states or [state // 4, state - state // 4]
    delays = delays or [5] * len(subtask_states)
    done = status == "COMPLETED"
    return {**base(ts, "checkpoint"), "checkpoint_id": ts, "status": status, "is_savepoint": False,
            "trigger_ts": ts - e2e, "state_size_bytes": state if done else 0,
            "checkpointed_size_bytes": (checkpointed if checkpointed is not None else state) if done else 0,
            "end_to_end_duration_ms": e2e, "persisted_data_bytes": persisted,
            "num_subtasks": len(subtask_states), "num_acknowledged_subtasks": len(subtask_states) if done else 0,
            "failure_message": None if done else "Checkpoint expired before completing.",
            "vertices": [{"vertex_id": vertex, "vertex_name": "Window", "parallelism": len(subtask_states),
                          "state_size_bytes": state if done else 0, "checkpointed_size_bytes": 0,
                          "subtasks": [{"index": i, "state_size_bytes": s if done else None, "start_delay_ms": d,
                                        "alignment_duration_ms": d // 2}
                                       for i, (s, d) in enumerate(zip(subtask_states, delays))]}]}


def poll(ts, vertex, name, busy, backpressured, records=None, idle=None):
    n = len(busy)
    records = records or [100.0] * n
    return {**base(ts, "vertex_metrics"), "vertex_id": vertex, "vertex_name": name, "parallelism": n,
            "subtasks": [{"index": i, "busy_time_ms_per_s": busy[i], "backpressured_time_ms_per_s": backpressured[i],
                          "idle_time_ms_per_s": None if idle is None else idle[i], "records_in_per_s": records[i],
                          "records_out_per_s": records[i], "in_pool_usage": 0.5, "out_pool_usage": 0.25,
                          "checkpoint_start_delay_ms": None, "checkpoint_alignment_time_ms": None} for i in range(n)]}


def status(ts, limit=None, in_progress=0, heap=(100, 1000), restarts=0, state="RUNNING", interval=10_000, timeout=60_000,
           failed_total=0):
    return {**base(ts, "job_status"), "state": state, "num_restarts": restarts, "checkpoints_completed_total": 0,
            "checkpoints_failed_total": failed_total, "checkpoints_in_progress": in_progress, "checkpoint_interval_ms": interval,
            "checkpoint_timeout_ms": timeout, "max_state_size_bytes": limit, "jm_heap_used_bytes": heap[0],
            "jm_heap_max_bytes": heap[1]}


def rows_at(events, ts=None, vertex=None):
    rows = features_for_events(events)
    ts = ts if ts is not None else max(r["ts"] for r in rows)
    return next(r for r in rows if r["ts"] == ts and r["vertex_id"] == vertex and r["trigger_kind"] != "late")


def test_every_row_has_exactly_the_declared_columns_and_levels():
    events = [status(T0, limit=450), checkpoint(T0 + 1, 100), poll(T0 + 2, V1, "Window", [500, 500], [0, 0]),
              status(T0 + 3)]
    rows = features_for_events(events)
    assert all(list(r) == OUTPUT_COLUMNS or set(r) == set(OUTPUT_COLUMNS) for r in rows)
    job_rows = [r for r in rows if r["vertex_id"] is None]
    vertex_rows = [r for r in rows if r["vertex_id"] is not None]
    assert job_rows and vertex_rows
    assert all(r[name] is None for r in job_rows for name in VERTEX_FEATURES)
    # Vertex rows carry the job's features of the same moment as context.
    for v in vertex_rows:
        job = next(j for j in job_rows if j["ts"] == v["ts"])
        assert all(v[name] == job[name] for name in JOB_FEATURES)
    assert any(v["limit_ratio"] is not None for v in vertex_rows)
    assert len(set(FEATURE_NAMES)) == len(FEATURES)
    assert markdown_table().count("\n") == len(FEATURES) + 1


def test_leak_features_of_a_linear_series():
    step = 10 * 60_000  # within the idle timeout: a job silent for longer starts afresh
    events = [status(T0 - 1, limit=450)]
    events += [checkpoint(T0 + i * step, 100 * (i + 1), subtask_states=[25 * (i + 1), 75 * (i + 1)]) for i in range(3)]
    job = rows_at(events, vertex=None)
    assert job["state_size_bytes"] == 300
    assert job["state_rel_slope_per_h"] == pytest.approx(600 / 200)  # 100 per 10 min = 600/h, over mean 200
    assert job["state_r2"] == pytest.approx(1.0)
    assert job["state_frac_increasing"] == 1.0
    assert job["job_age_checkpoints"] == 3
    assert job["limit_ratio"] == pytest.approx(225 / 450)
    assert job["limit_eta_s"] == pytest.approx((450 - 225) / (75 / 600))  # largest subtask grows 75 per 600 s
    # A straight line has no residuals: its band is the ETA itself, fitted over the three checkpoints,
    # to one interval later (the first checkpoint taken past the limit is the one that fails).
    assert job["limit_eta_low_s"] == pytest.approx(job["limit_eta_s"])
    assert job["limit_eta_high_s"] == pytest.approx(job["limit_eta_s"] + 10.0)
    assert job["limit_fitted_over_s"] == 2 * step / 1000
    assert job["state_limit_bytes"] == 450
    assert job["limit_known"] == 1.0
    assert job["state_deceleration"] is None  # too few points to split in halves
    vertex = rows_at(events, vertex=V1)
    assert vertex["vertex_state_rel_slope_per_h"] == pytest.approx(3.0)
    assert vertex["vertex_limit_ratio"] == pytest.approx(0.5)
    assert vertex["state_max_over_mean"] == pytest.approx(225 / 150)
    assert vertex["state_cv"] == pytest.approx(75 / 150)
    assert vertex["hot_subtask"] == 1


def test_the_growth_test_holds_on_two_minutes_and_opens_on_at_least_twenty_checkpoints():
    """Checkpoints every 10 s: the 95 % bounds read the last two minutes (13 checkpoints), the
    99.9 % bound a leak opens on the last twenty; with checkpoints every 5 s both read the same
    two minutes."""
    rng = random.Random(3)
    for step_ms, held, opened in ((10_000, 13, 20), (5_000, 25, 25)):
        # Five minutes of a state growing 2 KB/s on 10 MB, with 0.2 % noise.
        events = [status(T0 - 1, interval=step_ms)]
        events += [checkpoint(T0 + i * step_ms, round(10_000_000 + 2 * i * step_ms + 20_000 * rng.gauss(0, 1)))
                   for i in range(300_000 // step_ms)]
        points = [[e["ts"], e["state_size_bytes"]] for e in events[1:]]
        job = rows_at(events, vertex=None)
        hold, opening = growth_bounds(points[-held:]), growth_bounds(points[-opened:])
        assert job["state_growth_low_per_h"] == pytest.approx(hold.low)
        assert job["state_growth_high_per_h"] == pytest.approx(hold.high)
        assert job["state_growth_opening_low_per_h"] == pytest.approx(opening.opening_low)
        assert opening.opening_low < opening.low


def test_deceleration_tells_a_levelling_warmup_from_a_leak():
    warmup = [100, 110, 120, 130, 140, 140, 140, 140, 140]
    leak = [100, 110, 120, 130, 140, 150, 160, 170, 180]
    step = 10 * 60_000
    warm = rows_at([checkpoint(T0 + i * step, s) for i, s in enumerate(warmup)])
    leaky = rows_at([checkpoint(T0 + i * step, s) for i, s in enumerate(leak)])
    assert warm["state_deceleration"] == pytest.approx(0.0)  # later half flat
    assert leaky["state_deceleration"] == pytest.approx(1.0)
    assert leaky["state_r2_long"] == pytest.approx(1.0)
    flat = rows_at([checkpoint(T0 + i * step, 100) for i in range(9)])
    assert flat["state_deceleration"] is None and flat["state_r2_long"] == 0.0


def test_checkpoint_health():
    events = [status(T0, in_progress=5, heap=(500, 1000), restarts=0),
              checkpoint(T0 + 10_000, 100), checkpoint(T0 + 80_000, 0, "FAILED", e2e=60_000),
              checkpoint(T0 + 150_000, 0, "FAILED", e2e=60_000),
              status(T0 + 200_000, in_progress=5, heap=(500, 1000), restarts=2),
              checkpoint(T0 + 220_000, 0, "FAILED", e2e=60_000)]
    job = rows_at(events, vertex=None)
    assert job["checkpoint_failed_fraction"] == 0.75
    assert job["checkpoint_consecutive_failures"] == 3
    assert job["checkpoint_duration_over_interval"] == 6.0
    assert job["checkpoint_duration_over_timeout"] == 1.0
    assert job["checkpoints_in_progress"] == 5
    assert job["restarts_in_window"] == 2
    assert job["jm_heap_ratio"] == 0.5
    assert job["state_size_bytes"] == 100  # failed checkpoints carry no state size


def test_backpressure_names_the_busy_vertex_downstream_of_backpressure():
    events = [poll(T0, V2, "Map", [0, 0], [0, 0])]  # outside the 4-poll window by the end
    for i in range(1, 5):
        events += [poll(T0 + i * 15_000, V1, "Source", [None, None], [900, 900]),
                   poll(T0 + i * 15_000, V2, "Map", [1000, 980], [0, 0], idle=[0, 20]),
                   status(T0 + i * 15_000)]
    source, bottleneck = rows_at(events, vertex=V1), rows_at(events, vertex=V2)
    assert bottleneck["busy_max"] == 1.0
    assert bottleneck["busy_mean"] == pytest.approx(0.99)
    assert bottleneck["idle_mean"] == pytest.approx(0.01)
    assert bottleneck["downstream_of_backpressure"] == pytest.approx(0.9)
    assert bottleneck["is_busiest_vertex"] == 1.0 and source["is_busiest_vertex"] == 0.0
    assert source["backpressured_mean"] == pytest.approx(0.9)
    # Sources report busy time as NaN: missing, with its indicator, not zero.
    assert source["busy_max"] is None and source["busy_reported"] == 0.0
    assert bottleneck["busy_reported"] == 1.0
    assert bottleneck["in_pool_max"] == 0.5 and bottleneck["out_pool_max"] == 0.25
    # The bottleneck has another vertex waiting on it; the source has none.
    assert bottleneck["others_backpressured_max"] == pytest.approx(0.9)
    assert source["others_backpressured_max"] == pytest.approx(0.0)


def test_skew_features_find_the_hot_subtask():
    events = [poll(T0, V1, "KeyedProcess", [100] * 4, [0] * 4, records=[100, 100, 100, 700]),
              checkpoint(T0 + 1, 400, subtask_states=[100, 100, 100, 100], delays=[10, 10, 500, 10]),
              status(T0 + 2)]
    vertex = rows_at(events, vertex=V1)
    assert vertex["records_in_max_over_mean"] == pytest.approx(2.8)
    # 70% of the records where a quarter is fair: (0.7 - 0.25) / (1 - 0.25).
    assert vertex["records_in_hot_excess"] == pytest.approx(0.6)
    assert vertex["state_hot_excess"] == pytest.approx(0.0)
    assert vertex["records_in_cv"] == pytest.approx(math.sqrt(67_500) / 250)
    assert vertex["hot_subtask"] == 3
    assert vertex["state_max_over_mean"] == pytest.approx(1.0)
    assert vertex["start_delay_max_over_median"] == pytest.approx(50.0)
    assert vertex["start_delay_max_ms"] == 500 and vertex["alignment_max_ms"] == 250


def input_rate_history(rates_per_poll, every_ms=5_000):
    """A vertex of two subtasks polled every ``every_ms`` at the given total input rates, then a status."""
    events = [poll(T0 + i * every_ms, V1, "Window", [900, 900], [0, 0], records=[rate / 2, rate / 2])
              for i, rate in enumerate(rates_per_poll)]
    return events + [status(T0 + len(rates_per_poll) * every_ms)]


def test_the_input_rate_over_its_usual_tells_a_slowdown_from_a_surge_and_waits_for_two_minutes():
    # Ten minutes at 200/s, then the last four polls (the averaged ones) at 120/s or at 600/s.
    usual = [200.0] * 120
    slowed = rows_at(input_rate_history(usual + [120.0] * 4), vertex=V1)
    surged = rows_at(input_rate_history(usual + [600.0] * 4), vertex=V1)
    assert slowed["records_in_over_usual"] == pytest.approx(0.6)
    # The surge's own polls join the history (one every 10 s): two of 60, the median stays 200.
    assert surged["records_in_over_usual"] == pytest.approx(3.0)
    # The job's row carries its busiest vertex's (a second vertex, less busy, at twice its usual).
    calm = [poll(T0 + i * 5_000, V2, "Sink", [100], [0], records=[50.0 if i < 120 else 100.0]) for i in range(124)]
    events = sorted(input_rate_history(usual + [120.0] * 4) + calm, key=lambda e: e["ts"])
    assert rows_at(events, vertex=V2)["records_in_over_usual"] == pytest.approx(2.0)
    assert rows_at(events)["busiest_input_over_usual"] == pytest.approx(0.6)
    # Under two minutes of history says nothing; at two minutes it does.
    assert rows_at(input_rate_history([200.0] * 24), vertex=V1)["records_in_over_usual"] is None
    assert rows_at(input_rate_history([200.0] * 25), vertex=V1)["records_in_over_usual"] == pytest.approx(1.0)


def test_the_usual_input_rate_is_the_median_of_the_last_ten_minutes_one_rate_every_ten_seconds():
    # 15 minutes at 100/s, then 10 at 300/s: the first 15 minutes have left the window.
    state = JobFeatureState()
    state.consume_all(input_rate_history([100.0] * 180 + [300.0] * 120))
    rates = state.input_rates[V1]
    assert len(rates) == 60 and all(b[0] - a[0] == 10_000 for a, b in zip(rates, rates[1:]))
    assert {rate for _, rate in rates} == {300.0}
    # A source (no input rate) has no history and no ratio.
    events = [poll(T0 + i * 5_000, V2, "Source", [None], [0], records=[None]) for i in range(40)] + [status(T0 + 200_000)]
    assert rows_at(events, vertex=V2)["records_in_over_usual"] is None


def test_subtasks_that_report_nothing_are_left_out_and_the_first_of_equal_subtasks_is_hot():
    # Subtask 0 reports no records and no busy time; subtasks 2 and 3 tie for the most records.
    events = [poll(T0, V1, "KeyedProcess", [None, 100, 300, 200], [0, 0, 0, 0], records=[None, 100, 400, 400]),
              checkpoint(T0 + 1, 600, subtask_states=[100, 100, 100, 100]),
              status(T0 + 2)]
    vertex = rows_at(events, vertex=V1)
    assert vertex["records_in_max_over_mean"] == pytest.approx(400 / 300)
    assert vertex["records_in_cv"] == pytest.approx(math.sqrt((200 ** 2 + 100 ** 2 + 100 ** 2) / 3) / 300)
    assert vertex["records_in_hot_excess"] == pytest.approx((400 / 900 - 1 / 3) / (1 - 1 / 3))
    assert vertex["hot_subtask"] == 2  # the subtask's own index, not its place among those that reported
    assert vertex["busy_max"] == pytest.approx(0.3) and vertex["busy_mean"] == pytest.approx(0.2)


def test_duplicates_and_out_of_order_events_are_not_consumed_twice():
    state = JobFeatureState()
    first, second = checkpoint(T0, 100), checkpoint(T0 + 10_000, 200)
    assert state.consume(first) and state.consume(second)
    assert state.consume(second) is None  # a duplicate delivery
    assert state.consume(first) is None  # older than what was consumed
    assert state.age_checkpoints == 2


def test_events_are_used_as_they_arrive_unless_late_for_their_stream_or_their_job():
    """A collector reports a checkpoint at its next poll, after vertex samples taken later: it is
    used all the same, within the allowed lateness of the job's latest event."""
    from feature_store.job_features import OUT_OF_ORDER

    state = JobFeatureState()
    state.consume(status(T0))
    state.consume(poll(T0 + 5_000, V1, "Window", [500, 500], [0, 0]))
    behind = checkpoint(T0 + 2_000, 100)  # acknowledged before the sample, reported after it
    assert state.refusal(behind, lateness_ms=10_000) is None
    (job_row, vertex_row) = state.consume(behind, lateness_ms=10_000)
    assert job_row["ts"] == T0 + 2_000 and job_row["state_size_bytes"] == 100
    assert vertex_row["busy_max"] == 0.5  # the sample that arrived first is known at the checkpoint
    # Two checkpoints failing at the same millisecond, reported highest id first: both count.
    a, b = ({**checkpoint(T0 + 6_000, 0, "FAILED"), "checkpoint_id": i} for i in (7, 8))
    assert state.consume(b, lateness_ms=10_000) and state.consume(a, lateness_ms=10_000)
    assert state.consume(a, lateness_ms=10_000) is None  # delivered twice
    # Further behind the job's latest event than the allowed lateness: late, not used.
    stale = checkpoint(T0 - 20_000, 50)
    assert state.refusal(stale, lateness_ms=10_000) == LATE and state.consume(stale, lateness_ms=10_000) is None
    # A vertex's samples come in order: an older one is out of order, even within the lateness.
    older = poll(T0 + 4_000, V1, "Window", [900, 900], [0, 0])
    assert state.refusal(older, lateness_ms=10_000) == OUT_OF_ORDER
    assert state.age_checkpoints == 3
    # After the job ended, what is reported about its past is late; a later event is a new run.
    state.consume(status(T0 + 8_000, state="FINISHED"))
    assert state.refusal(checkpoint(T0 + 7_000, 100)) == LATE
    assert state.consume(status(T0 + 60_000))[0]["job_age_checkpoints"] == 0


def test_an_idle_or_finished_job_starts_afresh():
    state = JobFeatureState()
    state.consume(checkpoint(T0, 100))
    state.consume(checkpoint(T0 + 10_000, 200))
    assert state.consume(checkpoint(T0 + 10_000 + 31 * 60_000, 300), idle_timeout_ms=30 * 60_000)[0]["job_age_checkpoints"] == 1
    state.consume(status(T0 + 40 * 60_000, state="FINISHED"))
    assert state.terminated
    # The next run shows in its status first (the collector publishes a poll's status before its
    # checkpoints); a checkpoint stamped after the end without one is the ended run's (a JobManager
    # clock ahead of the collector's), and late.
    assert state.refusal(checkpoint(T0 + 40 * 60_000 + 15_000, 40)) == LATE
    assert state.consume(status(T0 + 41 * 60_000))[0]["job_age_checkpoints"] == 0
    assert state.consume(checkpoint(T0 + 41 * 60_000 + 3_000, 50))[0]["job_age_checkpoints"] == 1


def test_state_round_trips_through_json_exactly():
    state = JobFeatureState()
    for i in range(5):
        state.consume(checkpoint(T0 + i * 60_000, 100 + 7 * i))
    restored = JobFeatureState.from_json(state.to_json())
    assert restored == state
    nxt = checkpoint(T0 + 10 * 60_000, 500)
    assert restored.consume(dict(nxt)) == state.consume(dict(nxt))



def test_long_trends_kept_in_the_state_are_reused_after_a_reload_and_equal_a_fresh_fit():
    # The stream rebuilds the machine from its JSON at every call: the long-horizon fits it
    # keeps must still be found after that round trip, and must be what a fit from scratch gives.
    step, sizes = 60_000, [100 + 7 * i + (i % 3) for i in range(40)]
    cached, fresh = JobFeatureState(), JobFeatureState()
    for i, size in enumerate(sizes):
        event = checkpoint(T0 + i * step, size)
        cached = JobFeatureState.from_json(cached.to_json())
        fresh = JobFeatureState.from_json(fresh.to_json())
        fresh.long_trend_cache.clear()
        assert cached.consume(dict(event)) == fresh.consume(dict(event))
    stamp, trends = cached.long_trend_cache["job"]
    reloaded = JobFeatureState.from_json(cached.to_json())
    reloaded.long_trend_cache["job"][1] = [-1.0, -2.0, -3.0]  # a hit returns what is kept, without a fit
    row = reloaded.evaluate(reloaded.last_seen_ts, "checkpoint")[0]
    assert (row["state_rel_slope_long_per_h"], row["state_r2_long"], row["state_deceleration"]) == (-1.0, -2.0, -3.0)
    assert stamp == [len(cached.completed_long), cached.completed_long[-1][0], cached.completed_long[0][0]]
    assert trends[0] > 0 and 0.9 < trends[1] <= 1.0


def test_the_growth_tests_of_an_unchanged_growth_window_are_reused_and_equal_a_fresh_computation():
    # At a 500 ms interval the thinned growth window gains a point every few checkpoints: the
    # checkpoints between reuse the tests of the window as it was, and must read what a machine
    # rebuilt from its JSON (with nothing kept in memory) computes afresh.
    events = [checkpoint(T0 + i * 500, 10_000 + 40 * i + (i * 7919) % 53) for i in range(400)]
    kept, fresh, unchanged = JobFeatureState(), JobFeatureState(), 0
    for event in events:
        window_before = [e[0] for e in kept.growth_window]
        fresh = JobFeatureState.from_json(fresh.to_json())
        assert kept.consume(dict(event)) == fresh.consume(dict(event))
        unchanged += [e[0] for e in kept.growth_window] == window_before
    assert unchanged > 200  # most checkpoints left the window as it was: the reuse was exercised
    row = rows_at([dict(event) for event in events])
    assert row["state_growth_low_per_h"] > 0 and row["state_recent_growth_low_per_h"] > 0


def _reference_long_trends(points):
    """The long-horizon trends fitted series by series, as the definitions say: the relative
    trend over the whole span, and the later half's slope over the earlier half's."""
    points = [p for p in points if p[1] is not None]
    rel_slope, r2 = relative_trend(points)
    if len(points) < 8:
        return [rel_slope, r2, None]
    half = len(points) // 2
    early, late = (linear_fit([p[0] / H for p in part], [p[1] for p in part]) for part in (points[:half], points[half:]))
    mean = sum(p[1] for p in points) / len(points)
    if early is None or late is None or mean <= 0 or early[0] / mean < 0.01:
        return [rel_slope, r2, None]
    return [rel_slope, r2, late[0] / early[0]]


def test_the_long_trends_of_a_job_and_its_vertices_fitted_together_equal_each_series_fitted_alone():
    # The job and its vertices share the long buffer's times, centred once for all of them: the
    # values must be exactly those of each series fitted on its own, including a vertex that is
    # missing from some checkpoints (fitted over its own times) and a flat one.
    state = JobFeatureState()
    for i in range(300):  # a checkpoint every 30 s for 2.5 hours: the long buffer fills and moves on
        event = checkpoint(T0 + i * 30_000, 1000 + 13 * i + (i * 7919) % 101)
        event["vertices"].append({**event["vertices"][0], "vertex_id": V2, "state_size_bytes": 500})
        if i % 5:
            event["vertices"].append({**event["vertices"][0], "vertex_id": V3,
                                      "state_size_bytes": 4000 + 3 * i - (i * 31) % 17})
        state.consume(event)
    rows = {row["vertex_id"]: row for row in state.evaluate(state.last_seen_ts, "checkpoint")}
    buffer = state.completed_long
    assert len(buffer) > 150 and buffer[0][0] > T0 and any(None in e[2] for e in buffer)
    job_points = [[e[0], e[1]] for e in buffer]
    assert [rows[None][f"state_{name}"] for name in ("rel_slope_long_per_h", "r2_long", "deceleration")] \
        == _reference_long_trends(job_points) == long_trends(job_points)
    for vid in (V1, V2, V3):
        i = state.long_vertices.index(vid)
        points = [[e[0], e[2][i] if i < len(e[2]) else None] for e in buffer]
        expected = _reference_long_trends(points)
        assert [rows[vid][f"vertex_state_{name}"] for name in ("rel_slope_long_per_h", "r2_long", "deceleration")] \
            == expected == long_trends(points)
    assert rows[V2]["vertex_state_r2_long"] == 0.0 and rows[V2]["vertex_state_deceleration"] is None  # flat
    assert rows[V3]["vertex_state_rel_slope_long_per_h"] > 0 and rows[V3]["vertex_state_deceleration"] is not None


def test_the_written_state_is_its_fields_while_the_long_buffer_fills_and_moves_on():
    # The long buffer's JSON is kept between writes and used while the buffer is unchanged: every
    # write must still be exactly the fields as they are, through the buffer filling (an entry
    # 22.5 s or more after the last) and dropping its oldest entries (after 90 minutes).
    state = JobFeatureState()
    reused = 0
    for i in range(700):  # a checkpoint every 10 s and a status poll between: almost two hours
        state.consume(checkpoint(T0 + i * 10_000, 100 + i))
        assert orjson.dumps(state.orjson_fields()) == orjson.dumps(asdict(state))
        state.consume(status(T0 + i * 10_000 + 5_000))
        fields = state.orjson_fields()
        reused += fields["completed_long"] is state.orjson_fields()["completed_long"]
        assert orjson.dumps(fields) == orjson.dumps(asdict(state))
    assert reused == 700 and len(state.completed_long) > 150
    assert state.completed_long[0][0] > T0 + 20 * 60_000  # the first entries were dropped
    assert JobFeatureState(**orjson.loads(orjson.dumps(state.orjson_fields()))) == state


def test_state_stays_bounded_over_a_long_fast_run():
    state = JobFeatureState()
    for i in range(5000):  # 500 ms interval for ~40 minutes
        state.consume(checkpoint(T0 + i * 500, 100 + i))
    assert len(state.completed) == 12
    assert len(state.completed_long) <= 240
    assert len(state.to_json()) < 60_000


def test_barrier_wait_trends():
    step = 10 * 60_000
    events = [checkpoint(T0 + i * step, 100, delays=[10, 100 * (i + 1)]) for i in range(3)]
    vertex = rows_at(events, vertex=V1)
    assert vertex["start_delay_rel_slope_per_h"] == pytest.approx(600 / 200)  # 100 per 10 min over mean 200
    assert vertex["alignment_rel_slope_per_h"] == pytest.approx(300 / 100)  # alignment is half the delay here
    assert vertex["start_delay_max_ms"] == 300 and vertex["alignment_max_ms"] == 150


def test_a_barrier_wait_that_grows_is_forecast_to_fail_a_checkpoint_against_the_timeout():
    # Start delay 1 s more, alignment 0.5 s more at every checkpoint (triggered every 5 s): +300
    # ms/s, 18 s at the 12th. A checkpoint triggered t s after the last ends waits (18 + 0.3 t) /
    # 0.7 s, its wait read at its end. The next three (triggered at 4, 31.4 and 70.6 s) complete in
    # 27.4, 39.2 and 56.0 s; the fourth, at 126.6 s, would wait 80 s and expires 60 s later.
    events = [status(T0 - 1000, interval=5000, timeout=60_000)]
    events += [checkpoint(T0 + i * 5000, 100, delays=[10, 1000 * (i + 1)]) for i in range(12)]
    vertex = rows_at(events, vertex=V1)
    assert vertex["barrier_wait_timeout_eta_s"] == pytest.approx(186.587, abs=0.01)
    assert vertex["barrier_wait_timeout_eta_high_s"] == pytest.approx(187.587, abs=0.01)  # a line: 1 s to report it
    assert vertex["barrier_wait_timeout_eta_low_s"] <= vertex["barrier_wait_timeout_eta_s"]
    assert vertex["barrier_wait_fitted_over_s"] == pytest.approx(55.0)
    # Counted from the row's time: 10 s later, 10 s sooner.
    later = rows_at(events + [status(T0 + 65_000, interval=5000, timeout=60_000)], vertex=V1)
    assert later["barrier_wait_timeout_eta_s"] == pytest.approx(176.587, abs=0.01)
    assert rows_at(events)["barrier_wait_timeout_eta_s"] is None  # a vertex's, not the job's
    # 40 s after the last end, the checkpoint triggered at 4 s (its trend: 27.4 s) still in flight:
    # it ends at 40 s at the earliest, the next waits (18 + 0.3 x 40) / 0.7 = 42.9 s and completes,
    # the one triggered at 82.9 s would wait 61.2 s: it expires at 142.9 s, 102.9 s from the row.
    in_flight = rows_at(events + [status(T0 + 95_000, in_progress=1, interval=5000, timeout=60_000)], vertex=V1)
    assert in_flight["barrier_wait_timeout_eta_s"] == pytest.approx(102.857, abs=0.01)
    # With none in flight (a pause, a job not triggering), the forecast is only counted down.
    idle = rows_at(events + [status(T0 + 95_000, in_progress=0, interval=5000, timeout=60_000)], vertex=V1)
    assert idle["barrier_wait_timeout_eta_s"] == pytest.approx(146.587, abs=0.01)
    # A flat wait, or no timeout known: no forecast.
    flat = [status(T0 - 1000)] + [checkpoint(T0 + i * 5000, 100, delays=[10, 1000]) for i in range(12)]
    assert rows_at(flat, vertex=V1)["barrier_wait_timeout_eta_s"] is None
    assert rows_at(events[1:], vertex=V1)["barrier_wait_timeout_eta_s"] is None


def test_a_subtask_that_never_acknowledged_a_failed_checkpoint_waited_at_least_its_duration():
    """A bottleneck whose checkpoints all expire never reports a start delay: read as the
    checkpoint's duration (a lower bound), not as unknown, and not for a subtask that did acknowledge."""
    expired = checkpoint(T0 + 60_000, 0, status="FAILED", e2e=8_000, subtask_states=[1, 1, 1], delays=[40, 40, 40])
    expired["vertices"][0]["subtasks"][0].update(start_delay_ms=None, end_to_end_duration_ms=None)
    for acknowledged in expired["vertices"][0]["subtasks"][1:]:
        acknowledged.update(end_to_end_duration_ms=45)
    vertex = rows_at([checkpoint(T0, 100), expired], vertex=V1)
    assert vertex["start_delay_max_ms"] == 8_000
    assert vertex["start_delay_max_over_median"] == pytest.approx(8_000 / 40)  # the acknowledged one kept its own
    completed = checkpoint(T0 + 60_000, 100, e2e=8_000, delays=[40, 40])
    completed["vertices"][0]["subtasks"][0].update(start_delay_ms=None, end_to_end_duration_ms=None)
    assert rows_at([checkpoint(T0, 100), completed], vertex=V1)["start_delay_max_ms"] == 40  # completed: unknown stays unknown


def test_job_age_counts_from_the_start_its_checkpoint_ids_tell_and_from_the_last_restart():
    def numbered(ts, cid):
        return {**checkpoint(ts, 100), "checkpoint_id": cid, "trigger_ts": ts - 1000}

    fresh = rows_at([status(T0), numbered(T0 + 11_000, 1), status(T0 + 40_000)], vertex=None)
    assert fresh["job_age_s"] == pytest.approx(40.0)
    # First seen with checkpoint 31 at a 10 s interval: it has run for about 300 s already.
    seen_late = rows_at([status(T0), numbered(T0 + 11_000, 31), status(T0 + 40_000)], vertex=None)
    assert seen_late["job_age_s"] == pytest.approx(40 + 300 - 10, abs=1)
    restarted = rows_at([status(T0), numbered(T0 + 11_000, 31), status(T0 + 40_000, restarts=1),
                         status(T0 + 55_000, restarts=1)], vertex=None)
    assert restarted["job_age_s"] == pytest.approx(15.0)


def test_new_highs_and_plateaus_tell_growth_that_resumed_from_warm_up():
    step = 10_000
    warmup_then_leak = [100 + 10 * i for i in range(8)] + [170] * 8 + [170 + 15 * i for i in range(1, 9)]
    rows = features_for_events([checkpoint(T0 + i * step, s) for i, s in enumerate(warmup_then_leak)])
    vertex = [r for r in rows if r["vertex_id"] == V1]
    assert vertex[7]["vertex_state_over_plateau"] is None  # still growing: no plateau yet
    # Eight flat checkpoints over 70 s: a plateau at 170, and the state is at it.
    assert vertex[15]["vertex_state_over_plateau"] == pytest.approx(1.0)
    assert vertex[15]["vertex_state_over_prior_max"] == pytest.approx(170 / 130)  # the warm-up still in the window
    last = vertex[-1]
    assert last["vertex_state_over_plateau"] == pytest.approx(290 / 170)
    # Above everything before the short window (its peak: 170).
    assert last["vertex_state_over_prior_max"] == pytest.approx(290 / 170)
    linear = features_for_events([checkpoint(T0 + i * step, 100 + 10 * i) for i in range(24)])
    assert {r["vertex_state_over_plateau"] for r in linear if r["vertex_id"] == V1} == {None}
    # A plateau that jitters like RocksDB's sizes (+-10 %) is still one: its trend decides.
    jitter = [170, 190, 160, 185, 165, 180, 172, 188]
    noisy = features_for_events([checkpoint(T0 + i * step, s) for i, s in enumerate(warmup_then_leak[:8] + jitter)])
    assert [r for r in noisy if r["vertex_id"] == V1][-1]["vertex_state_over_plateau"] == pytest.approx(188 / 190)


def test_failures_flink_counts_without_a_checkpoint_and_failures_a_cancellation_causes():
    events = [status(T0, failed_total=2), checkpoint(T0 + 5_000, 100), status(T0 + 10_000, failed_total=2),
              status(T0 + 20_000, failed_total=4), status(T0 + 30_000, failed_total=5)]
    job = rows_at(events, vertex=None)
    assert job["checkpoint_failures_counted"] == 3  # within the last two minutes; no failed checkpoint event
    # Triggers declined while the job's tasks start (before its first checkpoint) are not failures,
    # even when the first checkpoint completes within the same poll.
    starting = [status(T0, failed_total=0), status(T0 + 5_000, failed_total=3), checkpoint(T0 + 12_000, 100),
                status(T0 + 15_000, failed_total=4), status(T0 + 20_000, failed_total=4)]
    assert rows_at(starting, vertex=None)["checkpoint_failures_counted"] == 0
    assert job["checkpoint_failed_fraction"] == 0.0
    cancelled = events + [{**checkpoint(T0 + 35_000, 0, "FAILED"),
                           "failure_message": "Checkpoint Coordinator is suspending."},
                          status(T0 + 36_000, state="CANCELED", failed_total=6)]
    job = rows_at(cancelled, vertex=None)
    assert job["checkpoint_failed_fraction"] == 0.0 and job["job_age_checkpoints"] == 1
