"""The job's own health, where operators look: the log, /metrics and a Prometheus text file.

A :class:`MetricsListener` (Spark's ``StreamingQueryListener``) logs each query's progress (input
and processing rate, batch duration, state rows, how far its newest event is behind), updates the
job's :class:`~pipelines.telemetry.DetectionMetrics` and writes their registry to the Prometheus
text file (``prometheus_client.write_to_textfile``: atomic, for node_exporter's textfile collector
or any scraper that reads files) after every batch and every idle trigger. /metrics serves the same
registry, so the file and the page carry the same names and the same rules read both.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest, write_to_textfile

from pipelines.detection.spark_state import ProgressListener, checkpoint_watermark_ms
from pipelines.telemetry import BatchProgress, DetectionMetrics

log = logging.getLogger(__name__)


def _event_time_s(progress: Any, key: str) -> float | None:
    """``progress.eventTime[key]`` (Spark's ISO-8601 "max", "watermark", ...) in epoch seconds."""
    text = (progress.eventTime or {}).get(key)
    if not text:
        return None
    seconds = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return seconds or None  # Spark reports the epoch before the first watermark


def batch_progress(progress: Any) -> BatchProgress:
    """The metrics of one ``StreamingQueryProgress``."""
    state = progress.stateOperators or []
    return BatchProgress(
        batch_id=int(progress.batchId), input_rows=int(progress.numInputRows),
        input_rows_per_second=float(progress.inputRowsPerSecond or 0.0),
        processed_rows_per_second=float(progress.processedRowsPerSecond or 0.0),
        duration_s=float((progress.durationMs or {}).get("triggerExecution", 0)) / 1000.0,
        state_rows=int(sum(s.numRowsTotal for s in state)),
        rows_dropped_by_watermark=int(sum(s.numRowsDroppedByWatermark for s in state)),
        newest_event_s=_event_time_s(progress, "max"), watermark_s=_event_time_s(progress, "watermark"))


def checkpointed_newest_event_s(checkpoint: Any, watermark_delay_ms: int) -> float | None:
    """At least how new the newest event a query's checkpoint (a :class:`~pipelines.io.storage.Location`)
    has processed is: its latest watermark plus the watermark's delay, as Spark computes the
    watermark from the newest event time; None before its first watermark. A job restarted onto a
    quiet input has no batch to report it, and its event lag would otherwise be unknown."""
    watermark_ms = checkpoint_watermark_ms(checkpoint)
    return None if watermark_ms is None else (watermark_ms + watermark_delay_ms) / 1000.0


class MetricsListener(ProgressListener):
    def __init__(self, path: Path, sinks: Any = None, models: Any = None, metrics: DetectionMetrics | None = None):
        self.path = Path(path)
        self.sinks = sinks  # what the job published (a DetectionSinks)
        self.models = models
        self.metrics = metrics if metrics is not None else DetectionMetrics()  # also served over HTTP
        self.names: dict[str, str] = {}  # query id -> name: an idle event carries only the id

    def onQueryStarted(self, event) -> None:
        self.names[str(event.id)] = event.name or str(event.id)
        log.info("query %s started (id %s)", event.name, event.id)

    def onQueryProgress(self, event) -> None:
        p = event.progress
        name = self.names.setdefault(str(p.id), p.name or str(p.id))
        batch = batch_progress(p)
        self.metrics.progress(name, batch)
        if self.models is not None:
            versions, reachable = self.scoring()
            self.metrics.models(versions, reachable)
        newest = self.metrics.lags.newest.get(name)
        log.info("%s batch %d: %d rows, %.0f rows/s in, %.0f rows/s processed, %.1fs, %d state rows%s", name,
                 batch.batch_id, batch.input_rows, batch.input_rows_per_second, batch.processed_rows_per_second,
                 batch.duration_s, batch.state_rows,
                 f", newest event {max(0.0, time.time() - newest):.0f}s behind" if newest else "")
        self.write()

    def onQueryIdle(self, event) -> None:
        self.metrics.idle(self.names.get(str(event.id), str(event.id)))
        self.write()

    def onQueryTerminated(self, event) -> None:
        if event.exception:
            log.error("query %s stopped with an error: %s", event.id, event.exception.splitlines()[0])

    def scoring(self) -> tuple[dict[str, tuple[str, str]], bool]:
        """The model (name, version) of each family the job scores with, and whether the registry
        answers: as the executors last reported them, else as the driver loaded them at start."""
        if self.sinks is not None and self.sinks.models:
            return ({f: tuple(m) for f, m in self.sinks.models.items()}, self.sinks.registry_error is None)
        return ({f: (m.name, m.version) for f, m in self.models.models.items()}, self.models.registry_error is None)

    def text(self) -> str:
        """The metrics as /metrics serves them and the text file holds them."""
        return generate_latest(self.metrics.registry).decode()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(self.path), self.metrics.registry)
