"""How fast this machine runs Python right now: the same small workload, timed.

The benchmarks' numbers move with the machine's speed. On this project's shared 2-core machines,
runs of the same code an hour apart have differed by more than the change under test
(BENCHMARKS.md, the detection job's history, 2026-11-26, 422f8fd). A benchmark prints
:func:`calibration_line` beside its results, at its start and its end, so that two runs can be told
apart by the machine as well as by the code. The workload is what the detection's Python spends
its time on: small dictionaries built and read, float arithmetic, short lists.
"""

from __future__ import annotations

import time


def _workload() -> float:
    total = 0.0
    for i in range(300_000):
        row = {"ts": i, "value": i * 0.5, "name": "vertex", "values": [i, i + 1.0, None]}
        known = [v for v in row["values"] if v is not None]
        total += sum(known) / len(known) + row["value"] / (i + 1)
    return total


def python_speed(repeat: int = 5) -> float:
    """Seconds for the workload, the best of ``repeat`` runs (lower is faster)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        _workload()
        best = min(best, time.perf_counter() - started)
    return best


def calibration_line(when: str, repeat: int = 5) -> str:
    return (f"calibration ({when}): {python_speed(repeat):.3f} s for the fixed Python workload "
            f"(best of {repeat}; lower is faster)")
