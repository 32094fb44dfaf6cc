"""Small, valid example events of the input contract, for self-checks and contract tests.

These are not a model of a Flink job (the simulator is); they exercise every field of every kind
with plausible values, including the nulls the contract allows.
"""

from __future__ import annotations

import random
from typing import Iterator

from pipelines.contracts import SCHEMA_VERSION

_VERTICES = [("cbc357ccb763df2852fee8c4fc7d55f2", "Source: Kafka"), ("90bea66de1c231edf33913ecd54406c1", "Window(Tumbling 1 min)")]


def example_events(n: int, seed: int = 0, cluster: str = "example", start_ts: int = 1_700_000_000_000) -> Iterator[dict]:
    """``n`` events cycling through the three kinds, one job, 10 s apart."""
    rng = random.Random(seed)
    job_id = f"{rng.getrandbits(128):032x}"
    for i in range(n):
        ts = start_ts + i * 10_000
        common = {"schema_version": SCHEMA_VERSION, "cluster": cluster, "job_id": job_id,
                  "job_name": "example-job", "ts": ts, "source": "example"}
        kind = ("checkpoint", "vertex_metrics", "job_status")[i % 3]
        if kind == "checkpoint":
            size = 1_000_000 + 50_000 * i
            failed = rng.random() < 0.1
            yield {**common, "kind": kind, "checkpoint_id": i // 3 + 1,
                   "status": "FAILED" if failed else "COMPLETED", "is_savepoint": False,
                   "trigger_ts": ts - 800, "state_size_bytes": size, "checkpointed_size_bytes": size // 4,
                   "end_to_end_duration_ms": 800, "alignment_buffered_bytes": 0, "processed_data_bytes": 4096,
                   "persisted_data_bytes": 0, "num_subtasks": 4, "num_acknowledged_subtasks": 2 if failed else 4,
                   "failure_message": "Checkpoint expired before completing." if failed else None,
                   "vertices": [{"vertex_id": vid, "vertex_name": name, "parallelism": 2,
                                 "state_size_bytes": size // 2, "checkpointed_size_bytes": size // 8,
                                 "subtasks": [{"index": k, "state_size_bytes": size // 4,
                                               "checkpointed_size_bytes": size // 16,
                                               "end_to_end_duration_ms": 700 + 10 * k,
                                               "alignment_duration_ms": rng.randint(0, 50),
                                               "start_delay_ms": rng.randint(0, 100), "sync_duration_ms": 3,
                                               "async_duration_ms": 120, "unaligned": False, "aborted": False}
                                              for k in range(2)]}
                                for vid, name in _VERTICES]}
        elif kind == "vertex_metrics":
            vid, name = _VERTICES[i % 2]
            yield {**common, "kind": kind, "vertex_id": vid, "vertex_name": name, "parallelism": 2,
                   "subtasks": [{"index": k,
                                 "busy_time_ms_per_s": None if name.startswith("Source") else rng.uniform(100, 400),
                                 "backpressured_time_ms_per_s": rng.uniform(0, 50),
                                 "idle_time_ms_per_s": rng.uniform(500, 900),
                                 "records_in_per_s": rng.uniform(900, 1100), "records_out_per_s": rng.uniform(900, 1100),
                                 "in_pool_usage": rng.uniform(0, 0.2), "out_pool_usage": rng.uniform(0, 0.2),
                                 "checkpoint_start_delay_ms": rng.uniform(0, 100),
                                 "checkpoint_alignment_time_ms": rng.uniform(0, 30)} for k in range(2)]}
        else:
            yield {**common, "kind": kind, "state": "RUNNING", "num_restarts": 0,
                   "checkpoints_completed_total": i // 3, "checkpoints_failed_total": 0,
                   "checkpoints_in_progress": i % 2, "checkpoint_interval_ms": 10_000,
                   "checkpoint_timeout_ms": 600_000, "max_state_size_bytes": None,
                   "jm_heap_used_bytes": 300_000_000, "jm_heap_max_bytes": 1_000_000_000}
