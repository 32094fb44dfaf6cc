"""The order rules of a job's input events: which stream an event belongs to and its place in it,
whose clock stamps it, how a recording is sorted when its arrival order is not known, and why an
event arriving now is not used (:data:`LATE`, :data:`OUT_OF_ORDER`).

:class:`~feature_store.job_features.JobFeatureState` applies them (``refusal``): an event is used
as it arrives unless it is not after the last event of its own stream, more than the allowed
lateness behind the latest event of its clock, or older than the end of a finished job.
"""

from __future__ import annotations

# The order of one poll's events when they share a timestamp: samples before the evaluations that read them.
KIND_RANK = {"vertex_metrics": 0, "checkpoint": 1, "job_status": 2}
TERMINAL_STATES = {"FINISHED", "CANCELED", "FAILED"}
DEFAULT_IDLE_TIMEOUT_MS = 30 * 60_000
DEFAULT_LATENESS_MS = 10_000
RECENT_CHECKPOINT_IDS = 32  # what a duplicate checkpoint is recognised by (older ones are late anyway)
LATE, OUT_OF_ORDER = "late", "out_of_order"  # why an event is not used


def time_order(event: dict) -> tuple[int, int]:
    """Event time, then the kind's place in a poll: how a recording is sorted when its arrival
    order is not known (the simulator's and the lab's datasets)."""
    return int(event["ts"]), KIND_RANK.get(event["kind"], 3)


# Whose clock stamps an event: a checkpoint's times are the JobManager's, a sample's the collector's.
# Lateness is judged against the latest event of the same clock, so that skew between the two
# clocks (up to features.max_source_delay_s, the watermark's delay) drops nothing.
CLOCK_OF_KIND = {"checkpoint": "jobmanager", "vertex_metrics": "collector", "job_status": "collector"}


def stream_position(event: dict) -> tuple[str, int]:
    """The stream an event belongs to, and its place in it: event time, or for a checkpoint its
    id (concurrent checkpoints may finish out of id order, and several at the same millisecond)."""
    kind = event["kind"]
    if kind == "checkpoint":
        return kind, int(event["checkpoint_id"])
    if kind == "vertex_metrics":
        return f"vertex/{event['vertex_id']}", int(event["ts"])
    return kind, int(event["ts"])
