"""Faults (and healthy disturbances) that change a simulated job from a labelled onset on.

A fault with a ``family`` is ground truth: the family, onset, vertex and subtask are written to
the labels. A disturbance with ``family = None`` (a planned restart, a rescale) is something a
healthy job does, and must not be flagged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelines.simulator.job import JobSimulation, Tick

MEMORY_BACKEND_MESSAGE = (
    "java.io.IOException: Size of the state is larger than the maximum permitted memory-backed state. "
    "Size={size} , maxSize={limit} . Consider using a different state backend, like the File System State backend."
)
STORAGE_ERRORS = (
    "Asynchronous task checkpoint failed. java.io.IOException: Could not flush to file and close the file "
    "system output stream to s3://flink-checkpoints/{job}/chk-{cid}/_metadata in order to obtain the stream "
    "state handle. Caused by: com.amazonaws.services.s3.model.AmazonS3Exception: We encountered an internal "
    "error. Please try again. (Service: Amazon S3; Status Code: 500; Error Code: InternalError)",
    "Asynchronous task checkpoint failed. java.io.IOException: Could not open output stream for state backend. "
    "Caused by: com.amazonaws.services.s3.model.AmazonS3Exception: Slow Down (Service: Amazon S3; "
    "Status Code: 503; Error Code: SlowDown)",
    "Checkpoint expired before completing.",
)
TASK_FAILURE_MESSAGE = "Checkpoint was declined (task failed): Task {vertex} ({subtask}/{parallelism}) failed."
JM_OOM_MESSAGE = "The job has failed: java.lang.OutOfMemoryError: Java heap space (JobManager)"


@dataclass
class _Base:
    onset_ms: int = 0
    vertex: int | None = None
    subtask: int | None = None
    family: str | None = None
    description: str = ""

    def active(self, t_ms: int) -> bool:
        """Whether the fault shapes the job at ``t_ms``; usually from its labelled onset on."""
        return t_ms >= self.onset_ms

    def apply(self, tick: "Tick", job: "JobSimulation") -> None:
        pass

    def checkpoint_failure(self, t_ms: int, job: "JobSimulation") -> str | None:
        return None

    def since_onset_h(self, t_ms: int) -> float:
        return max(0, t_ms - self.onset_ms) / 3_600_000.0


@dataclass
class StateLeak(_Base):
    """Keys (or window panes, CEP partial matches) that are never cleared: state grows without bound."""

    bytes_per_hour: float = 50e6  # per affected subtask
    acceleration_per_hour: float = 0.0  # growth of the rate itself (fraction per hour)
    fail_above_bytes: int | None = None  # memory state backend: a subtask snapshot above this fails
    family: str | None = "state_leak"

    def leaked(self, t_ms: int) -> float:
        hours = self.since_onset_h(t_ms)
        return self.bytes_per_hour * (hours + 0.5 * self.acceleration_per_hour * hours * hours)

    def apply(self, tick, job) -> None:
        extra = self.leaked(tick.t_ms)
        row = tick.state_extra[self.vertex]
        for k in range(len(row)):
            if self.subtask is None or k == self.subtask:
                row[k] += extra

    def checkpoint_failure(self, t_ms, job):
        if self.fail_above_bytes is None:
            return None
        largest = max(job.last_state[self.vertex])
        if largest > self.fail_above_bytes:
            return MEMORY_BACKEND_MESSAGE.format(size=int(largest), limit=self.fail_above_bytes)
        return None


@dataclass
class ReplayedCheckpointSizes(_Base):
    """Full state sizes taken from a real report, checkpoint by checkpoint; afterwards the leak
    continues at the report's mean step and every checkpoint fails with ``failure``."""

    sizes_bytes: tuple[int, ...] = ()
    failure: str = ""
    family: str | None = "state_leak"
    _step: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._step = (self.sizes_bytes[-1] - self.sizes_bytes[0]) / max(1, len(self.sizes_bytes) - 1)

    def total_at(self, t_ms: int, job) -> int:
        index = round(t_ms / job.spec.checkpoint_interval_ms) - 1
        if index < 0:
            return 0
        if index < len(self.sizes_bytes):
            return self.sizes_bytes[index]
        return int(self.sizes_bytes[-1] + self._step * (index - len(self.sizes_bytes) + 1))

    def apply(self, tick, job) -> None:
        total = self.total_at(tick.t_ms, job)
        row = tick.state_exact[self.vertex]
        n = len(row)
        for k in range(n):  # integer split, so the checkpoint's total is exact
            row[k] += total // n + (1 if k < total % n else 0)

    def checkpoint_failure(self, t_ms, job):
        if round(t_ms / job.spec.checkpoint_interval_ms) > len(self.sizes_bytes):
            size = int(max(job.last_state[self.vertex]))
            return self.failure.format(size=size)
        return None


@dataclass
class KeyRotationState(_Base):
    """Seed FLINK-19970: keys send ``events_per_key`` events ``event_interval_s`` apart, then retire.

    A correct CEP operator drops a key's partial matches once its ``window_s`` pattern window
    has passed (timers fire lazily, so eviction lags by up to ``cleanup_lag_s``): state fills for
    window + lag, then levels off. The leaky operator never drops them: linear growth forever.
    The two curves coincide until window + lag has passed (45 min), which is the leak's onset.
    """

    keys: int = 8192
    event_interval_s: float = 600.0
    events_per_key: int = 2
    window_s: float = 1800.0
    cleanup_lag_s: float = 900.0
    bytes_per_event: float = 1100.0
    bytes_per_key: float = 350.0
    leaky: bool = True
    family: str | None = "state_leak"

    def active(self, t_ms: int) -> bool:
        return True  # keys rotate from the start; the onset only marks where the curves part

    def total_bytes(self, t_ms: int) -> float:
        t = t_ms / 1000.0
        key_rate = self.keys / (self.event_interval_s * (self.events_per_key - 1) or 1.0)
        event_rate = key_rate * self.events_per_key
        retained = t if self.leaky else min(t, self.window_s + self.cleanup_lag_s * min(1.0, t / (self.window_s + self.cleanup_lag_s)))
        return event_rate * retained * self.bytes_per_event + key_rate * retained * self.bytes_per_key

    def apply(self, tick, job) -> None:
        row = tick.state_extra[self.vertex]
        total = self.total_bytes(tick.t_ms)
        for k in range(len(row)):
            row[k] += total * tick.state_shares[self.vertex][k]


@dataclass
class SlowOperator(_Base):
    """An operator whose throughput drops below the input rate (a slow external call, GC, a bad node)."""

    final_capacity_factor: float = 0.5
    ramp_ms: int = 600_000
    cascade: bool = False  # seed 004: slow checkpoints hold buffers longer, which slows everything more
    family: str | None = "backpressure"

    def apply(self, tick, job) -> None:
        progress = min(1.0, (tick.t_ms - self.onset_ms) / max(1, self.ramp_ms))
        factor = 1.0 - (1.0 - self.final_capacity_factor) * progress
        if self.cascade:
            hours = self.since_onset_h(tick.t_ms)
            tick.inflight_factor *= 1.0 + 20.0 * hours
            factor /= 1.0 + 3.0 * hours
            tick.heap_extra_bytes += 40e6 * hours
        tick.capacity_factor[self.vertex] *= factor


@dataclass
class HotKey(_Base):
    """One key carries most records (and/or state) and lands on one subtask."""

    hot_share: float = 0.8
    records: bool = True
    state: bool = True
    family: str | None = "skew"

    def _shares(self, n: int) -> list[float]:
        cold = (1.0 - self.hot_share) / max(1, n - 1)
        return [self.hot_share if k == self.subtask else cold for k in range(n)]

    def apply(self, tick, job) -> None:
        n = len(tick.record_shares[self.vertex])
        if self.records:
            tick.record_shares[self.vertex] = self._shares(n)
        if self.state:
            tick.state_shares[self.vertex] = self._shares(n)


@dataclass
class SlowCheckpointStorage(_Base):
    """Checkpoint storage gets slower (throttled bucket, overloaded NFS): async phases stretch to the timeout."""

    final_latency_ms: float = 120_000
    ramp_ms: int = 1_200_000
    family: str | None = "checkpoint_failure"

    def apply(self, tick, job) -> None:
        progress = min(1.0, (tick.t_ms - self.onset_ms) / max(1, self.ramp_ms))
        tick.storage_latency_ms += self.final_latency_ms * progress * job.rng.uniform(0.7, 1.3)


@dataclass
class TransientStorageErrors(_Base):
    """Seed 002: transient S3 errors and latency fail some checkpoints; most still complete."""

    failure_probability: float = 0.3
    family: str | None = "checkpoint_failure"

    def apply(self, tick, job) -> None:
        if job.rng.random() < 0.3:
            tick.storage_latency_ms += job.rng.uniform(2_000, 20_000)

    def checkpoint_failure(self, t_ms, job):
        if job.rng.random() < self.failure_probability:
            message = job.rng.choice(STORAGE_ERRORS)
            return message.format(job=job.job_id, cid=job.next_checkpoint_id)
        return None


@dataclass
class JobManagerHeapPressure(_Base):
    """Seed 004: a sub-second interval keeps many checkpoints in flight; the JobManager heap climbs
    until it fails over, and the job restarts (and the climb starts again)."""

    growth_bytes_per_hour: float = 2.5e9
    family: str | None = "checkpoint_failure"
    _since_ms: int = field(init=False, default=0)

    def _extra(self, t_ms: int) -> float:
        return self.growth_bytes_per_hour * max(0, t_ms - max(self.onset_ms, self._since_ms)) / 3_600_000.0

    def apply(self, tick, job) -> None:
        tick.heap_extra_bytes += self._extra(tick.t_ms)

    def on_tick(self, t_ms: int, job) -> None:
        if self._extra(t_ms) > 0.8 * job.spec.jm_heap_max_bytes and t_ms >= job.restarting_until_ms:
            job.restart(t_ms, downtime_ms=45_000)
            self._since_ms = t_ms

    def checkpoint_failure(self, t_ms, job):
        if self._extra(t_ms) > 0.65 * job.spec.jm_heap_max_bytes and job.rng.random() < 0.5:
            return JM_OOM_MESSAGE
        return None


@dataclass
class RestartLoop(_Base):
    """A task keeps failing (a poison record, a crashing dependency): restart after restart."""

    period_ms: int = 240_000
    downtime_ms: int = 30_000
    family: str | None = "checkpoint_failure"
    _next_ms: int | None = field(init=False, default=None)

    def on_tick(self, t_ms: int, job) -> None:
        if self._next_ms is None:
            self._next_ms = self.onset_ms + self.period_ms
        if t_ms >= self._next_ms:
            job.restart(t_ms, self.downtime_ms)
            self._next_ms = t_ms + self.period_ms

    def checkpoint_failure(self, t_ms, job):
        # The checkpoints in flight when the task dies are declined.
        if self._next_ms is not None and self._next_ms - t_ms <= 2 * job.spec.checkpoint_interval_ms:
            v = self.vertex or 0
            return TASK_FAILURE_MESSAGE.format(vertex=job.spec.vertices[v].name, subtask=(self.subtask or 0) + 1,
                                               parallelism=job.parallelism[v])
        return None


@dataclass
class PlannedRestart(_Base):
    """A healthy restart (a redeploy from a savepoint): metrics pause, averages reset, state is
    restored; not a failover, so Flink's restart counter stays."""

    downtime_ms: int = 40_000
    family: str | None = None
    _done: bool = field(init=False, default=False)

    def on_tick(self, t_ms: int, job) -> None:
        if not self._done:
            job.restart(t_ms, self.downtime_ms, failover=False)
            self._done = True


@dataclass
class Rescale(_Base):
    """A healthy rescale: one vertex gets a new parallelism; its state is redistributed."""

    parallelism: int = 4
    downtime_ms: int = 40_000
    family: str | None = None
    _done: bool = field(init=False, default=False)

    def on_tick(self, t_ms: int, job) -> None:
        if not self._done:
            job.rescale(self.vertex, self.parallelism)
            job.restart(t_ms, self.downtime_ms, failover=False)
            self._done = True
