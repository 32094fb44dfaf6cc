"""Input events in the order they reach the job."""

from __future__ import annotations


def as_a_collector_reports(events: list[dict], poll_ms: int = 5_000) -> list[dict]:
    """Each checkpoint arriving after its job's events of the next ``poll_ms``, as a collector
    polling that often reports it (on the lab's real Flink, checkpoints arrive a few seconds late)."""
    out: list[dict] = []
    held: list[dict] = []
    for event in events:
        due = [c for c in held if c["job_id"] != event["job_id"] or c["ts"] + poll_ms < event["ts"]]
        if due:
            held = [c for c in held if c not in due]
            out.extend(due)
        if event["kind"] == "checkpoint":
            held.append(event)
        else:
            out.append(event)
    return out + held
