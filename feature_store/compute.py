"""The one feature definition over a batch DataFrame (training, backfill): each job's events, in
the order they arrived, through its own :class:`~feature_store.job_features.JobFeatureState`.

The input is an *event frame* (:func:`event_frame`): one row per valid input event with
``cluster, job_id, ts, kind``, the event's JSON text in ``value`` and its arrival order in ``seq``.
The live job drives the same state machine from its stateful processor
(:mod:`pipelines.detection.processor`), a job's events in the order they reached Kafka; its
feature log is what this path gives for the same events in the same order.
"""

from __future__ import annotations

import orjson
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from feature_store.definitions import FEATURE_NAMES, ROW_COLUMNS, feature_row_schema
from feature_store.job_features import DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_LATENESS_MS, JobFeatureState

EVENT_FRAME_COLUMNS = ["cluster", "job_id", "ts", "kind", "value", "seq"]
OUTPUT_COLUMNS = [name for name, _ in ROW_COLUMNS] + list(FEATURE_NAMES)


def event_frame(json_events: DataFrame, value_column: str = "value", order: Column | None = None) -> DataFrame:
    """``cluster, job_id, ts, kind, value, seq`` from a frame of JSON event strings.

    The input is assumed valid against the input contract (a simulator or lab dataset, or
    recorded input). ``order`` is the events' arrival order (default: the frame's own order).
    """
    value = F.col(value_column).cast("string")
    return json_events.select(
        F.get_json_object(value, "$.cluster").alias("cluster"),
        F.get_json_object(value, "$.job_id").alias("job_id"),
        F.get_json_object(value, "$.ts").cast("long").alias("ts"),
        F.get_json_object(value, "$.kind").alias("kind"),
        value.alias("value"),
        (order if order is not None else F.monotonically_increasing_id()).alias("seq"),
    )


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=OUTPUT_COLUMNS)


def _batch_job(idle_timeout_ms: int, lateness_ms: int):
    def compute(events: pd.DataFrame) -> pd.DataFrame:
        events = events.sort_values("seq", kind="stable")
        return _frame(JobFeatureState().consume_all((orjson.loads(v) for v in events["value"]), idle_timeout_ms,
                                                    lateness_ms))

    return compute


def batch_features(events: DataFrame, idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
                   lateness_ms: int = DEFAULT_LATENESS_MS) -> DataFrame:
    """Feature rows for every evaluation point of every job in a batch event frame."""
    return (events.select(*EVENT_FRAME_COLUMNS)
            .groupBy("cluster", "job_id")
            .applyInPandas(_batch_job(idle_timeout_ms, lateness_ms), feature_row_schema()))
