"""One Flink job's detection, record by record: what the live job keeps per Flink job in Spark's
state store, and the pure steps that advance it.

:class:`FlinkJobState` holds a job's feature state machine and its entry of the incident
policy's state. :meth:`FlinkJobState.read` takes the job's Kafka
records in the order they arrived: each is validated (a dead letter, or an event), then used or
counted late (:meth:`~feature_store.job_features.JobFeatureState.refusal`); the feature rows the
used events trigger are returned. :func:`decide` scores the rows of any set of jobs at once and
steps the policy of those jobs.

The live job (:mod:`pipelines.detection.processor`) reads each job's records of a micro-batch and
decides once per partition and micro-batch; :func:`replay` reads each job's whole recording and
decides once. Jobs are independent at every step, so the same records in the same order give the
same incidents either way, whatever the micro-batches were.
"""

from __future__ import annotations

import gzip
import logging
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pandas as pd

from feature_store.compute import OUTPUT_COLUMNS
from feature_store.job_features import JobFeatureState
from models.registry import LoadedDetector
from pipelines.contracts import TERMINAL_JOB_STATES
from pipelines.detection import job_state
from pipelines.detection.validation import DEFAULT_VALUE_BYTES, check_event, dead_letter
from pipelines.incidents import policy
from pipelines.incidents.policy_state import job_key  # how the policy's state and the incidents' grouping name a job
from pipelines.incidents.scoring import score_rows

log = logging.getLogger(__name__)

# One valid event in this many (by Kafka offset) goes to the input's data-quality validation.
SAMPLE_EVERY = 64
KEY_MISMATCH = "schema_violation"
UNPROCESSABLE = "unprocessable"  # valid by the contract, yet the feature state machine could not take it


@dataclass(frozen=True)
class ReadRules:
    """How records are read: what is too far in the future, too old for its job, or idle."""

    max_future_ms: int
    idle_timeout_ms: int
    lateness_ms: int
    dead_letter_value_bytes: int = DEFAULT_VALUE_BYTES

    @classmethod
    def from_config(cls, config) -> "ReadRules":
        return cls(int(config.detection.max_future_s * 1000), config.features.idle_timeout_ms,
                   int(config.features.lateness_s * 1000), config.detection.dead_letter_value_bytes)


@dataclass(frozen=True)
class Record:
    """One input record as the job sees it (Kafka's fields; a file line in a replay)."""

    value: bytes | None
    key: bytes | None = None
    topic: str = ""
    partition: int = 0
    offset: int = 0
    kafka_timestamp_ms: int | None = None


# Why an event is not used, besides the feature machine's reasons (late, out_of_order).
BEHIND_WATERMARK = "behind_watermark"


@dataclass
class Reading:
    """What one job's records gave: feature rows, dead letters, late events by reason, and a
    sample of the usable events for the data-quality suite."""

    rows: list[dict] = field(default_factory=list)
    dead_letters: list[dict] = field(default_factory=list)
    late: dict[str, int] = field(default_factory=dict)
    samples: list[bytes] = field(default_factory=list)


class FlinkJobState:
    """A Flink job's feature state machine and its entry of the incident policy's state."""

    def __init__(self, machine: JobFeatureState | None = None, policy_state: dict | None = None):
        self.machine = machine or JobFeatureState()
        self.policy = policy_state if policy_state is not None else {}

    @classmethod
    def from_bytes(cls, data: bytes) -> "FlinkJobState":
        """A state :meth:`to_bytes` wrote, in this state version or an earlier one
        (:mod:`pipelines.detection.job_state`; raises its ``StoredStateError`` on one it cannot read)."""
        machine, policy_state = job_state.decode(data)
        return cls(machine, policy_state)

    def to_bytes(self) -> bytes:
        return job_state.encode(self.machine, self.policy)

    def read(self, records: Iterable[Record], now_ms: int, rules: ReadRules,
             key: tuple[str, str] | None = None, watermark_ms: int | None = None) -> Reading:
        """Validate and use ``records`` (in arrival order). ``key``, when given, is the job the
        records were routed to by their JSON: an event naming another job is a dead letter.
        ``watermark_ms``, when given, is how far the whole input's event time has come less the
        sources' delay: an event behind it is late (:data:`BEHIND_WATERMARK`) whatever its job's
        state, so that a collector far behind the others cannot start a forgotten job afresh."""
        reading = Reading()
        for record in records:
            try:
                self._read_one(record, now_ms, rules, key, watermark_ms, reading)
            except Exception as exc:  # one record never fails the micro-batch: it becomes a dead letter
                log.warning("record %s/%d@%d broke the feature state machine: %r", record.topic, record.partition,
                            record.offset, exc)
                reading.dead_letters.append(dead_letter(record, UNPROCESSABLE, f"{type(exc).__name__}: {exc}",
                                                        rules.dead_letter_value_bytes))
        return reading

    def _read_one(self, record: Record, now_ms: int, rules: ReadRules, key: tuple[str, str] | None,
                  watermark_ms: int | None, reading: Reading) -> None:
        event, reason, error = check_event(record.value, now_ms, rules.max_future_ms)
        if reason is None and key is not None and (event["cluster"], event["job_id"]) != key:
            reason, error = KEY_MISMATCH, (f"cluster/job_id {event['cluster']}/{event['job_id']} differ from "
                                           f"{key[0]}/{key[1]} read from the same record (duplicate keys?)")
        if reason is not None:
            reading.dead_letters.append(dead_letter(record, reason, error, rules.dead_letter_value_bytes))
            return
        if record.offset % SAMPLE_EVERY == 0:
            reading.samples.append(record.value)
        if watermark_ms is not None and event["ts"] < watermark_ms:
            reading.late[BEHIND_WATERMARK] = reading.late.get(BEHIND_WATERMARK, 0) + 1
            return
        self.use(event, rules, reading)

    def use(self, event: dict, rules: ReadRules, reading: Reading) -> None:
        """Consume one valid event, or count it late."""
        late = self.machine.refusal(event, rules.idle_timeout_ms, rules.lateness_ms)
        if late is not None:
            reading.late[late] = reading.late.get(late, 0) + 1
            return
        reading.rows.extend(self.machine.consume(event, rules.idle_timeout_ms, rules.lateness_ms))

    def due(self, rules: ReadRules) -> int | None:
        """When (event time) the job is silent long enough to be forgotten."""
        latest = self.machine.latest_ts
        return None if latest is None else latest + rules.idle_timeout_ms

    def gone(self, rules: ReadRules) -> list[dict]:
        """The job has been silent for the idle timeout: the resolved events of its incidents still
        open (:func:`~pipelines.incidents.policy.resolve_gone`); then it is forgotten."""
        due = self.due(rules)
        if due is None or not policy.any_open(self.policy):
            return []
        return policy.resolve_gone(self.policy, due, rules.idle_timeout_ms)

    def compact(self) -> None:
        """A finished job keeps only what tells its next events apart: what it reports about its
        past after the end is late, a later event is a new run."""
        if self.machine.terminated:
            old = self.machine
            self.machine = JobFeatureState(cluster=old.cluster, job_id=old.job_id, job_name=old.job_name,
                                           last_seen_ts=old.last_seen_ts, latest_ts=old.latest_ts, terminated=True)


_OUTPUT_VALUES = itemgetter(*OUTPUT_COLUMNS)


def feature_frame(rows: Sequence[dict]) -> pd.DataFrame:
    """Feature rows as the detectors and the policy read them (every output column, in order; a
    column a row lacks is null). The rows' values as tuples: pandas builds the same frame from
    them in two thirds of the time it takes to look the columns up in each dict itself."""
    return pd.DataFrame([_output_values(row) for row in rows], columns=OUTPUT_COLUMNS)


def _output_values(row: dict) -> tuple:
    try:
        return _OUTPUT_VALUES(row)
    except KeyError:
        return tuple(row.get(column) for column in OUTPUT_COLUMNS)


def decide(jobs: Mapping[str, FlinkJobState], rows: pd.DataFrame, models: Mapping[str, LoadedDetector],
           settings: policy.PolicySettings) -> dict[str, list[dict]]:
    """Score ``rows`` (of the jobs in ``jobs``, keyed by :func:`job_key`) with ``models``, step
    those jobs' policy, and return each job's incident events (each job's policy entry moves on)."""
    rows = _before_the_end(rows)
    if rows.empty:
        return {}
    scores = score_rows(rows, models)
    state = {key: job.policy for key, job in jobs.items()}
    events = policy.step(state, rows, scores, {family: m.post_rule for family, m in models.items()}, settings)
    for key, job in jobs.items():
        job.policy = state.get(key, {})
    by_job: dict[str, list[dict]] = {}
    for event in events:
        by_job.setdefault(job_key(event["cluster"], event["job_id"]), []).append(event)
    return by_job


def _before_the_end(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` less those of checkpoints stamped after their job's end: the collector publishes a
    poll's status before its checkpoints, so where the JobManager's clock runs ahead of the
    collector's, the ended run's last checkpoints read as if they came after its end."""
    ended = rows["job_state"].isin(TERMINAL_JOB_STATES)
    if not ended.any():
        return rows
    end = rows[ended].groupby(["cluster", "job_id"])["ts"].min().rename("_end")
    joined = rows.join(end, on=["cluster", "job_id"])
    return rows[~((joined["trigger_kind"] == "checkpoint") & (joined["ts"] > joined["_end"])).to_numpy()]


# --- replay ---------------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    events: int
    dead_letters: list[dict]
    incidents: list[dict]
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)  # the feature rows the policy judged
    late: dict[str, int] = field(default_factory=dict)


def replay(config, paths: Iterable[str | Path], models: Mapping[str, LoadedDetector]) -> ReplayResult:
    """The live job on recorded events: each job's events in the order the files hold them
    (a recording of the input topic is in arrival order), through the same validation, feature
    state machine, scoring and policy. A recording is judged by its own clock, not today's."""
    rules = ReadRules.from_config(config)
    far_future = 2**62
    jobs: dict[str, FlinkJobState] = {}
    readings: dict[str, Reading] = {}
    letters: list[dict] = []
    used = 0
    for path in paths:
        with (gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")) as handle:
            for number, raw in enumerate(handle):
                raw = raw.rstrip(b"\r\n")
                if not raw.strip():
                    continue
                # The dead-letter contract's shape: the file stands in for the topic, the line for the offset.
                record = Record(raw, topic=str(path), offset=number)
                event, reason, error = check_event(raw, far_future, rules.max_future_ms)
                if reason is not None:
                    letters.append(dead_letter(record, reason, error, rules.dead_letter_value_bytes))
                    continue
                key = job_key(event["cluster"], event["job_id"])
                job = jobs.setdefault(key, FlinkJobState())
                try:
                    job.use(event, rules, readings.setdefault(key, Reading()))
                except Exception as exc:  # as the live job: a dead letter, not a failed replay
                    letters.append(dead_letter(record, UNPROCESSABLE, f"{type(exc).__name__}: {exc}",
                                               rules.dead_letter_value_bytes))
                    continue
                used += 1
    rows = feature_frame([row for key in sorted(readings) for row in readings[key].rows])
    by_job = decide(jobs, rows, models, policy.PolicySettings.from_config(config))
    # As the live job: a job silent for the idle timeout, as far as the watermark came, is gone.
    latest = [job.machine.latest_ts for job in jobs.values() if job.machine.latest_ts is not None]
    watermark = max(latest) - int(config.features.max_source_delay_s * 1000) if latest else None
    for key in sorted(jobs):
        due = jobs[key].due(rules)
        if watermark is not None and due is not None and watermark >= due:
            by_job.setdefault(key, []).extend(jobs[key].gone(rules))
    late: dict[str, int] = {}
    for reading in readings.values():
        for reason, count in reading.late.items():
            late[reason] = late.get(reason, 0) + count
    return ReplayResult(used, letters, [e for key in sorted(by_job) for e in by_job[key]], rows, late)
