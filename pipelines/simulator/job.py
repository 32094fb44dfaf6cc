"""A small model of a running Flink job that emits the events the collector would publish.

The model is deliberately mechanical, so that each failure mode arises the way it does in Flink
rather than being painted on:

* **Throughput and backpressure.** Each vertex's subtasks have a capacity (records/s at 100%
  busy). Records are spread over subtasks by key shares. When the most loaded subtask of some
  vertex cannot keep up, the whole job is throttled to what it can do (credit-based flow control
  propagates to the sources): that subtask is busy ~1000 ms/s, upstream subtasks spend their
  time backpressured, downstream ones idle.
* **Checkpoints.** A barrier waits behind the in-flight buffers of a backpressured channel
  (start delay), aligned checkpoints wait for the slowest input (alignment), unaligned ones
  persist the in-flight data instead. Sync and async phases scale with the state written.
  A checkpoint slower than the timeout expires; with one concurrent checkpoint the next trigger
  waits for the running one.
* **State.** Per stateful subtask: a steady level, an optional warm-up (windows filling,
  TTL not yet expiring), plus whatever the faults add. Incremental checkpoints persist roughly
  the bytes written since the last checkpoint, not the full state.
* **Reporting.** Per-second metrics are one-minute moving averages, as Flink's meters are;
  sources report busy time as NaN (null); polls are occasionally missed; values jitter. How a
  job's metrics read around a (re)start follows :class:`Reporting`: :data:`FLINK_2_3`, measured
  on the lab's real Flink 2.3 jobs (the default), or :data:`IDEALISED`, the model before it was
  calibrated (kept to show what the calibration changed).

Faults (``pipelines/simulator/faults.py``) hook into these quantities. Everything is driven by
event time from a seeded ``random.Random``: the same seed gives the same events.

One piece: the model is one simulation step (:class:`JobSimulation`, most of the file) whose
throughput, checkpoints, state and reporting read one another's quantities at every tick, and
one random stream whose draws, in their order, fix every event; the specs and samples around it
are its inputs and outputs.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Iterator, Protocol

from feature_store.event_order import time_order
from pipelines.contracts import SCHEMA_VERSION

METRIC_FIELDS = ("busy_time_ms_per_s", "backpressured_time_ms_per_s", "idle_time_ms_per_s", "records_in_per_s",
                 "records_out_per_s", "in_pool_usage", "out_pool_usage", "checkpoint_start_delay_ms",
                 "checkpoint_alignment_time_ms")
RECORD_BYTES = 600  # serialized size of a record in network buffers
# In-flight data ahead of a barrier on a backpressured path: 32 KiB buffers, ~10 per channel,
# a dozen channels per subtask along the path (4 MiB).
NETWORK_BUFFER_BYTES = 32 * 1024 * 10 * 12 + 64 * 1024


@dataclass(frozen=True)
class Reporting:
    """How a job's metrics read around a (re)start, as Flink reports them."""

    name: str
    # Checkpoint ids count from the job's start: a job running for hours has large ids.
    checkpoint_ids_from_start: bool = True
    # Operators report busy 1000 ms/s while they start (PyFlink's Python workers take ~10 s,
    # Java operators about a second): drawn per job from this range, in seconds.
    startup_busy_s: tuple[float, float] = (1.0, 15.0)
    # Per-second rates are 60 s meters: after a (re)start they ramp up from 0 over a minute.
    meters_ramp_up: bool = True
    # Busy, backpressured and idle time (and buffer usage, barrier times) are short averages
    # (Flink's 5 s metric views), not minute-long ones.
    time_window_s: float = 5.0
    # After starting, operators work off what queued meanwhile: busy fades to normal over this
    # many times the start-up time.
    catch_up_factor: float = 2.0
    # Idle buffers: input pools read 0, output pools a few percent (the lab's operators: median 0.05).
    idle_in_pool_usage: float = 0.0
    idle_out_pool_usage: float = 0.05
    # The first poll after a (re)start has no values yet (the metric fetcher has not run).
    first_poll_empty: bool = True
    # Checkpoints triggered before every task runs fail; counted, never in the history.
    startup_trigger_failures: tuple[int, int] = (0, 4)


IDEALISED = Reporting("idealised", checkpoint_ids_from_start=False, startup_busy_s=(0.0, 0.0), meters_ramp_up=False,
                      time_window_s=60.0, catch_up_factor=0.0, idle_in_pool_usage=0.05, idle_out_pool_usage=0.05,
                      first_poll_empty=False,
                      startup_trigger_failures=(0, 0))
FLINK_2_3 = Reporting("flink-2.3")
REPORTINGS = {r.name: r for r in (IDEALISED, FLINK_2_3)}
# A job that runs before the simulation starts has been up this long (its checkpoint ids say so).
UPTIME_BEFORE_MS = 6 * 3_600_000


@dataclass(frozen=True)
class VertexSpec:
    name: str
    parallelism: int
    capacity_rps: float  # records/s one subtask processes at 100% busy
    state_bytes: float = 0.0  # steady full state per subtask (0: stateless)
    selectivity: float = 1.0  # records out per record in
    source: bool = False
    inputs: tuple[int, ...] | None = None  # upstream vertex indexes; None: the previous vertex
    write_bytes_per_record: float = 40.0  # state bytes changed per record (incremental checkpoints)
    rate_share: float = 1.0  # sources: fraction of the job's input rate this source reads


@dataclass(frozen=True)
class JobSpec:
    job_name: str
    vertices: tuple[VertexSpec, ...]
    cluster: str = "sim"
    input_rate: float = 3000.0  # records/s into the sources
    rate_pattern: str = "steady"  # steady | daily | bursty
    rate_noise: float = 0.04
    checkpoint_interval_ms: int = 30_000
    checkpoint_timeout_ms: int = 600_000
    max_concurrent_checkpoints: int = 1
    incremental: bool = False
    unaligned: bool = False
    poll_interval_ms: int = 15_000
    max_state_size_bytes: int | None = None
    upload_bytes_per_s: float = 150e6
    warmup_ms: int = 0  # 0: the job has been running long before the simulation starts
    fresh_start: bool | None = None  # the job starts with the simulation (default: when it warms up)
    warmup_horizon_ms: int | None = None  # what its operator declares: how long healthy state grows after a start
    warmup_shape: str = "saturating"  # saturating | window_fill
    missing_poll_probability: float = 0.02
    null_metric_probability: float = 0.01
    jm_heap_max_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if not self.vertices or not self.vertices[0].source:
            raise ValueError(f"{self.job_name}: the first vertex must be a source")
        for v in self.vertices:
            if v.parallelism < 1 or v.capacity_rps <= 0:
                raise ValueError(f"{self.job_name}: vertex {v.name} needs parallelism >= 1 and capacity > 0")
        if self.checkpoint_interval_ms < 10 or self.checkpoint_timeout_ms <= 0:
            raise ValueError(f"{self.job_name}: checkpoint interval must be >= 10 ms and timeout > 0")
        if self.rate_pattern not in ("steady", "daily", "bursty"):
            raise ValueError(f"{self.job_name}: unknown rate pattern {self.rate_pattern!r}")


@dataclass
class SubtaskSample:
    """Instantaneous per-subtask quantities at one moment; averaged into the reported metrics."""

    busy: float  # ms/s
    backpressured: float
    idle: float
    records_in: float
    records_out: float
    in_pool: float
    out_pool: float
    start_delay_ms: float
    alignment_ms: float


@dataclass
class Tick:
    """What the faults may change at one moment of event time."""

    t_ms: int
    capacity_factor: list[float]  # per vertex
    record_shares: list[list[float]]  # per vertex, per subtask (sum 1)
    state_shares: list[list[float]]
    state_extra: list[list[float]]  # bytes added per vertex, subtask (jitters like the rest)
    state_exact: list[list[float]] = field(default_factory=list)  # bytes added verbatim (a replayed report)
    inflight_factor: float = 1.0  # >1: buffers held longer (backpressure cascade)
    storage_latency_ms: float = 0.0
    heap_extra_bytes: float = 0.0


class Fault(Protocol):
    family: str
    onset_ms: int
    vertex: int | None
    subtask: int | None

    def active(self, t_ms: int) -> bool: ...

    def apply(self, tick: Tick, job: "JobSimulation") -> None: ...

    def checkpoint_failure(self, t_ms: int, job: "JobSimulation") -> str | None: ...


def _uniform(n: int) -> list[float]:
    return [1.0 / n] * n


def _hex_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


@dataclass
class JobSimulation:
    """Simulate one job from ``start_ts`` for ``duration_ms`` and yield its events in time order."""

    spec: JobSpec
    faults: list = field(default_factory=list)
    seed: str = "0"
    start_ts: int = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    source_label: str = "simulator"
    reporting: Reporting = FLINK_2_3

    @property
    def fresh(self) -> bool:
        return self.spec.fresh_start if self.spec.fresh_start is not None else self.spec.warmup_ms > 0

    def __post_init__(self) -> None:
        self.rng = random.Random(f"job:{self.seed}")
        self.job_id = _hex_id(self.rng)
        self.vertex_ids = [_hex_id(self.rng) for _ in self.spec.vertices]
        self.parallelism = [v.parallelism for v in self.spec.vertices]
        self.num_restarts = 0
        self.restarting_until_ms = -1
        self.completed_total = 0
        self.failed_total = 0
        self.in_progress: list[tuple[int, int]] = []  # (trigger_ms, end_ms)
        self.next_checkpoint_id = 1
        self.last_state: list[list[float]] = [[0.0] * p for p in self.parallelism]
        self._history: deque[list[list[SubtaskSample]]] = deque()
        self._bursts: list[tuple[int, int, float]] = []
        self._pressure = 0.0
        # From a generator of its own, so the reporting never changes the job itself.
        reporting, draws = self.reporting, random.Random(f"reporting:{self.seed}")
        self.startup_busy_ms = int(1000 * draws.uniform(*reporting.startup_busy_s))
        self._startup_failures = draws.randint(*reporting.startup_trigger_failures)
        self.started_ms: int | None = None  # the latest (re)start inside the simulation
        self._polled_since_start = True
        if self.fresh:
            self._start(0)
        elif reporting.checkpoint_ids_from_start:
            self.next_checkpoint_id = 1 + UPTIME_BEFORE_MS // self.spec.checkpoint_interval_ms

    def _start(self, t_ms: int) -> None:
        """The job (re)starts running at ``t_ms``: start-up busy time, meters from zero, an empty
        first poll, checkpoint triggers that fail before every task runs."""
        self.started_ms = t_ms
        self._polled_since_start = not self.reporting.first_poll_empty
        self.failed_total += self._startup_failures if t_ms == 0 else min(1, self._startup_failures)

    # --- inputs --------------------------------------------------------------------------------

    def _upstream(self, index: int) -> tuple[int, ...]:
        spec = self.spec.vertices[index]
        if spec.source:
            return ()
        return spec.inputs if spec.inputs is not None else (index - 1,)

    def input_rate(self, t_ms: int) -> float:
        spec = self.spec
        rate = spec.input_rate
        if spec.rate_pattern == "daily":
            hours = (self.start_ts + t_ms) / 3_600_000.0
            rate *= 1.0 + 0.45 * math.sin(2 * math.pi * (hours - 9) / 24.0)
        elif spec.rate_pattern == "bursty":
            rate *= 1.0 + sum(amp for start, end, amp in self._bursts if start <= t_ms < end)
        return max(0.0, rate * (1.0 + self.rng.gauss(0, spec.rate_noise)))

    def _plan_bursts(self, duration_ms: int) -> None:
        if self.spec.rate_pattern != "bursty":
            return
        t = 0
        while t < duration_ms:
            t += int(self.rng.expovariate(1 / 900_000))  # a burst every ~15 min
            self._bursts.append((t, t + self.rng.randint(60_000, 300_000), self.rng.uniform(0.8, 2.0)))

    def healthy_state(self, vertex: int, t_ms: int) -> float:
        """The steady state of one subtask, with the warm-up curve when the job is young."""
        base = self.spec.vertices[vertex].state_bytes
        if not base:
            return 0.0
        warmup = self.spec.warmup_ms
        if warmup <= 0:
            return base
        x = t_ms / warmup
        if self.spec.warmup_shape == "window_fill":
            # A window fills linearly, then eviction balances arrival: flat after the window.
            return base * (0.02 + 0.98 * min(1.0, x))
        return base * (0.02 + 0.98 * (1.0 - math.exp(-3.0 * x)))  # ~95% at warmup_ms

    # --- one moment ----------------------------------------------------------------------------

    def _tick(self, t_ms: int) -> Tick:
        spec = self.spec
        tick = Tick(
            t_ms=t_ms,
            capacity_factor=[1.0] * len(spec.vertices),
            record_shares=[_uniform(p) for p in self.parallelism],
            state_shares=[_uniform(p) for p in self.parallelism],
            state_extra=[[0.0] * p for p in self.parallelism],
            state_exact=[[0.0] * p for p in self.parallelism],
        )
        for fault in self.faults:
            if fault.active(t_ms):
                fault.apply(tick, self)
        return tick

    def _sample(self, tick: Tick) -> tuple[list[list[SubtaskSample]], float, int | None]:
        """Instantaneous subtask samples, the throttle factor and the bottleneck vertex."""
        spec = self.spec
        offered = self.input_rate(tick.t_ms)
        # Offered load per vertex, before throttling.
        vertex_in = [0.0] * len(spec.vertices)
        for i, v in enumerate(spec.vertices):
            vertex_in[i] = offered * v.rate_share if v.source else sum(vertex_in[u] * spec.vertices[u].selectivity for u in self._upstream(i))
        throttle, bottleneck = 1.0, None
        for i, v in enumerate(spec.vertices):
            capacity = v.capacity_rps * tick.capacity_factor[i]
            for share in tick.record_shares[i]:
                load = vertex_in[i] * share
                if load > 0 and capacity / load < throttle:
                    throttle, bottleneck = capacity / load, i
        # Any sustained overload fills the bottleneck's buffers; they fill and drain with inertia.
        target = min(1.0, (1.0 - throttle) * 20.0) if throttle < 1.0 else 0.0
        self._pressure = 0.6 * self._pressure + 0.4 * target
        pressure = self._pressure if self._pressure > 0.02 else 0.0
        downstream_of_bottleneck = self._downstream_closure(bottleneck)
        queue_s = 0.0
        if bottleneck is not None:
            drain = max(1.0, spec.vertices[bottleneck].capacity_rps * tick.capacity_factor[bottleneck])
            queue_s = pressure * tick.inflight_factor * NETWORK_BUFFER_BYTES / RECORD_BYTES / drain
        samples = []
        for i, v in enumerate(spec.vertices):
            capacity = v.capacity_rps * tick.capacity_factor[i]
            upstream_of_bottleneck = bottleneck is not None and i != bottleneck and i not in downstream_of_bottleneck
            row = []
            for share in tick.record_shares[i]:
                rin = vertex_in[i] * throttle * share
                busy = min(1000.0, 1000.0 * rin / capacity)
                backpressured = (1000.0 - busy) * pressure if upstream_of_bottleneck else 0.0
                hot = i == bottleneck and share == max(tick.record_shares[i])
                delay = 5.0 + (1000.0 * queue_s if (upstream_of_bottleneck or hot or i in downstream_of_bottleneck) else 0.0)
                alignment = 0.0 if spec.unaligned else (0.6 * delay if len(self._upstream(i)) > 0 and pressure else 1.0)
                if spec.unaligned:
                    delay = 5.0 + 0.05 * delay
                row.append(SubtaskSample(
                    busy=busy, backpressured=backpressured, idle=max(0.0, 1000.0 - busy - backpressured),
                    records_in=rin, records_out=rin * v.selectivity,
                    in_pool=min(1.0, self.reporting.idle_in_pool_usage + (pressure if (hot or i == bottleneck) else 0.0)),
                    out_pool=min(1.0, self.reporting.idle_out_pool_usage + (0.9 * pressure if upstream_of_bottleneck else 0.0)),
                    start_delay_ms=delay, alignment_ms=alignment,
                ))
            samples.append(row)
        return samples, throttle, bottleneck

    def _downstream_closure(self, vertex: int | None) -> set[int]:
        if vertex is None:
            return set()
        found: set[int] = set()
        frontier = [vertex]
        while frontier:
            current = frontier.pop()
            for i in range(len(self.spec.vertices)):
                if current in self._upstream(i) and i not in found:
                    found.add(i)
                    frontier.append(i)
        return found

    def _state(self, tick: Tick) -> list[list[float]]:
        state = []
        for i, v in enumerate(self.spec.vertices):
            n = self.parallelism[i]
            # Total state follows the original parallelism: a rescale redistributes it.
            level = self.healthy_state(i, tick.t_ms) * v.parallelism
            row = []
            for k in range(n):
                jitter = 1.0 + self.rng.gauss(0, 0.01)
                noisy = (level * tick.state_shares[i][k] + tick.state_extra[i][k]) * jitter
                row.append(max(0.0, noisy + tick.state_exact[i][k]))
            state.append(row)
        return state

    # --- events --------------------------------------------------------------------------------

    def _common(self, ts: int, kind: str) -> dict:
        return {"schema_version": SCHEMA_VERSION, "kind": kind, "cluster": self.spec.cluster,
                "job_id": self.job_id, "job_name": self.spec.job_name, "ts": int(ts), "source": self.source_label}

    def _metric(self, value: float, digits: int = 2) -> float | None:
        if self.rng.random() < self.spec.null_metric_probability:
            return None
        return round(value, digits)

    def _vertex_metrics(self, ts: int, averaged: list[list[SubtaskSample]] | None) -> Iterator[dict]:
        """One event per vertex; ``averaged`` None is the empty first poll after a start."""
        for i, v in enumerate(self.spec.vertices):
            subtasks = []
            if averaged is None:
                subtasks = [{"index": k, **{name: None for name in METRIC_FIELDS}} for k in range(self.parallelism[i])]
            for k, s in enumerate(averaged[i] if averaged is not None else ()):
                jitter = lambda x: x * (1.0 + self.rng.gauss(0, 0.02))  # noqa: E731
                subtasks.append({
                    "index": k,
                    # Legacy and datagen sources report busy time as NaN: the collector publishes null.
                    "busy_time_ms_per_s": None if v.source else self._metric(min(1000.0, jitter(s.busy))),
                    "backpressured_time_ms_per_s": self._metric(min(1000.0, jitter(s.backpressured))),
                    "idle_time_ms_per_s": self._metric(min(1000.0, jitter(s.idle))),
                    "records_in_per_s": None if v.source else self._metric(jitter(s.records_in)),
                    "records_out_per_s": self._metric(jitter(s.records_out)),
                    "in_pool_usage": None if v.source else self._metric(min(1.0, s.in_pool), 3),
                    "out_pool_usage": self._metric(min(1.0, s.out_pool), 3),
                    "checkpoint_start_delay_ms": self._metric(jitter(s.start_delay_ms), 1),
                    "checkpoint_alignment_time_ms": self._metric(jitter(s.alignment_ms), 1),
                })
            yield {**self._common(ts, "vertex_metrics"), "vertex_id": self.vertex_ids[i], "vertex_name": v.name,
                   "parallelism": self.parallelism[i], "subtasks": subtasks}

    def _checkpoint(self, trigger_ms: int, tick: Tick, samples: list[list[SubtaskSample]],
                    state: list[list[float]], forced_failure: str | None) -> tuple[dict, int]:
        spec = self.spec
        interval_s = spec.checkpoint_interval_ms / 1000.0
        vertices, e2e_max, total_subtasks, acked = [], 0.0, 0, 0
        total_state = total_persisted = inflight_bytes = 0
        timeout = spec.checkpoint_timeout_ms
        for i, v in enumerate(spec.vertices):
            subtasks, v_state, v_persisted = [], 0, 0
            for k in range(self.parallelism[i]):
                s = samples[i][k]
                full = int(state[i][k])
                if spec.incremental and v.state_bytes:
                    written = s.records_in * interval_s * v.write_bytes_per_record * (1 + self.rng.gauss(0, 0.05))
                    persisted = int(min(full, max(0.0, written)))
                else:
                    persisted = full
                inflight = int(NETWORK_BUFFER_BYTES * tick.inflight_factor * (s.backpressured / 1000.0)) if spec.unaligned else 0
                sync = self.rng.uniform(1, 12) + full / 400e6 * 1000
                async_ms = (persisted + inflight) / spec.upload_bytes_per_s * 1000 + self.rng.uniform(5, 40) + tick.storage_latency_ms
                delay = s.start_delay_ms * (1 + self.rng.gauss(0, 0.1))
                alignment = s.alignment_ms * (1 + self.rng.gauss(0, 0.1))
                e2e = max(1.0, delay) + max(0.0, alignment) + sync + async_ms
                done = e2e <= timeout and forced_failure is None
                acked += done
                total_subtasks += 1
                e2e_max = max(e2e_max, e2e)
                v_state += full
                v_persisted += persisted + inflight
                inflight_bytes += inflight
                subtasks.append({
                    "index": k, "state_size_bytes": full if done else None,
                    "checkpointed_size_bytes": persisted + inflight if done else None,
                    "end_to_end_duration_ms": int(e2e) if done else None,
                    "alignment_duration_ms": int(max(0.0, alignment)), "start_delay_ms": int(max(1.0, delay)),
                    "sync_duration_ms": int(sync) if done else None, "async_duration_ms": int(async_ms) if done else None,
                    "unaligned": spec.unaligned, "aborted": not done,
                })
            total_state += v_state
            total_persisted += v_persisted
            vertices.append({"vertex_id": self.vertex_ids[i], "vertex_name": v.name, "parallelism": self.parallelism[i],
                             "state_size_bytes": v_state, "checkpointed_size_bytes": v_persisted, "subtasks": subtasks})
        if forced_failure is not None:
            status, message = "FAILED", forced_failure
            duration = min(e2e_max, timeout) * self.rng.uniform(0.3, 0.9)
        elif e2e_max > timeout:
            status, message, duration = "FAILED", "Checkpoint expired before completing.", float(timeout)
        else:
            status, message, duration = "COMPLETED", None, e2e_max
        checkpoint_id = self.next_checkpoint_id
        self.next_checkpoint_id += 1
        end_ms = trigger_ms + int(duration)
        event = {
            **self._common(self.start_ts + end_ms, "checkpoint"),
            "checkpoint_id": checkpoint_id, "status": status, "is_savepoint": False,
            "trigger_ts": self.start_ts + trigger_ms,
            "state_size_bytes": total_state if status == "COMPLETED" else 0,
            "checkpointed_size_bytes": total_persisted if status == "COMPLETED" else 0,
            "end_to_end_duration_ms": int(duration),
            "alignment_buffered_bytes": 0, "processed_data_bytes": int(sum(s.records_in for row in samples for s in row) * RECORD_BYTES * 0.01),
            "persisted_data_bytes": inflight_bytes,
            "num_subtasks": total_subtasks, "num_acknowledged_subtasks": acked if status == "COMPLETED" else min(acked, total_subtasks - 1),
            "failure_message": message, "vertices": vertices,
        }
        return event, end_ms

    def _job_status(self, ts_ms: int, tick: Tick) -> dict:
        running = ts_ms >= self.restarting_until_ms
        in_progress = sum(1 for trig, end in self.in_progress if trig <= ts_ms < end)
        # Each in-flight checkpoint holds acknowledgement bookkeeping on the JobManager heap.
        heap = 180e6 + 25e6 * math.sin(ts_ms / 47_000.0) ** 2 + in_progress * 6e6 + tick.heap_extra_bytes
        return {
            **self._common(self.start_ts + ts_ms, "job_status"),
            "state": "RUNNING" if running else "RESTARTING", "num_restarts": self.num_restarts,
            "checkpoints_completed_total": self.completed_total, "checkpoints_failed_total": self.failed_total,
            "checkpoints_in_progress": in_progress,
            "checkpoint_interval_ms": self.spec.checkpoint_interval_ms,
            "checkpoint_timeout_ms": self.spec.checkpoint_timeout_ms,
            "max_state_size_bytes": self.spec.max_state_size_bytes,
            "jm_heap_used_bytes": int(min(heap, self.spec.jm_heap_max_bytes)),
            "jm_heap_max_bytes": self.spec.jm_heap_max_bytes,
        }

    def restart(self, t_ms: int, downtime_ms: int, failover: bool = True) -> None:
        """The job stops and runs again: no metrics or checkpoints meanwhile; averages restart.

        A failover (a task failed) counts in Flink's ``numRestarts``; a redeploy from a savepoint
        (an upgrade, a rescale) does not, as Flink counts restarts, but pays the same start-up.
        """
        if failover or not self.reporting.checkpoint_ids_from_start:  # the idealised model counted both
            self.num_restarts += 1
        self.restarting_until_ms = t_ms + downtime_ms
        self._history.clear()
        self._start(t_ms + downtime_ms)

    def starting(self, t_ms: int) -> bool:
        """Whether the job's tasks are still starting at ``t_ms`` (checkpoints triggered now fail)."""
        return self.started_ms is not None and 0 <= t_ms - self.started_ms < self.startup_busy_ms

    def _starting_up(self, samples: list[list[SubtaskSample]], t_ms: int) -> list[list[SubtaskSample]]:
        """While operators start they report busy and process nothing (sources report no busy
        time); then they work off what queued meanwhile, busy fading to normal."""
        if self.started_ms is None or t_ms < self.started_ms:
            return samples
        elapsed = t_ms - self.started_ms
        catch_up_ms = self.startup_busy_ms * self.reporting.catch_up_factor
        if elapsed < self.startup_busy_ms:
            return [[SubtaskSample(busy=0.0 if v.source else 1000.0, backpressured=0.0, idle=1000.0 if v.source else 0.0,
                                   records_in=0.0, records_out=0.0, in_pool=s.in_pool, out_pool=s.out_pool,
                                   start_delay_ms=s.start_delay_ms, alignment_ms=s.alignment_ms) for s in row]
                    for v, row in zip(self.spec.vertices, samples)]
        if elapsed < self.startup_busy_ms + catch_up_ms:
            left = 1.0 - (elapsed - self.startup_busy_ms) / catch_up_ms
            return [[s if v.source else replace(s, busy=s.busy + (1000.0 - s.busy) * left,
                                                idle=max(0.0, s.idle - (1000.0 - s.busy) * left))
                     for s in row] for v, row in zip(self.spec.vertices, samples)]
        return samples

    def rescale(self, vertex: int, parallelism: int) -> None:
        self.parallelism[vertex] = parallelism
        self.last_state[vertex] = [0.0] * parallelism
        self._history.clear()

    def run(self, duration_ms: int) -> list[dict]:
        """All events of ``duration_ms`` of event time, sorted by ``ts``."""
        spec = self.spec
        self._plan_bursts(duration_ms)
        # Polls land exactly on their interval; sub-second checkpoint triggers are handled within a step.
        step = math.gcd(spec.poll_interval_ms, spec.checkpoint_interval_ms)
        if step < 1000:
            step = math.gcd(spec.poll_interval_ms, 1000)
        window = max(1, round(60_000 / step))  # Flink meters average over one minute
        events: list[dict] = []
        next_poll, next_trigger, t = spec.poll_interval_ms, spec.checkpoint_interval_ms, 0
        while t <= duration_ms:
            for fault in self.faults:  # restarts and rescales first: they change the job's shape
                hook = getattr(fault, "on_tick", None)
                if hook and fault.active(t):
                    hook(t, self)
            tick = self._tick(t)
            running = t >= self.restarting_until_ms
            samples, _, _ = self._sample(tick)
            samples = self._starting_up(samples, t)
            if running:
                self._history.append(samples)
                while len(self._history) > window:
                    self._history.popleft()
            state = self._state(tick)
            self.last_state = state
            # Checkpoints triggered since the last step.
            self.in_progress = [(trig, end) for trig, end in self.in_progress if end > t - step]
            while next_trigger <= t:
                if running and self.starting(next_trigger):
                    self.failed_total += 1  # a trigger before every task runs: counted, never in the history
                    next_trigger += spec.checkpoint_interval_ms
                elif running and sum(1 for _, end in self.in_progress if end > next_trigger) < spec.max_concurrent_checkpoints:
                    failure = None
                    for fault in self.faults:
                        if failure is None and fault.active(next_trigger):
                            failure = fault.checkpoint_failure(next_trigger, self)
                    event, end_ms = self._checkpoint(next_trigger, tick, samples, state, failure)
                    if event["status"] == "COMPLETED":
                        self.completed_total += 1
                    else:
                        self.failed_total += 1
                    self.in_progress.append((next_trigger, end_ms))
                    events.append(event)
                    next_trigger += spec.checkpoint_interval_ms
                    if spec.max_concurrent_checkpoints == 1:
                        next_trigger = max(next_trigger, end_ms)  # the next waits for this one
                else:
                    next_trigger += spec.checkpoint_interval_ms
            if t >= next_poll:
                if self.rng.random() >= spec.missing_poll_probability:
                    events.append(self._job_status(t, tick))
                    if running and self._history and not self._polled_since_start:
                        events.extend(self._vertex_metrics(self.start_ts + t, None))
                        self._polled_since_start = True
                    elif running and self._history:
                        ramp = window if self.reporting.meters_ramp_up else None
                        recent = max(1, round(self.reporting.time_window_s * 1000 / step))
                        events.extend(self._vertex_metrics(self.start_ts + t, _average(self._history, ramp, recent)))
                next_poll += spec.poll_interval_ms
            t += step
        events = [e for e in events if e["ts"] <= self.start_ts + duration_ms]
        # As a collector publishes a poll: the samples before the evaluations that read them.
        events.sort(key=time_order)
        return events


RATES = ("records_in", "records_out")


def _average(history: deque, meter_window: int | None = None, recent: int | None = None) -> list[list[SubtaskSample]]:
    """Each subtask's samples averaged as Flink reports them: rates over the whole history (a
    minute), times and usages over its last ``recent`` samples (None: the whole history). With
    ``meter_window`` (samples per minute) the rates are Flink's meters, a minute's count over a
    minute, so they ramp up from zero while the history is shorter than that."""
    latest = history[-1]
    averaged = []
    for i, row in enumerate(latest):
        out = []
        for k in range(len(row)):
            values = [h[i][k] for h in history if i < len(h) and k < len(h[i])]
            short = values[-recent:] if recent else values
            fields = {}
            for f in SubtaskSample.__dataclass_fields__:
                if f in RATES:
                    fields[f] = sum(getattr(s, f) for s in values) / (max(meter_window, len(values)) if meter_window
                                                                      else len(values))
                else:
                    fields[f] = sum(getattr(s, f) for s in short) / len(short)
            out.append(SubtaskSample(**fields))
        averaged.append(out)
    return averaged
