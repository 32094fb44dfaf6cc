"""Which checkpoints of which job the collector has published, kept across restarts (on local disk or
shared storage: a collector moved to another host finds it there).

Per job: a ``watermark`` (every finished checkpoint with an id up to it has been published, or was
gone from Flink's history before the collector saw it) and the ids above it already published.
The watermark cannot simply be the largest published id: with concurrent checkpoints, id 7 can
complete while id 6 is still in progress, and 6 must still be published when it finishes.

The file is replaced whole (locally: write, fsync, rename; on an object store: one PUT) and only
after the events it records were acknowledged by Kafka, so a crash between the two publishes a
checkpoint twice at worst, never not at all.

>>> ledger = CheckpointLedger()
>>> history = [{"id": 5, "status": "COMPLETED"}, {"id": 6, "status": "IN_PROGRESS"}, {"id": 7, "status": "COMPLETED"}]
>>> [c["id"] for c in ledger.unpublished("job", history)]
[5, 7]
>>> ledger.mark_published("job", [5, 7], history)
>>> ledger.jobs["job"]
{'watermark': 5, 'published': [7], 'terminal_reported': False}
>>> history[1]["status"] = "FAILED"
>>> [c["id"] for c in ledger.unpublished("job", history)]
[6]
>>> ledger.forget_except([], now_ms=0); list(ledger.jobs)
['job']
>>> ledger.forget_except([], now_ms=FORGET_AFTER_MS); list(ledger.jobs)
[]
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pipelines.collector.mapping import FINISHED_CHECKPOINT_STATES
from pipelines.errors import SetupError
from pipelines.io.storage import Location

log = logging.getLogger(__name__)

FORGET_AFTER_MS = 24 * 3600 * 1000


class LedgerError(SetupError, RuntimeError):
    """The ledger file cannot be read or written; the message names it."""


class CheckpointLedger:
    def __init__(self, path: Location | Path | None = None):
        self.path = None if path is None else Location.of(path)
        self.jobs: dict[str, dict[str, Any]] = {}
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self.jobs = {job: {"watermark": int(entry["watermark"]), "published": sorted(map(int, entry["published"])),
                                   "terminal_reported": bool(entry.get("terminal_reported", False)),
                                   **({"last_seen_ms": int(entry["last_seen_ms"])} if "last_seen_ms" in entry else {})}
                             for job, entry in data["jobs"].items()}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise LedgerError(f"collector ledger {path} is unreadable ({exc}); move it away to start over "
                                  "(the checkpoints still in Flink's history are then published again)") from exc

    def unpublished(self, job_id: str, history: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Finished checkpoints of ``history`` not published yet, oldest first."""
        entry = self.jobs.get(job_id)
        watermark = entry["watermark"] if entry else -1
        published = set(entry["published"]) if entry else set()
        fresh = [c for c in history if str(c.get("status", "")).upper() in FINISHED_CHECKPOINT_STATES
                 and int(c["id"]) > watermark and int(c["id"]) not in published]
        ids = [int(c["id"]) for c in history]
        if entry and ids and min(ids) > watermark + 1 and watermark >= 0:
            log.warning("job %s: checkpoints %d..%d left Flink's history before they were collected "
                        "(poll more often, or raise web.checkpoints.history)", job_id, watermark + 1, min(ids) - 1)
        return sorted(fresh, key=lambda c: int(c["id"]))

    def mark_published(self, job_id: str, ids: Iterable[int], history: Sequence[Mapping[str, Any]]) -> None:
        entry = self.jobs.setdefault(job_id, {"watermark": -1, "published": [], "terminal_reported": False})
        published = set(entry["published"]) | {int(i) for i in ids}
        history_ids = [int(c["id"]) for c in history]
        pending = [int(c["id"]) for c in history
                   if str(c.get("status", "")).upper() not in FINISHED_CHECKPOINT_STATES]
        if pending:
            watermark = min(pending) - 1
        else:
            watermark = max(history_ids, default=entry["watermark"])
        watermark = max(watermark, entry["watermark"])
        entry["watermark"] = watermark
        entry["published"] = sorted(i for i in published if i > watermark)

    def adopt(self, job_id: str, entry: Mapping[str, Any]) -> None:
        """Take a job's entry from another ledger of the same cluster (one another collector
        process wrote): merged with this one's, nothing published by either is published again."""
        mine = self.jobs.get(job_id)
        if mine is None:
            self.jobs[job_id] = {**entry, "published": list(entry["published"])}
            return
        watermark = max(mine["watermark"], entry["watermark"])
        mine["published"] = sorted(i for i in set(mine["published"]) | set(entry["published"]) if i > watermark)
        mine["watermark"] = watermark
        mine["terminal_reported"] = mine["terminal_reported"] or entry["terminal_reported"]

    def terminal_reported(self, job_id: str) -> bool:
        return bool(self.jobs.get(job_id, {}).get("terminal_reported"))

    def mark_terminal(self, job_id: str) -> None:
        self.jobs.setdefault(job_id, {"watermark": -1, "published": [], "terminal_reported": False})
        self.jobs[job_id]["terminal_reported"] = True

    def forget_except(self, job_ids: Iterable[str], now_ms: int, grace_ms: int = FORGET_AFTER_MS) -> None:
        """Drop jobs the cluster has not listed for ``grace_ms`` (its archive expired them). Not at
        once: a JobManager that fails over can list no jobs for a while, then list them again."""
        listed = set(job_ids)
        for job, entry in self.jobs.items():
            if job in listed or "last_seen_ms" not in entry:
                entry["last_seen_ms"] = now_ms
        self.jobs = {job: entry for job, entry in self.jobs.items()
                     if job in listed or now_ms - entry.get("last_seen_ms", now_ms) < grace_ms}

    def save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.write_text(json.dumps({"jobs": self.jobs}, sort_keys=True))
        except OSError as exc:
            raise LedgerError(f"cannot write the collector ledger {self.path}: {exc}") from exc
