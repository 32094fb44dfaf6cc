"""Drive the one feature definition two ways: over a batch DataFrame and over a stream.

Both take an *event frame*: one row per valid input event with ``cluster, job_id, ts, kind``
and the event's JSON text in ``value`` (:func:`event_frame`). Both group by job and feed each
job's events, in :func:`~feature_store.job_features.event_order_key` order, to a
:class:`~feature_store.job_features.JobFeatureState`:

* **batch** (training, backfill, replay): ``applyInPandas`` over each job's whole history;
* **stream** (the live job): ``transformWithStateInPandas`` in event-time mode. Events wait in
  state until the watermark passes them, so they are consumed in event-time order even when
  they arrive out of order. An event older than the watermark is *late*: Spark drops it before
  the processor and counts it in the query progress (``numRowsDroppedByWatermark``); one exactly
  at the watermark reaches the processor and comes out as an ``is_late`` row, not consumed.
  A job idle for ``idle_timeout`` of event time, or finished, is evicted by an event-time timer.

Because the watermark holds events back by the allowed lateness, the stream emits a job's
features up to ``max(ts) - lateness``; the batch path emits them all.
"""

from __future__ import annotations

import json
from typing import Iterator

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from feature_store.definitions import FEATURE_NAMES, ROW_COLUMNS, feature_row_schema
from feature_store.job_features import DEFAULT_IDLE_TIMEOUT_MS, JobFeatureState, event_order_key

EVENT_FRAME_COLUMNS = ["cluster", "job_id", "ts", "kind", "value"]
OUTPUT_COLUMNS = [name for name, _ in ROW_COLUMNS] + list(FEATURE_NAMES)


def event_frame(json_events: DataFrame, value_column: str = "value") -> DataFrame:
    """``cluster, job_id, ts, kind, value, event_time`` from a frame of JSON event strings.

    The input is assumed valid against the input contract (the job's validation stage, or a
    simulator or lab dataset); ``event_time`` is the watermark column.
    """
    value = F.col(value_column).cast("string")
    return json_events.select(
        F.get_json_object(value, "$.cluster").alias("cluster"),
        F.get_json_object(value, "$.job_id").alias("job_id"),
        F.get_json_object(value, "$.ts").cast("long").alias("ts"),
        F.get_json_object(value, "$.kind").alias("kind"),
        value.alias("value"),
    ).withColumn("event_time", F.timestamp_millis("ts"))


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=OUTPUT_COLUMNS)


# --- batch -------------------------------------------------------------------------------------


def _batch_job(idle_timeout_ms: int):
    def compute(events: pd.DataFrame) -> pd.DataFrame:
        state = JobFeatureState()
        rows: list[dict] = []
        for event in sorted((json.loads(v) for v in events["value"]), key=event_order_key):
            produced = state.consume(event, idle_timeout_ms)
            if produced:
                rows.extend(produced)
        return _frame(rows)

    return compute


def batch_features(events: DataFrame, idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS) -> DataFrame:
    """Feature rows for every evaluation point of every job in a batch event frame."""
    return (events.select(*EVENT_FRAME_COLUMNS)
            .groupBy("cluster", "job_id")
            .applyInPandas(_batch_job(idle_timeout_ms), feature_row_schema()))


# --- streaming ---------------------------------------------------------------------------------


class JobFeatureProcessor(StatefulProcessor):
    """Per job: the feature state machine, the events waiting for the watermark, and timers."""

    def __init__(self, idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS):
        self.idle_timeout_ms = idle_timeout_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        # One JSON value each: array and map state fields are not usable from Python in 4.3.
        self.machine = handle.getValueState("machine", "json string")
        self.pending = handle.getValueState("pending", "json string")
        self.evict_at = handle.getValueState("evict_at", "ms long")

    def _load(self, state, default):
        return json.loads(state.get()[0]) if state.exists() else default

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        pending = self._load(self.pending, [])  # [[ts, event json], ...]
        timers = {ts for ts, _ in pending}
        late: list[dict] = []
        for frame in rows:
            for cluster, job_id, ts, value in zip(frame["cluster"], frame["job_id"], frame["ts"], frame["value"]):
                ts = int(ts)
                if watermark > 0 and ts <= watermark:
                    late.append({"cluster": cluster, "job_id": job_id, "ts": ts, "trigger_kind": "late", "is_late": True})
                    continue
                pending.append([ts, value])
                if ts not in timers:
                    self.handle.registerTimer(ts)
                    timers.add(ts)
        self.pending.update((json.dumps(pending),))
        if late:
            yield _frame(late)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        pending = self._load(self.pending, [])
        ready = sorted((json.loads(v) for ts, v in pending if ts <= watermark), key=event_order_key)
        waiting = [p for p in pending if p[0] > watermark]
        machine = JobFeatureState.from_json(self.machine.get()[0]) if self.machine.exists() else JobFeatureState()
        rows: list[dict] = []
        for event in ready:
            produced = machine.consume(event, self.idle_timeout_ms)
            if produced:
                rows.extend(produced)
        if waiting:
            self.pending.update((json.dumps(waiting),))
        else:
            self.pending.clear()
        evict = machine.terminated or (machine.last_seen_ts is not None
                                       and watermark >= machine.last_seen_ts + self.idle_timeout_ms)
        if evict and not waiting:
            # Gone for good or idle too long: the detector must not keep what it no longer sees.
            self.machine.clear()
            self.evict_at.clear()
            for timer in list(self.handle.listTimers()):
                self.handle.deleteTimer(timer)
        elif ready:
            self.machine.update((machine.to_json(),))
            # One eviction timer per job, moved forward as events arrive.
            if self.evict_at.exists():
                self.handle.deleteTimer(self.evict_at.get()[0])
            evict_at = machine.last_seen_ts + self.idle_timeout_ms + 1
            self.handle.registerTimer(evict_at)
            self.evict_at.update((evict_at,))
        if rows:
            yield _frame(rows)

    def close(self) -> None:
        pass


def stream_features(events: DataFrame, lateness: str = "30 seconds",
                    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS) -> DataFrame:
    """Feature rows (and ``is_late`` markers) from a streaming event frame, in event time."""
    return (events.select(*EVENT_FRAME_COLUMNS, "event_time")
            .withWatermark("event_time", lateness)
            .groupBy("cluster", "job_id")
            .transformWithStateInPandas(
                statefulProcessor=JobFeatureProcessor(idle_timeout_ms),
                outputStructType=feature_row_schema(),
                outputMode="Append",
                timeMode="EventTime",
            ))
