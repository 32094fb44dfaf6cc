"""Each scenario has the property it claims, deterministically, within the input contract."""

from __future__ import annotations

import statistics
from functools import lru_cache

import pytest

from pipelines.contracts import INPUT
from pipelines.simulator import simulate_job
from pipelines.simulator.faults import MEMORY_BACKEND_MESSAGE
from pipelines.simulator.scenarios import CATALOGUE, SEED_000_MAX_STATE_BYTES, SEED_000_STATE_MB

MIB = 2**20


@lru_cache(maxsize=None)
def run(name: str, seed: int = 1, duration: str | None = None):
    from pipelines.simulator import parse_duration

    return simulate_job(name, seed=seed, duration_ms=parse_duration(duration) if duration else None)


def checkpoints(job, status="COMPLETED"):
    return [e for e in job.events if e["kind"] == "checkpoint" and (status is None or e["status"] == status)]


def onset(job) -> int:
    return job.truth["faults"][0]["onset_ts"]


def fit(xs, ys):
    """Least-squares slope and R^2."""
    slope, _ = statistics.linear_regression(xs, ys)
    r = statistics.correlation(xs, ys)
    return slope, r * r


def vertex_series(job, vertex_name: str, since: int = 0, until: int = 2**62):
    """(ts, full state, checkpointed) of one vertex over completed checkpoints."""
    out = []
    for e in checkpoints(job):
        if since <= e["ts"] < until:
            v = next(v for v in e["vertices"] if v["vertex_name"] == vertex_name)
            out.append((e["ts"], v["state_size_bytes"], v["checkpointed_size_bytes"]))
    return out


def subtask_metric(job, vertex_name, field, since=0, until=2**62):
    """Per subtask index, the mean of a vertex_metrics field over the window (nulls skipped)."""
    values: dict[int, list[float]] = {}
    for e in job.events:
        if e["kind"] == "vertex_metrics" and e["vertex_name"] == vertex_name and since <= e["ts"] < until:
            for s in e["subtasks"]:
                if s[field] is not None:
                    values.setdefault(s["index"], []).append(s[field])
    return {k: statistics.fmean(v) for k, v in values.items()}


# --- every scenario ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_every_event_satisfies_the_input_contract(name):
    job = simulate_job(name, seed=3, duration_ms=min(CATALOGUE[name].default_duration_ms, 40 * 60_000))
    kinds = {e["kind"] for e in job.events}
    assert kinds == {"checkpoint", "vertex_metrics", "job_status"}
    invalid = [(e["kind"], INPUT.errors(e)[:2]) for e in job.events if not INPUT.validator.is_valid(e)]
    assert invalid == []
    assert [e["ts"] for e in job.events] == sorted(e["ts"] for e in job.events)
    assert {e["job_id"] for e in job.events} == {job.truth["job_id"]}


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_labels_match_the_scenario_and_the_events(name):
    job = run(name)
    truth = job.truth
    family = CATALOGUE[name].family
    assert truth["family"] == (family or "healthy")
    if family is None:
        assert truth["faults"] == []
        return
    assert {f["family"] for f in truth["faults"]} == {family}
    vertex_ids = {e["vertex_id"] for e in job.events if e["kind"] == "vertex_metrics"}
    for fault in truth["faults"]:
        assert truth["start_ts"] <= fault["onset_ts"] < truth["end_ts"]
        assert fault["vertex_id"] is None or fault["vertex_id"] in vertex_ids


def test_same_seed_same_events_other_seed_other_events():
    first = simulate_job("backpressure_slow_operator", seed=7, duration_ms=30 * 60_000)
    again = simulate_job("backpressure_slow_operator", seed=7, duration_ms=30 * 60_000)
    other = simulate_job("backpressure_slow_operator", seed=8, duration_ms=30 * 60_000)
    assert first.events == again.events and first.truth == again.truth
    assert first.events != other.events
    assert first.truth["job_id"] != other.truth["job_id"]


# --- realism ----------------------------------------------------------------------------------


def test_reporting_has_the_gaps_and_nulls_real_flink_has():
    job = run("healthy_steady")
    sources = [e for e in job.events if e["kind"] == "vertex_metrics" and e["vertex_name"].startswith("Source")]
    assert sources and all(s["busy_time_ms_per_s"] is None for e in sources for s in e["subtasks"])
    polls = [e["ts"] for e in job.events if e["kind"] == "job_status"]
    gaps = [b - a for a, b in zip(polls, polls[1:])]
    assert min(gaps) == 15_000 and max(gaps) >= 30_000  # a missed poll
    others = [s for e in job.events if e["kind"] == "vertex_metrics" and e not in sources for s in e["subtasks"]]
    nulls = sum(s["idle_time_ms_per_s"] is None for s in others)
    assert 0 < nulls < 0.05 * len(others)
    for s in others:
        parts = [s["busy_time_ms_per_s"], s["backpressured_time_ms_per_s"], s["idle_time_ms_per_s"]]
        if None not in parts:
            assert 900 <= sum(parts) <= 1100  # the three time ratios share each second


# --- state leaks ---------------------------------------------------------------------------------


def test_seed_000_replays_the_reported_sizes_then_fails_on_the_memory_backend():
    job = run("leak_seed000")
    all_checkpoints = checkpoints(job, status=None)
    completed = [c for c in all_checkpoints if c["status"] == "COMPLETED"]
    assert [c["checkpoint_id"] for c in completed] == list(range(1, 10))
    assert [round(c["state_size_bytes"] / MIB, 1) for c in completed] == list(SEED_000_STATE_MB)
    triggers = [c["trigger_ts"] - job.truth["start_ts"] for c in all_checkpoints]
    assert triggers[:12] == [10_000 * i for i in range(1, 13)]
    failed = all_checkpoints[9:]
    assert failed and all(c["status"] == "FAILED" for c in failed)
    prefix = MEMORY_BACKEND_MESSAGE.split("Size=")[0]
    assert all(c["failure_message"].startswith(prefix) and f"maxSize={SEED_000_MAX_STATE_BYTES} ." in c["failure_message"]
               for c in failed)
    statuses = [e for e in job.events if e["kind"] == "job_status"]
    assert {s["max_state_size_bytes"] for s in statuses} == {5 * MIB}
    assert {s["checkpoint_interval_ms"] for s in statuses} == {10_000}


def test_linear_leak_grows_with_r2_near_one_after_onset_and_is_flat_before():
    job = run("leak_linear")
    vertex = job.truth["faults"][0]["vertex_name"]
    after = vertex_series(job, vertex, since=onset(job) + 5 * 60_000)
    slope, r2 = fit([t for t, _, _ in after], [s for _, s, _ in after])
    assert slope > 0 and r2 > 0.97
    before = vertex_series(job, vertex, until=onset(job))
    sizes = [s for _, s, _ in before]
    assert max(sizes) / min(sizes) < 1.1


def test_accelerating_leak_speeds_up():
    job = run("leak_accelerating")
    vertex = job.truth["faults"][0]["vertex_name"]
    series = vertex_series(job, vertex, since=onset(job))
    half = len(series) // 2
    early, _ = fit([t for t, _, _ in series[:half]], [s for _, s, _ in series[:half]])
    late, _ = fit([t for t, _, _ in series[half:]], [s for _, s, _ in series[half:]])
    assert late > 1.5 * early > 0


def test_slow_leak_hides_inside_the_noise_of_single_steps():
    job = run("leak_slow")
    vertex = job.truth["faults"][0]["vertex_name"]
    series = vertex_series(job, vertex, since=onset(job))
    steps = [(b[1] - a[1]) / a[1] for a, b in zip(series, series[1:])]
    assert statistics.median(steps) < 0.01  # well under 1% per checkpoint
    assert sum(s < 0 for s in steps) > 0.2 * len(steps)  # jitter makes many steps go down
    assert series[-1][1] > 1.5 * series[0][1]  # yet it grows over the run


def test_one_leaking_operator_among_several():
    job = run("leak_one_operator")
    leaky = job.truth["faults"][0]["vertex_name"]
    stateful = {v["vertex_name"] for v in checkpoints(job)[0]["vertices"] if v["state_size_bytes"] > 0}
    assert len(stateful) == 3 and leaky in stateful
    for name in stateful:
        series = vertex_series(job, name, since=onset(job))
        growth = series[-1][1] / series[0][1]
        assert (growth > 1.3) if name == leaky else (0.95 < growth < 1.05), name


def test_incremental_checkpoints_hide_the_leak_that_full_state_shows():
    job = run("leak_incremental_hidden")
    vertex = job.truth["faults"][0]["vertex_name"]
    series = vertex_series(job, vertex, since=onset(job))
    _, r2_full = fit([t for t, _, _ in series], [s for _, s, _ in series])
    assert series[-1][1] > 1.3 * series[0][1] and r2_full > 0.97
    persisted = [c for _, _, c in series]
    slope, _ = fit([t for t, _, _ in series], persisted)
    span = series[-1][0] - series[0][0]
    assert abs(slope * span) < 0.1 * statistics.fmean(persisted)  # checkpointed size stays flat
    assert statistics.fmean(persisted) < 0.5 * statistics.fmean([s for _, s, _ in series])


def test_warmup_grows_then_levels_off():
    job = run("healthy_warmup")
    vertex = next(v["vertex_name"] for v in checkpoints(job)[0]["vertices"] if v["vertex_name"].startswith("Window"))
    start = job.truth["start_ts"]
    early = vertex_series(job, vertex, until=start + 20 * 60_000)
    late = vertex_series(job, vertex, since=start + 120 * 60_000)
    early_slope, _ = fit([t for t, _, _ in early], [s for _, s, _ in early])
    late_slope, _ = fit([t for t, _, _ in late], [s for _, s, _ in late])
    assert early[-1][1] > 2 * early[0][1]
    assert abs(late_slope) < 0.02 * early_slope  # deceleration: a warm-up levels off


def test_seed_001_leaky_cep_keeps_growing_where_the_fixed_one_levels_off():
    leaky, fixed = run("leak_cep_key_rotation"), run("healthy_cep_key_rotation")
    name = "CEP: scans-sequence"
    start = leaky.truth["start_ts"]
    assert onset(leaky) == start + 45 * 60_000
    leak_series = vertex_series(leaky, name, since=start + 60 * 60_000)
    slope, r2 = fit([t for t, _, _ in leak_series], [s for _, s, _ in leak_series])
    assert slope > 0 and r2 > 0.99
    fixed_name = name + " (fixed)"
    fixed_late = [s for _, s, _ in vertex_series(fixed, fixed_name, since=start + 60 * 60_000)]
    assert max(fixed_late) < 1.05 * min(fixed_late)
    # Up to the onset (window plus eviction lag) the two operators hold the same state.
    early_leak = [s for _, s, _ in vertex_series(leaky, name, until=start + 44 * 60_000)]
    early_fixed = [s for _, s, _ in vertex_series(fixed, fixed_name, until=start + 44 * 60_000)]
    assert all(abs(a - b) < 0.05 * max(a, 1) for a, b in zip(early_leak, early_fixed))
    # 8192 keys, an event per key every 10 minutes: linear growth at tens of MB per hour.
    assert 20 * MIB < slope * 3_600_000 < 200 * MIB


# --- backpressure ----------------------------------------------------------------------------------


def test_slow_operator_is_busy_and_its_upstream_backpressured_while_checkpoints_slow_down():
    job = run("backpressure_slow_operator")
    fault = job.truth["faults"][0]
    late = onset(job) + 20 * 60_000
    busy = subtask_metric(job, fault["vertex_name"], "busy_time_ms_per_s", since=late)
    assert min(busy.values()) > 900
    upstream = subtask_metric(job, "Map -> Filter", "backpressured_time_ms_per_s", since=late)
    assert min(upstream.values()) > 700
    before = subtask_metric(job, "Map -> Filter", "backpressured_time_ms_per_s", until=onset(job))
    assert max(before.values()) < 50
    durations_before = [c["end_to_end_duration_ms"] for c in checkpoints(job) if c["ts"] < onset(job)]
    durations_after = [c["end_to_end_duration_ms"] for c in checkpoints(job, None) if c["ts"] > late]
    assert statistics.median(durations_after) > 10 * statistics.median(durations_before)
    alignment = [max(s["alignment_duration_ms"] for v in c["vertices"] for s in v["subtasks"]) for c in checkpoints(job, None)
                 if c["ts"] > late]
    assert statistics.median(alignment) > 1000


def test_backpressure_cascade_pushes_checkpoints_to_the_timeout():
    job = run("backpressure_cascade")
    timeout = next(e["checkpoint_timeout_ms"] for e in job.events if e["kind"] == "job_status")
    after = [c for c in checkpoints(job, None) if c["ts"] > onset(job)]
    third = len(after) // 3
    first, last = after[:third], after[-third:]
    assert statistics.median(c["end_to_end_duration_ms"] for c in last) > 5 * statistics.median(
        c["end_to_end_duration_ms"] for c in first)
    assert any(c["status"] == "FAILED" and c["failure_message"] == "Checkpoint expired before completing."
               for c in last) or max(c["end_to_end_duration_ms"] for c in last) > 0.5 * timeout


def test_unaligned_checkpoints_persist_in_flight_data_instead_of_aligning():
    job = run("backpressure_unaligned")
    before = [c for c in checkpoints(job) if c["ts"] < onset(job)]
    after = [c for c in checkpoints(job) if c["ts"] > onset(job) + 20 * 60_000]
    assert all(c["persisted_data_bytes"] == 0 for c in before)
    assert statistics.median(c["persisted_data_bytes"] for c in after) > 1 * MIB
    assert max(s["alignment_duration_ms"] for c in after for v in c["vertices"] for s in v["subtasks"]) == 0
    assert all(s["unaligned"] for c in after for v in c["vertices"] for s in v["subtasks"])


# --- skew ----------------------------------------------------------------------------------------


def _max_over_mean(values):
    return max(values) / statistics.fmean(values)


def test_hot_key_loads_one_subtask_with_records_and_state():
    job = run("skew_hot_key")
    fault = job.truth["faults"][0]
    records = subtask_metric(job, fault["vertex_name"], "records_in_per_s", since=onset(job) + 120_000)
    assert _max_over_mean(list(records.values())) > 2.0
    assert max(records, key=records.get) == fault["subtask_index"]
    last = checkpoints(job)[-1]
    state = [s["state_size_bytes"] for s in next(v for v in last["vertices"] if v["vertex_name"] == fault["vertex_name"])["subtasks"]]
    assert _max_over_mean(state) > 2.0 and state.index(max(state)) == fault["subtask_index"]
    before = subtask_metric(job, fault["vertex_name"], "records_in_per_s", until=onset(job))
    assert _max_over_mean(list(before.values())) < 1.2


def test_state_only_skew_leaves_records_balanced():
    job = run("skew_state_only")
    fault = job.truth["faults"][0]
    records = subtask_metric(job, fault["vertex_name"], "records_in_per_s", since=onset(job) + 120_000)
    assert _max_over_mean(list(records.values())) < 1.2
    state = [s["state_size_bytes"] for s in next(v for v in checkpoints(job)[-1]["vertices"]
                                                 if v["vertex_name"] == fault["vertex_name"])["subtasks"]]
    assert _max_over_mean(state) > 2.0


def test_join_under_skew_waits_on_the_hot_subtask_barrier():
    job = run("skew_join_alignment")
    fault = job.truth["faults"][0]
    late = [c for c in checkpoints(job) if c["ts"] > onset(job) + 10 * 60_000]
    dominated = 0
    for c in late:
        join = next(v for v in c["vertices"] if v["vertex_name"] == fault["vertex_name"])
        delays = [s["start_delay_ms"] for s in join["subtasks"]]
        hot = delays[fault["subtask_index"]]
        dominated += hot > 20 * max(d for k, d in enumerate(delays) if k != fault["subtask_index"])
    # Input noise lets the hot subtask catch up now and then; it dominates almost always.
    assert dominated >= 0.9 * len(late)


# --- checkpoint failures ----------------------------------------------------------------------------


def test_slow_storage_ends_in_expired_checkpoints_only_after_onset():
    job = run("checkpoint_timeout")
    failed = checkpoints(job, "FAILED")
    assert failed and all(c["trigger_ts"] > onset(job) for c in failed)
    assert {c["failure_message"] for c in failed} == {"Checkpoint expired before completing."}
    assert all(c["end_to_end_duration_ms"] == next(e["checkpoint_timeout_ms"] for e in job.events if e["kind"] == "job_status")
               for c in failed)


def test_transient_storage_errors_fail_some_checkpoints_with_s3_errors():
    job = run("checkpoint_storage_errors")
    after = [c for c in checkpoints(job, None) if c["trigger_ts"] > onset(job)]
    failed = [c for c in after if c["status"] == "FAILED"]
    assert 0.15 < len(failed) / len(after) < 0.6
    assert any("AmazonS3Exception" in c["failure_message"] for c in failed)
    assert not [c for c in checkpoints(job, "FAILED") if c["trigger_ts"] < onset(job)]


def test_sub_second_interval_piles_checkpoints_up_and_the_jobmanager_fails_over():
    job = run("checkpoint_pileup")
    statuses = [e for e in job.events if e["kind"] == "job_status"]
    assert {s["checkpoint_interval_ms"] for s in statuses} == {500}
    assert statistics.fmean(s["checkpoints_in_progress"] for s in statuses) > 3
    heap = [s["jm_heap_used_bytes"] / s["jm_heap_max_bytes"] for s in statuses]
    assert max(heap) > 0.8 and heap[0] < 0.6
    assert statuses[-1]["num_restarts"] >= 1
    assert any("OutOfMemoryError" in (c["failure_message"] or "") for c in checkpoints(job, "FAILED"))


def test_restart_loop_restarts_again_and_again():
    job = run("checkpoint_restart_loop")
    statuses = [e for e in job.events if e["kind"] == "job_status"]
    assert statuses[-1]["num_restarts"] >= 3
    assert "RESTARTING" in {s["state"] for s in statuses}
    assert all(s["num_restarts"] == 0 for s in statuses if s["ts"] < onset(job))
    assert any(c["failure_message"].startswith("Checkpoint was declined (task failed)") for c in checkpoints(job, "FAILED"))


def test_healthy_restart_and_rescale_keep_state_and_raise_no_label():
    restart = run("healthy_restart")
    statuses = [e for e in restart.events if e["kind"] == "job_status"]
    # A redeploy from a savepoint: metrics pause, but Flink counts no failover.
    assert "RESTARTING" in {e["state"] for e in statuses}
    assert statuses[-1]["num_restarts"] == 0 and restart.truth["faults"] == []
    rescale = run("healthy_rescale")
    parallelism = [e["parallelism"] for e in rescale.events
                   if e["kind"] == "vertex_metrics" and e["vertex_name"].startswith("Window")]
    assert parallelism[0] == 4 and parallelism[-1] == 8
    sizes = [c["state_size_bytes"] for c in checkpoints(rescale)]
    assert max(sizes) < 1.1 * min(sizes)
