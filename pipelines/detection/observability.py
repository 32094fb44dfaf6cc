"""The job's own health, where operators look: the log, /metrics and a Prometheus text file.

A :class:`MetricsListener` (Spark's ``StreamingQueryListener``) logs each query's progress (input
and processing rate, batch duration, state rows, events dropped behind the watermark, watermark
lag), updates the metrics ``sentinel run`` serves over HTTP (:mod:`pipelines.telemetry`), and
rewrites the Prometheus text file after every batch, atomically, for node_exporter's textfile
collector or any scraper that reads files.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener, QueryProgressEvent

log = logging.getLogger(__name__)

PREFIX = "checkpoint_sentinel"


def _watermark_ms(progress: Any) -> int | None:
    text = (progress.eventTime or {}).get("watermark")
    if not text:
        return None
    ms = int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    return ms or None  # Spark reports the epoch before the first watermark


class ProgressListener(StreamingQueryListener):
    """A ``StreamingQueryListener`` whose progress events cross from the JVM as one JSON string.

    PySpark's own bridge builds each ``StreamingQueryProgress`` field by field, about a hundred
    Py4J calls per event (every state operator's and source's metric is one): about 3.5 CPU s a
    minute in the JVM's listener thread alone, with two listeners, in the 2,000-job fleet
    benchmark. Here the event's JSON is read in one call and parsed in Python with PySpark's
    ``fromJson``; the listener sees the same ``QueryProgressEvent``, its rates rounded to
    0.1 row/s as Spark's JSON has them."""

    # PySpark's private hook (pinned 4.3): what StreamingQueryManager.addListener hands to the
    # JVM. tests/pipelines/detection/test_observability.py fails if an upgrade bypasses it.
    @property
    def _jlistener(self) -> Any:
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(_JsonProgressEvents(self))
        return self._jlistenerobj


class _JsonProgressEvents(JStreamingQueryListener):
    def onQueryProgress(self, jevent: Any) -> None:
        self.pylistener.onQueryProgress(QueryProgressEvent.fromJson(json.loads(jevent.json())))


class MetricsListener(ProgressListener):
    def __init__(self, path: Path, sinks: Any = None, models: Any = None, metrics: Any = None):
        self.path = Path(path)
        self.sinks = sinks  # what the job published (a DetectionSinks)
        self.models = models
        self.metrics = metrics  # a DetectionMetrics, served over HTTP
        self.queries: dict[str, dict[str, float]] = {}

    def onQueryStarted(self, event) -> None:
        log.info("query %s started (id %s)", event.name, event.id)

    def onQueryProgress(self, event) -> None:
        p = event.progress
        state = p.stateOperators or []
        watermark = _watermark_ms(p)
        metrics = {
            "input_rows": float(p.numInputRows),
            "input_rows_per_second": float(p.inputRowsPerSecond or 0.0),
            "processed_rows_per_second": float(p.processedRowsPerSecond or 0.0),
            "batch_duration_seconds": float((p.durationMs or {}).get("triggerExecution", 0)) / 1000.0,
            "batch_id": float(p.batchId),
            "state_rows": float(sum(s.numRowsTotal for s in state)),
            "rows_dropped_by_watermark": float(sum(s.numRowsDroppedByWatermark for s in state)),
        }
        if watermark is not None:
            metrics["watermark_lag_seconds"] = max(0.0, time.time() - watermark / 1000.0)
        self.queries[p.name or str(p.id)] = metrics
        if self.metrics is not None:
            self.metrics.progress(p.name or str(p.id), p.numInputRows, metrics["batch_duration_seconds"],
                                  metrics["processed_rows_per_second"], int(metrics["state_rows"]),
                                  int(metrics["rows_dropped_by_watermark"]), metrics.get("watermark_lag_seconds"))
            if self.models is not None:
                versions, reachable = self.scoring()
                self.metrics.models(versions, reachable)
        log.info("%s batch %d: %d rows, %.0f rows/s in, %.0f rows/s processed, %.1fs, %d state rows%s", p.name,
                 p.batchId, p.numInputRows, metrics["input_rows_per_second"], metrics["processed_rows_per_second"],
                 metrics["batch_duration_seconds"], metrics["state_rows"],
                 f", watermark lag {metrics['watermark_lag_seconds']:.0f}s" if watermark is not None else "")
        self.write()

    def onQueryIdle(self, event) -> None:
        pass

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
        lines = []
        for name, metrics in sorted(self.queries.items()):
            for metric, value in sorted(metrics.items()):
                lines.append(f'{PREFIX}_{metric}{{query="{name}"}} {value:g}')
        if self.sinks is not None:
            lines.append(f"{PREFIX}_incident_events_total {self.sinks.incidents_published}")
            lines.append(f"{PREFIX}_dead_letters_total {self.sinks.dead_letters}")
            for reason, count in sorted(self.sinks.late.items()):
                lines.append(f'{PREFIX}_late_events_total{{reason="{reason}"}} {count}')
        if self.models is not None:
            versions, reachable = self.scoring()
            lines.append(f"{PREFIX}_model_registry_reachable {1 if reachable else 0}")
            for family, (_, version) in sorted(versions.items()):
                lines.append(f'{PREFIX}_model_version{{family="{family}"}} {version}')
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(self.text())
        tmp.replace(self.path)
