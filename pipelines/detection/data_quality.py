"""The input data's Great Expectations suite, run on samples of the live stream beside the job.

Dead-letter validation already keeps every unusable record out, one record at a time. This
suite watches the *distribution* of the usable ones (key columns always there, ratios and sizes
in range, every kind present over time): a producer that starts sending zeros, or a collector
that loses a metric, shows up here first. A validation costs about a second, mostly fixed, so
the job hands a sample to a background thread at most every ``gx_min_interval_s`` and never
waits for it; results go to the log and to ``<state_dir>/logs/input_validation.jsonl``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pandas as pd

from models.validation import gx, run_expectations

log = logging.getLogger(__name__)

KINDS = ["checkpoint", "vertex_metrics", "job_status"]


def flatten(events: Iterable[dict]) -> pd.DataFrame:
    """One row per event with the top-level scalar fields the suite checks."""
    rows = []
    for e in events:
        rows.append({
            "kind": e.get("kind"), "cluster": e.get("cluster"), "job_id": e.get("job_id"), "ts": e.get("ts"),
            "state_size_bytes": e.get("state_size_bytes"), "end_to_end_duration_ms": e.get("end_to_end_duration_ms"),
            "status": e.get("status"), "parallelism": e.get("parallelism"),
            "busy_time_ms_per_s": max((s.get("busy_time_ms_per_s") or 0.0 for s in e.get("subtasks") or []), default=None)
            if e.get("kind") == "vertex_metrics" else None,
            "state": e.get("state"),
        })
    return pd.DataFrame(rows)


def input_expectations() -> list:
    E = gx.expectations
    return [
        *(E.ExpectColumnValuesToNotBeNull(column=c) for c in ("kind", "cluster", "job_id", "ts")),
        E.ExpectColumnValuesToBeInSet(column="kind", value_set=KINDS),
        E.ExpectColumnValuesToBeInSet(column="status", value_set=["COMPLETED", "FAILED"]),
        E.ExpectColumnValuesToBeBetween(column="state_size_bytes", min_value=0),
        E.ExpectColumnValuesToBeBetween(column="end_to_end_duration_ms", min_value=0, max_value=86_400_000),
        E.ExpectColumnValuesToBeBetween(column="busy_time_ms_per_s", min_value=0, max_value=1100),
        E.ExpectColumnValuesToBeBetween(column="parallelism", min_value=1),
        E.ExpectColumnValuesToMatchRegex(column="job_id", regex="^[0-9a-f]{32}$"),
    ]


@dataclass
class InputValidationResult:
    batch_id: int
    rows: int
    checked: int
    failures: list[str]
    seconds: float

    @property
    def success(self) -> bool:
        return not self.failures


def validate_input_sample(sample: pd.DataFrame, batch_id: int) -> InputValidationResult:
    started = time.monotonic()
    checked, failures = run_expectations(sample, input_expectations(), "input")
    return InputValidationResult(batch_id, len(sample), checked, failures, time.monotonic() - started)


class BackgroundValidator:
    """At most one validation in flight and one per ``min_interval_s``; never blocks the caller."""

    def __init__(self, log_path: Path, min_interval_s: float, clock=time.monotonic):
        self.log_path = Path(log_path)
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._last_start: float | None = None
        self._thread: threading.Thread | None = None
        self.results: list[InputValidationResult] = []

    def due(self) -> bool:
        busy = self._thread is not None and self._thread.is_alive()
        return not busy and (self._last_start is None or self.clock() - self._last_start >= self.min_interval_s)

    def submit(self, sample: pd.DataFrame, batch_id: int) -> bool:
        if sample.empty or not self.due():
            return False
        self._last_start = self.clock()
        self._thread = threading.Thread(target=self._validate, args=(sample, batch_id), name="gx-input", daemon=True)
        self._thread.start()
        return True

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _validate(self, sample: pd.DataFrame, batch_id: int) -> None:
        try:
            result = validate_input_sample(sample, batch_id)
        except Exception:  # a broken validation must not take the job down
            log.exception("input validation of batch %s failed to run", batch_id)
            return
        self.results.append(result)
        if result.success:
            log.info("input validation of batch %s: %d rows, %d expectations met (%.1fs)",
                     batch_id, result.rows, result.checked, result.seconds)
        else:
            log.warning("input validation of batch %s: %d of %d expectations FAILED: %s", batch_id,
                        len(result.failures), result.checked, "; ".join(result.failures))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as out:
            out.write(json.dumps({"batch_id": batch_id, "rows": result.rows, "checked": result.checked,
                                  "success": result.success, "failures": result.failures,
                                  "seconds": round(result.seconds, 3), "at": int(time.time() * 1000)}) + "\n")
