"""What an incident page is drawn from: the incident's events, in the order they were
published, and its Flink job's raw metrics (:class:`JobMetrics`, from the input events).

Every record is data anyone could write to the topics: :func:`usable_incidents` keeps those that
are incident events and says why each other one is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import pandas as pd

from feature_store.job_features import barrier_delays
from feature_store.numeric import barrier_wait, max_known

# Before the incident opened, how much history the plots show (enough for a leak's warm-up and
# the slope window; a longer one makes the decisive minutes unreadable).
LOOKBACK_MS = 30 * 60_000
# After the incident's last event (for an open one: what has come in since).
LOOKAHEAD_MS = 5 * 60_000
MIB = 1024 * 1024


def usable_incidents(records: Iterable) -> tuple[list[dict], list[str]]:
    """The records that are incident events (they keep the incident contract), and for each
    other one why not: a record anyone wrote to the topic must not stop the pages of the rest."""
    from pipelines.contracts import INCIDENT

    usable, refused = [], []
    for record in records:
        if INCIDENT.accepts(record):
            usable.append(record)
        else:
            refused.append("; ".join(INCIDENT.errors(record)[:3]))
    return usable, refused


def incident_histories(events: Iterable[dict]) -> dict[str, list[dict]]:
    """Incident id -> its events in the order they were published (the last is its state)."""
    histories: dict[str, list[dict]] = {}
    for event in events:
        histories.setdefault(event["incident_id"], []).append(event)
    return histories


def is_open(history: Sequence[dict]) -> bool:
    return history[-1]["event"] != "resolved"


def last_open_event(history: Sequence[dict]) -> dict:
    """The incident's last event before any resolution: its summary, severity, evidence and
    forecast as they stood while it was open (a resolution carries none of them)."""
    return next((e for e in reversed(history) if e["event"] != "resolved"), history[-1])


@dataclass
class JobMetrics:
    """One Flink job's raw metrics as frames (event time ``ts``, epoch ms)."""

    checkpoints: pd.DataFrame  # ts, trigger_ts, checkpoint_id, status, duration_ms, state_size_bytes, failure_message
    vertex_state: pd.DataFrame  # ts, vertex_id, vertex_name, state_size_bytes, largest_subtask_bytes (completed ones)
    subtask_state: pd.DataFrame  # ts, vertex_id, index, state_size_bytes (completed checkpoints)
    samples: pd.DataFrame  # ts, vertex_id, vertex_name, index, busy, backpressured, records_in_per_s
    status: pd.DataFrame  # ts, state, num_restarts, interval_ms, timeout_ms, max_state_size_bytes
    # ts, trigger_ts, vertex_id, wait_ms: each checkpoint's (completed or failed) largest start delay
    # plus largest alignment per vertex, as the barrier-wait forecast fits them
    barrier_waits: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=["ts", "trigger_ts", "vertex_id", "wait_ms"]))

    @classmethod
    def from_events(cls, events: Iterable[Mapping]) -> "JobMetrics":
        checkpoints, vertex_state, subtask_state, samples, status, waits = [], [], [], [], [], []
        for e in events:
            kind, ts = e.get("kind"), e.get("ts")
            if kind == "checkpoint" and not e.get("is_savepoint"):
                checkpoints.append({"ts": ts, "trigger_ts": e.get("trigger_ts") or ts, "checkpoint_id": e["checkpoint_id"],
                                    "status": e["status"], "duration_ms": e.get("end_to_end_duration_ms"),
                                    "state_size_bytes": e.get("state_size_bytes"),
                                    "failure_message": e.get("failure_message")})
                waits.extend({"ts": ts, "trigger_ts": e.get("trigger_ts") or ts, "vertex_id": v["vertex_id"],
                              "wait_ms": wait}
                             for v in e.get("vertices") or [] if (wait := barrier_wait_ms(e, v)) is not None)
                if e["status"] != "COMPLETED":
                    continue
                for v in e.get("vertices") or []:
                    sizes = [s.get("state_size_bytes") or 0 for s in v.get("subtasks") or []]
                    vertex_state.append({"ts": ts, "vertex_id": v["vertex_id"], "vertex_name": v["vertex_name"],
                                         "state_size_bytes": v.get("state_size_bytes"),
                                         "largest_subtask_bytes": max(sizes) if sizes else None})
                    subtask_state.extend({"ts": ts, "vertex_id": v["vertex_id"], "index": s["index"],
                                          "state_size_bytes": s.get("state_size_bytes")} for s in v.get("subtasks") or [])
            elif kind == "vertex_metrics":
                samples.extend({"ts": ts, "vertex_id": e["vertex_id"], "vertex_name": e["vertex_name"],
                                "index": s["index"], "busy": s.get("busy_time_ms_per_s"),
                                "backpressured": s.get("backpressured_time_ms_per_s"),
                                "records_in_per_s": s.get("records_in_per_s")} for s in e.get("subtasks") or [])
            elif kind == "job_status":
                status.append({"ts": ts, "state": e.get("state"), "num_restarts": e.get("num_restarts"),
                               "interval_ms": e.get("checkpoint_interval_ms"),
                               "timeout_ms": e.get("checkpoint_timeout_ms"),
                               "max_state_size_bytes": e.get("max_state_size_bytes")})

        def frame(rows: list[dict], columns: Sequence[str]) -> pd.DataFrame:
            return pd.DataFrame(rows, columns=list(columns)).sort_values("ts", kind="stable").reset_index(drop=True)

        return cls(frame(checkpoints, ("ts", "trigger_ts", "checkpoint_id", "status", "duration_ms",
                                       "state_size_bytes", "failure_message")),
                   frame(vertex_state, ("ts", "vertex_id", "vertex_name", "state_size_bytes", "largest_subtask_bytes")),
                   frame(subtask_state, ("ts", "vertex_id", "index", "state_size_bytes")),
                   frame(samples, ("ts", "vertex_id", "vertex_name", "index", "busy", "backpressured",
                                   "records_in_per_s")),
                   frame(status, ("ts", "state", "num_restarts", "interval_ms", "timeout_ms", "max_state_size_bytes")),
                   frame(waits, ("ts", "trigger_ts", "vertex_id", "wait_ms")))

    def between(self, start_ms: int, end_ms: int) -> "JobMetrics":
        def cut(df: pd.DataFrame) -> pd.DataFrame:
            return df[(df["ts"] >= start_ms) & (df["ts"] <= end_ms)].reset_index(drop=True)
        return JobMetrics(cut(self.checkpoints), cut(self.vertex_state), cut(self.subtask_state), cut(self.samples),
                          cut(self.status), cut(self.barrier_waits))

    @property
    def empty(self) -> bool:
        return self.checkpoints.empty and self.samples.empty and self.status.empty

    def latest_status(self, column: str) -> float | None:
        values = self.status[column].dropna() if column in self.status else pd.Series(dtype="float64")
        return float(values.iloc[-1]) if len(values) else None


def barrier_wait_ms(checkpoint: Mapping, vertex: Mapping) -> float | None:
    """A vertex's barrier wait at a checkpoint as the features read it: its largest start delay
    (a subtask silent on a failed checkpoint waited its duration) plus its largest alignment."""
    delays, alignments = barrier_delays(sorted(vertex.get("subtasks") or [], key=lambda s: s["index"]),
                                        checkpoint["status"] != "COMPLETED", checkpoint.get("end_to_end_duration_ms"))
    return barrier_wait(max_known(delays), max_known(alignments))


def job_key(event: Mapping) -> tuple[str, str]:
    return event["cluster"], event["job_id"]


def window_of(history: Sequence[dict]) -> tuple[int, int]:
    """The event time a page's plots cover."""
    first, last = history[0], history[-1]
    end = last.get("resolved_at") or last["updated_at"]
    return int(first["opened_at"]) - LOOKBACK_MS, int(end) + LOOKAHEAD_MS
