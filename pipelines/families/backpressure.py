"""Backpressure: a slow operator blocks buffers, barriers cannot move, checkpoints balloon.

Its detector reads how busy a vertex is and how the vertices around it wait on it, never the
buffer pools (a saturated operator fed over a local channel reports inPoolUsage 0 on Flink 2.3,
over the network close to 1: docs/DETECTORS.md, "Detectors and their post-rules"), no subtask
means (a vertex is as fast as its slowest subtask) and no growth of the barriers' delays (a
saturated bottleneck's checkpoints all expire, its delays stop growing at the timeout, and a
model reading their slopes let go of it there).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipelines.families.base import STARTUP_S, Family, Plot, col, fired, num

NAME = "backpressure"
# A bottleneck's input rate this far over its usual is load, not a slowdown.
SURGE_OVER_USUAL = 1.02


class Backpressure(Family):
    def severity(self, row: Mapping[str, Any], forecast: dict | None, critical_eta_s: float) -> str:
        return "critical" if (num(row, "checkpoint_duration_over_timeout") or 0.0) >= 0.5 else "warning"

    def summary(self, where: str, row: Mapping[str, Any], forecast: dict | None, severity: str) -> str:
        busy = num(row, "busy_max")
        return (f"[{severity}] backpressure: {where} is the bottleneck (busy {busy * 100:.0f}%)" if busy is not None
                else f"[{severity}] backpressure at {where}") + "; scale it out or enable unaligned checkpoints"

    def static_alarm(self, frame: pd.DataFrame, thresholds: Any) -> np.ndarray:
        # backPressuredTimeMsPerSecond > 200 for a minute (the features are one-minute averages).
        return fired(col(frame, "backpressured_max") > thresholds.backpressured_ratio)


FAMILY = Backpressure(
    name=NAME, label="Backpressure", alertname="FlinkBackpressure", model_name="sentinel-backpressure",
    page_plot="vertex_pressure",
    localised=True, supervised=True, colour="tab:orange",
    decisive_plot=Plot("others_backpressured_max", "upstream backpressured (ratio)"),
    # A hot subtask that cannot keep up, on the same vertex.
    explained_by=("skew",), same_vertex_causes=("skew",),
    # Backpressure cascades from one bottleneck: the vertices around it slow down too and can read
    # like bottlenecks of their own (a busy, partly backpressured neighbour); they join its incident.
    one_per_job=True,
    features=(
        "checkpoint_interval_ms", "persisted_inflight_rel_slope_per_h", "busy_max", "backpressured_max",
        "backpressured_mean", "downstream_of_backpressure", "is_busiest_vertex", "others_backpressured_max",
        "start_delay_max_ms", "alignment_max_ms", "busy_reported", "checkpoint_duration_over_interval",
        "checkpoint_duration_over_timeout"),
    monotone=(
        ("busy_max", 1),
        # the bottleneck itself is busy, not waiting: its own backpressured time says "look downstream"
        ("backpressured_max", -1), ("backpressured_mean", -1),
        ("downstream_of_backpressure", 1), ("is_busiest_vertex", 1), ("others_backpressured_max", 1),
        ("start_delay_max_ms", 1), ("alignment_max_ms", 1), ("start_delay_rel_slope_per_h", 1),
        ("alignment_rel_slope_per_h", 1), ("persisted_inflight_rel_slope_per_h", 1),
        ("checkpoint_duration_over_interval", 1), ("checkpoint_duration_over_timeout", 1)),
    # Another vertex waiting on this one: a busy vertex alone (an operator starting up, PyFlink's
    # Python workers) is not backpressure; nor is a job catching up in its first minute. And an
    # impact: checkpoints a quarter of their interval long (barriers held back), or the wait high
    # (Flink's HIGH, over half the time: unaligned barriers overtake it); a low wait that neither
    # holds barriers back is a job near its capacity (large state snapshotting), not an incident.
    # And a slowdown: a bottleneck taking in more than its usual is working through a surge of
    # load (a burst, a backlog after one), which passes without anything to fix.
    post_rule=(("startup_s", STARTUP_S), ("evidence", (("others_backpressured_max", 0.1),)),
               ("impact", (("checkpoint_duration_over_interval", 0.25), ("others_backpressured_max", 0.5))),
               ("refused_by", (("records_in_over_usual", SURGE_OVER_USUAL),))),
    recent_column="busy_max",
    runbook=(
        "Scale out the bottleneck vertex named in the evidence (more parallelism or resources), or "
        "speed up its external calls (async I/O).",
        "Enable buffer debloating (taskmanager.network.memory.buffer-debloat.enabled: true) to cut in-flight data.",
        "Enable unaligned checkpoints (execution.checkpointing.unaligned.enabled: true) so barriers overtake buffers.",
        "Set execution.checkpointing.aligned-checkpoint-timeout to switch to unaligned only when alignment drags.",
        "Lengthen the checkpoint interval while the backlog drains so checkpoints stop piling up.",
    ),
)
