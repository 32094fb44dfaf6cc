"""The scenario catalogue: healthy jobs and every failure family, each a parameterised job model.

A builder draws the job's shape (parallelism, state, rates, checkpoint settings) from the job's
own seeded generator, so a fleet of one scenario is a set of different but comparable jobs, and
the same seed always gives the same jobs. Onsets are placed relative to the run's duration.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from pipelines.simulator import faults as F
from pipelines.simulator.job import JobSpec, VertexSpec

MIB = 1024 * 1024
MINUTE = 60_000
HOUR = 60 * MINUTE

# Seed 000 (FLINK-4326 style report): the Flink UI's state sizes of checkpoints 1..9, in MB
# as the web UI prints them (1 MB = 1024 * 1024 bytes), a 10 s interval, parallelism 4, and the
# memory state backend's 5 MiB maximum per subtask snapshot.
SEED_000_STATE_MB = (11.3, 20.9, 30.6, 41.4, 52.6, 62.5, 71.5, 83.3, 93.5)
SEED_000_MAX_STATE_BYTES = 5 * MIB

Builder = Callable[[random.Random, int], tuple[JobSpec, list]]


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str | None  # None: healthy
    description: str
    default_duration_ms: int
    build: Builder


def _pipeline(rng: random.Random, name: str, *, parallelism: int | None = None, state_mb: float | None = None,
              load: float | None = None, **job) -> JobSpec:
    """Source -> Map -> keyed stateful operator -> Sink, with plausible, seeded sizes."""
    p = parallelism or rng.choice((2, 4, 4, 8))
    window_capacity = rng.uniform(6_000, 12_000)
    rate = (load or rng.uniform(0.25, 0.55)) * window_capacity * p
    state = (state_mb if state_mb is not None else rng.uniform(8, 160)) * MIB
    vertices = (
        VertexSpec("Source: Kafka", max(1, p // 2), capacity_rps=80_000, source=True),
        VertexSpec("Map -> Filter", p, capacity_rps=40_000, selectivity=rng.uniform(0.7, 1.0)),
        VertexSpec(job.pop("stateful_name", "Window(TumblingEventTimeWindows(60000))"), p,
                   capacity_rps=window_capacity, state_bytes=state, selectivity=0.05),
        VertexSpec("Sink: Kafka", p, capacity_rps=30_000),
    )
    defaults = dict(
        input_rate=rate,
        checkpoint_interval_ms=rng.choice((10_000, 30_000, 60_000)),
        checkpoint_timeout_ms=rng.choice((120_000, 300_000, 600_000)),
        incremental=rng.random() < 0.5,
        rate_pattern=rng.choice(("steady", "steady", "daily")),
    )
    defaults.update(job)
    return JobSpec(job_name=name, vertices=vertices, **defaults)


def _onset(rng: random.Random, duration_ms: int, low: float = 0.15, high: float = 0.4) -> int:
    return int(duration_ms * rng.uniform(low, high))


STATEFUL = 2  # index of the keyed stateful operator in _pipeline
# Seed 001's CEP operator: a 30-min pattern window plus up to 15 min of lazy eviction, declared
# by its operator as the time its state may grow (the leaky twin's operator declares the same).
CEP_HORIZON_MS = 50 * MINUTE


# --- healthy -----------------------------------------------------------------------------------

def healthy_steady(rng, duration_ms):
    return _pipeline(rng, "orders-enrichment"), []


def healthy_warmup(rng, duration_ms):
    # A 30-minute window with TTL'd keys: fills for ~45 minutes, then eviction balances arrival.
    warmup = rng.randint(35, 55) * MINUTE
    return _pipeline(rng, "session-windows", warmup_ms=warmup, warmup_horizon_ms=int(warmup * 1.5),
                     stateful_name="Window(SlidingEventTimeWindows(1800000, 60000))"), []


def healthy_window_fill(rng, duration_ms):
    warmup = rng.randint(30, 50) * MINUTE
    return _pipeline(rng, "hourly-aggregates", warmup_ms=warmup, warmup_shape="window_fill",
                     warmup_horizon_ms=warmup + 5 * MINUTE, stateful_name="Window(TumblingEventTimeWindows(1800000))"), []


def healthy_cep_key_rotation(rng, duration_ms):
    spec = _pipeline(rng, "cep-scans-fixed", parallelism=2, state_mb=0, load=0.05, checkpoint_interval_ms=60_000,
                     stateful_name="CEP: scans-sequence (fixed)", fresh_start=True, warmup_horizon_ms=CEP_HORIZON_MS)
    return spec, [F.KeyRotationState(vertex=STATEFUL, leaky=False, family=None)]


def healthy_bursty(rng, duration_ms):
    return _pipeline(rng, "clickstream", rate_pattern="bursty", load=rng.uniform(0.15, 0.3)), []


def healthy_restart(rng, duration_ms):
    return _pipeline(rng, "payments-dedup"), [F.PlannedRestart(onset_ms=_onset(rng, duration_ms, 0.3, 0.7))]


def healthy_rescale(rng, duration_ms):
    spec = _pipeline(rng, "inventory-join", parallelism=4)
    return spec, [F.Rescale(onset_ms=_onset(rng, duration_ms, 0.3, 0.7), vertex=STATEFUL, parallelism=8)]


# --- state leaks -------------------------------------------------------------------------------

def leak_linear(rng, duration_ms):
    spec = _pipeline(rng, "user-profiles", stateful_name="KeyedProcess: profile-state")
    per_subtask = spec.vertices[STATEFUL].state_bytes * rng.uniform(0.3, 1.2)
    return spec, [F.StateLeak(onset_ms=_onset(rng, duration_ms), vertex=STATEFUL, bytes_per_hour=per_subtask,
                              description="keys are never cleared (no TTL)")]


def leak_accelerating(rng, duration_ms):
    spec = _pipeline(rng, "device-sessions", stateful_name="KeyedProcess: sessions")
    per_subtask = spec.vertices[STATEFUL].state_bytes * rng.uniform(0.1, 0.3)
    return spec, [F.StateLeak(onset_ms=_onset(rng, duration_ms), vertex=STATEFUL, bytes_per_hour=per_subtask,
                              acceleration_per_hour=rng.uniform(2, 5), description="key space grows with traffic")]


def leak_slow(rng, duration_ms):
    spec = _pipeline(rng, "fraud-features", checkpoint_interval_ms=30_000, stateful_name="KeyedProcess: features")
    # ~0.2% of the state per checkpoint: below the 1% jitter of a single step.
    per_subtask = spec.vertices[STATEFUL].state_bytes * 0.002 * (HOUR / spec.checkpoint_interval_ms)
    return spec, [F.StateLeak(onset_ms=_onset(rng, duration_ms, 0.05, 0.2), vertex=STATEFUL,
                              bytes_per_hour=per_subtask, description="slow leak inside the noise")]


def leak_one_operator(rng, duration_ms):
    p = rng.choice((2, 4))
    capacity = rng.uniform(6_000, 12_000)
    vertices = (
        VertexSpec("Source: Kafka", max(1, p // 2), capacity_rps=80_000, source=True),
        VertexSpec("KeyedProcess: dedup", p, capacity_rps=capacity * 2, state_bytes=rng.uniform(20, 80) * MIB),
        VertexSpec("Window(TumblingEventTimeWindows(300000))", p, capacity_rps=capacity,
                   state_bytes=rng.uniform(20, 80) * MIB, selectivity=0.1),
        VertexSpec("KeyedProcess: alerts", p, capacity_rps=capacity * 2, state_bytes=rng.uniform(5, 30) * MIB),
        VertexSpec("Sink: Elasticsearch", p, capacity_rps=20_000),
    )
    leaky = rng.choice((1, 3))
    spec = JobSpec("alerting-pipeline", vertices, input_rate=0.35 * capacity * p,
                   checkpoint_interval_ms=rng.choice((30_000, 60_000)), checkpoint_timeout_ms=600_000,
                   incremental=rng.random() < 0.5)
    return spec, [F.StateLeak(onset_ms=_onset(rng, duration_ms), vertex=leaky,
                              bytes_per_hour=vertices[leaky].state_bytes * rng.uniform(0.5, 1.5),
                              description="one operator of several leaks")]


def leak_incremental_hidden(rng, duration_ms):
    spec = _pipeline(rng, "rocksdb-joins", incremental=True, rate_pattern="steady",
                     stateful_name="KeyedCoProcess: join-buffer")
    per_subtask = spec.vertices[STATEFUL].state_bytes * rng.uniform(0.4, 1.0)
    return spec, [F.StateLeak(onset_ms=_onset(rng, duration_ms), vertex=STATEFUL, bytes_per_hour=per_subtask,
                              description="full state grows; incremental checkpoint size stays flat")]


def leak_seed000(rng, duration_ms):
    vertices = (
        VertexSpec("Source: Kinesis", 2, capacity_rps=50_000, source=True),
        VertexSpec("Fold: property_id, player -> 10-minute Sliding-Window Percentile Aggregation -> Sink: InfluxDB",
                   4, capacity_rps=9_000, selectivity=0.01),
    )
    spec = JobSpec("kinesis-percentiles", vertices, input_rate=6_000, checkpoint_interval_ms=10_000,
                   checkpoint_timeout_ms=600_000, poll_interval_ms=10_000, incremental=False,
                   max_state_size_bytes=SEED_000_MAX_STATE_BYTES, rate_pattern="steady",
                   fresh_start=True)  # the report's checkpoint ids are 1..9
    sizes = tuple(round(mb * MIB) for mb in SEED_000_STATE_MB)
    failure = F.MEMORY_BACKEND_MESSAGE.replace("{limit}", str(SEED_000_MAX_STATE_BYTES))
    return spec, [F.ReplayedCheckpointSizes(onset_ms=0, vertex=1, sizes_bytes=sizes, failure=failure,
                                            description="seed 000: window state grows ~10 MB per checkpoint")]


def leak_cep_key_rotation(rng, duration_ms):
    spec = _pipeline(rng, "cep-scans-leaky", parallelism=2, state_mb=0, load=0.05, checkpoint_interval_ms=60_000,
                     stateful_name="CEP: scans-sequence", fresh_start=True, warmup_horizon_ms=CEP_HORIZON_MS)
    fault = F.KeyRotationState(vertex=STATEFUL, leaky=True,
                               description="seed 001: expired CEP partial matches of retired keys are never removed")
    # The fixed operator's eviction lags by up to cleanup_lag_s, so the curves only part once the
    # window plus that lag has passed (t = 30 + 15 * t / 45 min gives 45 min).
    fault.onset_ms = int((fault.window_s + fault.cleanup_lag_s) * 1000)
    return spec, [fault]


# --- backpressure ------------------------------------------------------------------------------

def backpressure_slow_operator(rng, duration_ms):
    spec = _pipeline(rng, "geo-enrichment", load=rng.uniform(0.4, 0.6), stateful_name="AsyncIO: geo-lookup")
    return spec, [F.SlowOperator(onset_ms=_onset(rng, duration_ms), vertex=STATEFUL,
                                 final_capacity_factor=rng.uniform(0.03, 0.15), ramp_ms=rng.randint(3, 12) * MINUTE,
                                 description="the lookup service slowed down")]


def backpressure_cascade(rng, duration_ms):
    spec = _pipeline(rng, "metrics-rollup", load=rng.uniform(0.5, 0.7), incremental=False,
                     checkpoint_timeout_ms=300_000)
    return spec, [F.SlowOperator(onset_ms=_onset(rng, duration_ms), vertex=STATEFUL,
                                 final_capacity_factor=rng.uniform(0.3, 0.6), ramp_ms=10 * MINUTE, cascade=True,
                                 description="seed 004: slow checkpoints hold buffers longer, deepening backpressure")]


def backpressure_unaligned(rng, duration_ms):
    spec = _pipeline(rng, "ad-attribution", load=rng.uniform(0.4, 0.6), unaligned=True)
    return spec, [F.SlowOperator(onset_ms=_onset(rng, duration_ms), vertex=STATEFUL,
                                 final_capacity_factor=rng.uniform(0.03, 0.15), ramp_ms=rng.randint(3, 12) * MINUTE,
                                 description="seed 003: unaligned checkpoints persist in-flight data instead of aligning")]


# --- skew --------------------------------------------------------------------------------------

def skew_hot_key(rng, duration_ms):
    p = rng.choice((4, 8))
    spec = _pipeline(rng, "tenant-usage", parallelism=p, load=rng.uniform(0.08, 0.12),
                     stateful_name="KeyedProcess: per-tenant")
    hot = rng.randrange(p)
    return spec, [F.HotKey(onset_ms=_onset(rng, duration_ms), vertex=STATEFUL, subtask=hot,
                           hot_share=rng.uniform(0.6, 0.85), description="one tenant dominates the traffic")]


def skew_join_alignment(rng, duration_ms):
    p = rng.choice((2, 4))
    capacity = rng.uniform(6_000, 10_000)
    vertices = (
        VertexSpec("Source: clicks", max(1, p // 2), capacity_rps=80_000, source=True, rate_share=0.9),
        VertexSpec("Source: impressions", max(1, p // 2), capacity_rps=80_000, source=True, rate_share=0.1),
        VertexSpec("IntervalJoin: clicks x impressions", p, capacity_rps=capacity, state_bytes=rng.uniform(30, 120) * MIB,
                   inputs=(0, 1), selectivity=0.2),
        VertexSpec("Sink: Kafka", p, capacity_rps=30_000),
    )
    hot_share = rng.uniform(0.7, 0.9)
    # After the onset the hot subtask gets a bit more than it can process; before, the job idles.
    spec = JobSpec("click-attribution", vertices, input_rate=rng.uniform(1.1, 1.3) * capacity / hot_share,
                   checkpoint_interval_ms=30_000, checkpoint_timeout_ms=600_000)
    hot = rng.randrange(p)
    return spec, [F.HotKey(onset_ms=_onset(rng, duration_ms), vertex=2, subtask=hot, hot_share=hot_share,
                           description="the hot input of a two-input join: one subtask's barrier alignment dominates")]


def skew_state_only(rng, duration_ms):
    p = rng.choice((4, 8))
    spec = _pipeline(rng, "entity-graph", parallelism=p, stateful_name="KeyedProcess: adjacency")
    hot = rng.randrange(p)
    return spec, [F.HotKey(onset_ms=_onset(rng, duration_ms), vertex=STATEFUL, subtask=hot,
                           hot_share=rng.uniform(0.6, 0.85), records=False,
                           description="a few huge keys: state skew without record skew")]


# --- checkpoint failures -----------------------------------------------------------------------

def checkpoint_timeout(rng, duration_ms):
    spec = _pipeline(rng, "ledger-aggregation", checkpoint_timeout_ms=rng.choice((60_000, 120_000)))
    return spec, [F.SlowCheckpointStorage(onset_ms=_onset(rng, duration_ms),
                                          final_latency_ms=spec.checkpoint_timeout_ms * rng.uniform(1.2, 2.0),
                                          ramp_ms=rng.randint(10, 30) * MINUTE,
                                          description="checkpoint storage slows down until checkpoints expire")]


def checkpoint_storage_errors(rng, duration_ms):
    spec = _pipeline(rng, "kda-orders", incremental=True)
    return spec, [F.TransientStorageErrors(onset_ms=_onset(rng, duration_ms), failure_probability=rng.uniform(0.25, 0.5),
                                           description="seed 002: transient S3 errors fail checkpoints")]


def checkpoint_pileup(rng, duration_ms):
    spec = _pipeline(rng, "ci-smoke-job", state_mb=rng.uniform(20, 60), checkpoint_interval_ms=500,
                     max_concurrent_checkpoints=20, checkpoint_timeout_ms=60_000, poll_interval_ms=10_000,
                     upload_bytes_per_s=10e6, incremental=False, jm_heap_max_bytes=512 * MIB)
    return spec, [F.JobManagerHeapPressure(onset_ms=0, growth_bytes_per_hour=rng.uniform(1.0, 2.0) * 1e9,
                                           description="seed 004: sub-second interval, checkpoints pile up, JobManager heap climbs")]


def checkpoint_restart_loop(rng, duration_ms):
    spec = _pipeline(rng, "payments-router", checkpoint_interval_ms=30_000)
    return spec, [F.RestartLoop(onset_ms=_onset(rng, duration_ms), vertex=STATEFUL, subtask=0,
                                period_ms=rng.randint(3, 6) * MINUTE, downtime_ms=rng.randint(20, 60) * 1000,
                                description="a task fails again after every restart")]


CATALOGUE: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("healthy_steady", None, "steady job at a settled state size", 2 * HOUR, healthy_steady),
        Scenario("healthy_warmup", None, "30-min windows filling for ~45 min after start, then level", 3 * HOUR, healthy_warmup),
        Scenario("healthy_window_fill", None, "state fills linearly for one window, then flat", 2 * HOUR, healthy_window_fill),
        Scenario("healthy_cep_key_rotation", None, "seed 001 with the fix: rotating keys, CEP state levels off after ~45 min", 3 * HOUR, healthy_cep_key_rotation),
        Scenario("healthy_bursty", None, "bursty input, spare capacity", 2 * HOUR, healthy_bursty),
        Scenario("healthy_restart", None, "a planned restart in the middle", 2 * HOUR, healthy_restart),
        Scenario("healthy_rescale", None, "the stateful operator rescaled 4 -> 8 in the middle", 2 * HOUR, healthy_rescale),
        Scenario("leak_linear", "state_leak", "keyed state grows linearly from the onset (no TTL)", 2 * HOUR, leak_linear),
        Scenario("leak_accelerating", "state_leak", "state growth that speeds up", 2 * HOUR, leak_accelerating),
        Scenario("leak_slow", "state_leak", "~0.2% growth per checkpoint, inside the noise", 3 * HOUR, leak_slow),
        Scenario("leak_one_operator", "state_leak", "one stateful operator of three leaks", 2 * HOUR, leak_one_operator),
        Scenario("leak_incremental_hidden", "state_leak", "leak visible in full state only; incremental checkpoints flat", 2 * HOUR, leak_incremental_hidden),
        Scenario("leak_seed000", "state_leak", "seed 000 replayed: 11.3 .. 93.5 MB at 10 s, then memory-backend failures", 4 * MINUTE, leak_seed000),
        Scenario("leak_cep_key_rotation", "state_leak", "seed 001: CEP keeps expired keys, linear growth past ~45 min", 3 * HOUR, leak_cep_key_rotation),
        Scenario("backpressure_slow_operator", "backpressure", "an operator slows below the input rate", 2 * HOUR, backpressure_slow_operator),
        Scenario("backpressure_cascade", "backpressure", "seed 004 cascade: slow checkpoints deepen backpressure", 2 * HOUR, backpressure_cascade),
        Scenario("backpressure_unaligned", "backpressure", "seed 003: unaligned checkpoints, in-flight data grows", 2 * HOUR, backpressure_unaligned),
        Scenario("skew_hot_key", "skew", "a hot key puts most records and state on one subtask", 2 * HOUR, skew_hot_key),
        Scenario("skew_join_alignment", "skew", "two-input join, one input hot: one subtask's start delay dominates", 2 * HOUR, skew_join_alignment),
        Scenario("skew_state_only", "skew", "state skew without record skew", 2 * HOUR, skew_state_only),
        Scenario("checkpoint_timeout", "checkpoint_failure", "storage slows until checkpoints expire", 2 * HOUR, checkpoint_timeout),
        Scenario("checkpoint_storage_errors", "checkpoint_failure", "seed 002: transient S3 errors", 2 * HOUR, checkpoint_storage_errors),
        Scenario("checkpoint_pileup", "checkpoint_failure", "seed 004: 500 ms interval, checkpoints pile up, JobManager heap climbs", 30 * MINUTE, checkpoint_pileup),
        Scenario("checkpoint_restart_loop", "checkpoint_failure", "a task fails after every restart", HOUR, checkpoint_restart_loop),
    ]
}
