"""Skew: a hot key loads one subtask with most records or state; barrier alignment waits on it.

Its detector reads how unevenly a vertex's subtasks share records and state (``hot_subtask`` is
an index: where the skew is, not whether), and its incidents name the hot subtask.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipelines.families.base import STARTUP_S, Family, Plot, col, fired, num

NAME = "skew"


class Skew(Family):
    def subtask(self, row: Mapping[str, Any]) -> int | None:
        hot = num(row, "hot_subtask")
        return int(hot) if hot is not None else None

    def summary(self, where: str, row: Mapping[str, Any], forecast: dict | None, severity: str) -> str:
        ratio = num(row, "records_in_max_over_mean") or num(row, "state_max_over_mean")
        sub = self.subtask(row)
        return (f"[{severity}] skew in {where}: subtask {sub if sub is not None else '?'} carries "
                f"{ratio or 0:.1f}x the mean load; salt the hot key or pre-aggregate")

    def static_alarm(self, frame: pd.DataFrame, thresholds: Any) -> np.ndarray:
        # Dhalion's rate-skew ratio: the busiest subtask's input rate over the mean.
        return fired(col(frame, "records_in_max_over_mean") > thresholds.rate_skew_ratio)


FAMILY = Skew(
    name=NAME, label="Skew", alertname="FlinkSkew", model_name="sentinel-skew",
    page_plot="subtask_shares",
    localised=True, supervised=True, colour="tab:purple",
    decisive_plot=Plot("records_in_hot_excess", "hot subtask's excess share"),
    features=(
        "checkpoint_interval_ms", "records_in_max_over_mean", "records_in_cv", "state_max_over_mean", "state_cv",
        "records_in_hot_excess", "state_hot_excess", "start_delay_max_over_median", "busy_max", "start_delay_max_ms"),
    monotone=(
        ("records_in_max_over_mean", 1), ("records_in_cv", 1), ("records_in_hot_excess", 1),
        ("state_max_over_mean", 1), ("state_cv", 1), ("state_hot_excess", 1), ("start_delay_max_over_median", 1)),
    # A subtask with a tenth more than its fair share of the records or the state, in a vertex not
    # itself backpressured half the time (its downstream sets its rates, not its keys), past the
    # first minute after a (re)start.
    post_rule=(("startup_s", STARTUP_S), ("evidence", (("records_in_hot_excess", 0.1), ("state_hot_excess", 0.1))),
               ("refused_by", (("backpressured_max", 0.5),))),
    recent_column="records_in_max_over_mean",
    runbook=(
        "Look at the hot subtask's key distribution (evidence: subtask_index) for a dominant key.",
        "Salt the hot key (key + random suffix) and merge the partial results in a second step.",
        "Use two-phase (local then global) aggregation, e.g. table.optimizer.agg-phase-strategy: TWO_PHASE.",
        "For non-keyed stages, rebalance() the stream; for joins, broadcast the small side.",
        "Enable unaligned checkpoints so barrier alignment stops waiting on the hot subtask.",
    ),
)
