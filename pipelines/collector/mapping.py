"""Flink REST responses -> input-contract events. Pure functions: no I/O, no clock.

How Flink's fields become the contract's (Flink 1.15 and later, checked against 2.3):

==========================================  ==================================================
contract field                               Flink REST field
==========================================  ==================================================
checkpoint ``state_size_bytes``              ``state_size``: the full size of the job's state in
                                             this checkpoint (what a restore has to read)
checkpoint ``checkpointed_size_bytes``       ``checkpointed_size``: what this checkpoint wrote;
                                             equal to the full size for full (hashmap) snapshots,
                                             much smaller with incremental RocksDB checkpoints,
                                             whose flat line hides a leak that ``state_size`` shows
``ts``                                       ``latest_ack_timestamp`` (COMPLETED) or
                                             ``failure_timestamp`` (FAILED)
``end_to_end_duration_ms``                   ``end_to_end_duration``
``alignment_buffered_bytes`` ...             ``alignment_buffered``, ``processed_data``,
                                             ``persisted_data``
vertex ``state_size_bytes`` ...              ``tasks[vertex_id]`` of ``/checkpoints/details/:cid``
subtask ``alignment_duration_ms``            ``alignment.duration`` of ``.../subtasks/:vid``
subtask ``sync_duration_ms``, ``async_...``  ``checkpoint.sync``, ``checkpoint.async``
subtask ``start_delay_ms``                   ``start_delay``
``busy_time_ms_per_s`` ...                   task metrics ``busyTimeMsPerSecond``,
                                             ``backPressuredTimeMsPerSecond``,
                                             ``idleTimeMsPerSecond`` (Flink's one-minute averages)
``records_in_per_s``, ``records_out_per_s``  ``numRecordsInPerSecond``, ``numRecordsOutPerSecond``
``in_pool_usage``, ``out_pool_usage``        ``Shuffle.Netty.Input.Buffers.inPoolUsage`` and
                                             ``...Output.Buffers.outPoolUsage`` (older names
                                             ``buffers.inPoolUsage`` as a fallback)
``checkpoint_start_delay_ms``                ``checkpointStartDelayNanos`` / 1e6
``checkpoint_alignment_time_ms``             ``checkpointAlignmentTime`` (nanoseconds) / 1e6
``num_restarts``                             job metric ``numRestarts``
``checkpoints_*_total``, ``_in_progress``    ``counts`` of ``/jobs/:id/checkpoints``
``checkpoint_interval_ms``, ``_timeout_ms``  ``interval``, ``timeout`` of ``/checkpoints/config``
``jm_heap_used_bytes``, ``jm_heap_max_...``  ``Status.JVM.Memory.Heap.Used`` / ``.Max``
==========================================  ==================================================

Flink answers ``"NaN"`` for a metric it cannot compute (the datagen source's busy time), omits
metrics it does not have, and reports ``-1`` for a time or size not known yet (a subtask that has
not acknowledged). All of those become null, never a zero that was not measured.

>>> metric_number("NaN") is None, metric_number("12.5"), metric_number(None) is None
(True, 12.5, True)
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from pipelines.contracts import SCHEMA_VERSION, TERMINAL_JOB_STATES  # noqa: F401  (the poller reads the states here)

FINISHED_CHECKPOINT_STATES = ("COMPLETED", "FAILED")
# JobManagerCheckpointStorage's default maximum state size (MAX_STATE_SIZE = 5 MiB): a hard limit
# that fails every checkpoint once a job's state outgrows it.
JOBMANAGER_STORAGE_MAX_STATE_BYTES = 5 * 1024 * 1024

# contract field -> Flink task metric names to try in order, and a scale to the contract's unit.
SUBTASK_METRICS: dict[str, tuple[tuple[str, ...], float]] = {
    "busy_time_ms_per_s": (("busyTimeMsPerSecond",), 1.0),
    "backpressured_time_ms_per_s": (("backPressuredTimeMsPerSecond",), 1.0),
    "idle_time_ms_per_s": (("idleTimeMsPerSecond",), 1.0),
    "records_in_per_s": (("numRecordsInPerSecond",), 1.0),
    "records_out_per_s": (("numRecordsOutPerSecond",), 1.0),
    "in_pool_usage": (("Shuffle.Netty.Input.Buffers.inPoolUsage", "buffers.inPoolUsage"), 1.0),
    "out_pool_usage": (("Shuffle.Netty.Output.Buffers.outPoolUsage", "buffers.outPoolUsage"), 1.0),
    "checkpoint_start_delay_ms": (("checkpointStartDelayNanos",), 1e-6),
    "checkpoint_alignment_time_ms": (("checkpointAlignmentTime",), 1e-6),
}
JM_HEAP_METRICS = ("Status.JVM.Memory.Heap.Used", "Status.JVM.Memory.Heap.Max")
JOB_METRICS = ("numRestarts",)


# Flink's default metrics.fetcher.update-interval: how often the JobManager refreshes the metrics its
# REST API serves (asked sooner, they are the same values again).
DEFAULT_METRICS_REFRESH_MS = 10_000
_DURATION_UNITS_MS = {"ns": 1e-6, "nano": 1e-6, "nanos": 1e-6, "nanosecond": 1e-6, "nanoseconds": 1e-6,
                      "us": 1e-3, "\u00b5s": 1e-3, "micro": 1e-3, "micros": 1e-3, "microsecond": 1e-3,
                      "microseconds": 1e-3, "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
                      "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
                      "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
                      "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000, "d": 86_400_000, "day": 86_400_000,
                      "days": 86_400_000}


def metrics_refresh_ms(jobmanager_config: Any) -> int | None:
    """How often the JobManager refreshes the metrics it serves, from ``/jobmanager/config``
    (``[{"key": ..., "value": ...}]``): ``metrics.fetcher.update-interval`` as Flink parses a
    duration (a bare number is milliseconds), Flink's default when the key is not set, None when
    the answer or the value is not understood.

    >>> [metrics_refresh_ms(v) for v in ([{"key": "metrics.fetcher.update-interval", "value": "2000"}],
    ...  [{"key": "metrics.fetcher.update-interval", "value": "30 s"}], [], "junk")]
    [2000, 30000, 10000, None]
    """
    if not isinstance(jobmanager_config, list):
        return None
    entry = next((e for e in jobmanager_config if isinstance(e, dict)
                  and e.get("key") == "metrics.fetcher.update-interval"), None)
    if entry is None:
        return DEFAULT_METRICS_REFRESH_MS
    text = str(entry.get("value") or "").strip().lower()
    if text.startswith("pt") and text.endswith("s") and text[2:-1].replace(".", "", 1).isdigit():
        return int(float(text[2:-1]) * 1000)  # ISO-8601, as Duration.toString() writes seconds
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz\u00b5 ")
    unit = text[len(number):].strip() or "ms"
    if unit not in _DURATION_UNITS_MS or not number.replace(".", "", 1).isdigit():
        return None
    return int(float(number) * _DURATION_UNITS_MS[unit])


def metric_number(value: Any) -> float | None:
    """A Flink metric value (a string, usually) as a float; NaN, infinities and junk are None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _count(value: Any) -> int | None:
    """A size, duration or timestamp Flink reports: negative means unknown."""
    number = metric_number(value)
    return int(number) if number is not None and number >= 0 else None


def subtask_metric_names(parallelism: int, names: Iterable[str] | None = None) -> list[str]:
    """The per-subtask ids (``<index>.<metric>``) to request from ``/vertices/:vid/metrics``: of
    ``names`` (by default every name of :data:`SUBTASK_METRICS`, older ones included)."""
    if names is None:
        names = [name for candidates, _ in SUBTASK_METRICS.values() for name in candidates]
    names = list(names)
    return [f"{index}.{name}" for index in range(parallelism) for name in names]


def names_in_use(names: list[str], values: Mapping[str, Any]) -> list[str]:
    """``names`` without the older names of a metric whose first-choice name ``values`` (an answer
    of ``/vertices/:vid/metrics``) holds: a cluster that answers the newer name never uses the older.

    >>> names_in_use(["busyTimeMsPerSecond", "Shuffle.Netty.Input.Buffers.inPoolUsage", "buffers.inPoolUsage"],
    ...              {"0.Shuffle.Netty.Input.Buffers.inPoolUsage": "0.1"})
    ['busyTimeMsPerSecond', 'Shuffle.Netty.Input.Buffers.inPoolUsage']
    """
    dropped = set()
    for candidates, _ in SUBTASK_METRICS.values():
        if len(candidates) > 1 and candidates[1] in names and any(
                key.endswith("." + candidates[0]) for key in values):
            dropped.update(candidates[1:])
    return [name for name in names if name not in dropped] if dropped else names


def _event(kind: str, cluster: str, job: Mapping[str, Any], ts: int, source: str) -> dict:
    return {"schema_version": SCHEMA_VERSION, "kind": kind, "cluster": cluster, "job_id": job["jid"],
            "job_name": job.get("name") or "", "ts": int(ts), "source": source}


def vertex_metrics_event(cluster: str, job: Mapping[str, Any], vertex: Mapping[str, Any],
                         values: Mapping[str, Any], ts: int, source: str = "collector") -> dict:
    """One ``vertex_metrics`` event from the ``<index>.<metric>`` values of one vertex."""
    parallelism = int(vertex.get("parallelism") or 1)
    subtasks = []
    fields = SUBTASK_METRICS.items()
    for index in range(parallelism):
        prefix = f"{index}."
        sample: dict[str, Any] = {"index": index}
        for field, (candidates, scale) in fields:
            number = None
            for name in candidates:  # the first name the answer has, even when its value is unknown
                key = prefix + name
                if key in values:
                    number = metric_number(values[key])
                    break
            sample[field] = None if number is None else number * scale
        subtasks.append(sample)
    return {**_event("vertex_metrics", cluster, job, ts, source), "vertex_id": vertex["id"],
            "vertex_name": vertex.get("name") or vertex["id"], "parallelism": parallelism, "subtasks": subtasks}


def checkpoint_event(cluster: str, job: Mapping[str, Any], checkpoint: Mapping[str, Any],
                     details: Mapping[str, Any] | None, subtask_details: Mapping[str, Mapping[str, Any]],
                     vertices: Iterable[Mapping[str, Any]], source: str = "collector") -> dict:
    """One ``checkpoint`` event from a finished entry of ``/checkpoints`` history, its
    ``/checkpoints/details/:cid`` (None when unavailable: the event then has no vertices) and the
    per-vertex ``/checkpoints/details/:cid/subtasks/:vid`` answers that could be fetched."""
    status = str(checkpoint.get("status", "")).upper()
    if status not in FINISHED_CHECKPOINT_STATES:
        raise ValueError(f"checkpoint {checkpoint.get('id')} is {status or 'of no status'}, not finished")
    trigger_ts = _count(checkpoint.get("trigger_timestamp")) or 0
    if status == "FAILED":
        ts = _count(checkpoint.get("failure_timestamp")) or _count(checkpoint.get("latest_ack_timestamp"))
    else:
        ts = _count(checkpoint.get("latest_ack_timestamp"))
    ts = ts or trigger_ts
    duration = _count(checkpoint.get("end_to_end_duration"))
    names = {v["id"]: v for v in vertices}
    event = {
        **_event("checkpoint", cluster, job, ts, source),
        "checkpoint_id": int(checkpoint["id"]),
        "status": status,
        "is_savepoint": bool(checkpoint.get("is_savepoint", False)),
        "trigger_ts": trigger_ts,
        # Required by the contract: a checkpoint that failed before any acknowledgement persisted
        # nothing, which is a measured zero, not a made-up one.
        "state_size_bytes": _count(checkpoint.get("state_size")) or 0,
        "checkpointed_size_bytes": _count(checkpoint.get("checkpointed_size")) or 0,
        "end_to_end_duration_ms": duration if duration is not None else max(0, ts - trigger_ts),
        "alignment_buffered_bytes": _count(checkpoint.get("alignment_buffered")) or 0,
        "processed_data_bytes": _count(checkpoint.get("processed_data")) or 0,
        "persisted_data_bytes": _count(checkpoint.get("persisted_data")) or 0,
        "num_subtasks": _count(checkpoint.get("num_subtasks")) or 0,
        "num_acknowledged_subtasks": _count(checkpoint.get("num_acknowledged_subtasks")) or 0,
        "failure_message": checkpoint.get("failure_message") if status == "FAILED" else None,
        "vertices": [],
    }
    for vertex_id, task in sorted(((details or {}).get("tasks") or {}).items()):
        vertex = names.get(vertex_id, {})
        detail = subtask_details.get(vertex_id) or {}
        event["vertices"].append({
            "vertex_id": vertex_id,
            "vertex_name": vertex.get("name") or vertex_id,
            "parallelism": _count(vertex.get("parallelism")) or _count(task.get("num_subtasks")),
            "state_size_bytes": _count(task.get("state_size")),
            "checkpointed_size_bytes": _count(task.get("checkpointed_size")),
            "subtasks": [_checkpoint_subtask(s) for s in detail.get("subtasks") or []],
        })
    return event


def _checkpoint_subtask(subtask: Mapping[str, Any]) -> dict:
    # A subtask that has not acknowledged ("pending_or_failed") carries only its index.
    checkpoint = subtask.get("checkpoint") or {}
    alignment = subtask.get("alignment") or {}
    return {
        "index": int(subtask["index"]),
        "state_size_bytes": _count(subtask.get("state_size")),
        "checkpointed_size_bytes": _count(subtask.get("checkpointed_size")),
        "end_to_end_duration_ms": _count(subtask.get("end_to_end_duration")),
        "alignment_duration_ms": _count(alignment.get("duration")),
        "start_delay_ms": _count(subtask.get("start_delay")),
        "sync_duration_ms": _count(checkpoint.get("sync")),
        "async_duration_ms": _count(checkpoint.get("async")),
        "unaligned": subtask.get("unaligned_checkpoint") if "unaligned_checkpoint" in subtask else None,
        "aborted": subtask.get("aborted") if "aborted" in subtask else None,
    }


def state_size_limit(checkpoint_config: Mapping[str, Any] | None, configured: int | None) -> int | None:
    """The hard limit a forecast can aim at: the cluster's configured one, else the 5 MiB that
    JobManagerCheckpointStorage enforces, else unknown."""
    if configured is not None:
        return configured
    storage = str((checkpoint_config or {}).get("checkpoint_storage") or "")
    return JOBMANAGER_STORAGE_MAX_STATE_BYTES if storage == "JobManagerCheckpointStorage" else None


def job_status_event(cluster: str, job: Mapping[str, Any], checkpoints: Mapping[str, Any] | None,
                     checkpoint_config: Mapping[str, Any] | None, job_metrics: Mapping[str, Any],
                     jm_metrics: Mapping[str, Any], ts: int, max_state_size_bytes: int | None = None,
                     source: str = "collector") -> dict:
    """One ``job_status`` event from the job's overview entry, its checkpoint statistics and
    configuration, its metrics and the JobManager's heap."""
    counts = (checkpoints or {}).get("counts") or {}
    config = checkpoint_config or {}
    heap_used, heap_max = (_count(jm_metrics.get(name)) for name in JM_HEAP_METRICS)
    return {
        **_event("job_status", cluster, job, ts, source),
        "state": str(job.get("state") or "UNKNOWN"),
        "num_restarts": _count(job_metrics.get("numRestarts")) or 0,
        "checkpoints_completed_total": _count(counts.get("completed")) or 0,
        "checkpoints_failed_total": _count(counts.get("failed")) or 0,
        "checkpoints_in_progress": _count(counts.get("in_progress")) or 0,
        "checkpoint_interval_ms": _interval(config.get("interval")),
        "checkpoint_timeout_ms": _count(config.get("timeout")),
        "max_state_size_bytes": state_size_limit(checkpoint_config, max_state_size_bytes),
        "jm_heap_used_bytes": heap_used,
        "jm_heap_max_bytes": heap_max,
    }


def _interval(value: Any) -> int | None:
    # Flink reports a disabled periodic checkpoint as Long.MAX_VALUE.
    interval = _count(value)
    return None if interval is None or interval >= 2**63 - 1 else interval
