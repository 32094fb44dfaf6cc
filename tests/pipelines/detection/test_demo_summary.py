"""The demo's summary: a fault caught before its labelled onset is one early catch, not a miss and
a false incident; every other incident and fault is counted as the comparison counts it."""

from __future__ import annotations

from pipelines.detection.demo import DemoSummary
from pipelines.incidents.comparison import compare

ONSET = 1_800_000_000_000


def _truth(job: str, faults: list[dict]) -> dict:
    return {"cluster": "sim", "job_id": job, "job_name": job, "scenario": "x", "faults": faults}


def _opened(job: str, family: str, at_ms: int, vertex: str | None, n: int) -> dict:
    return {"event": "opened", "incident_id": f"i{n}", "cluster": "sim", "job_id": job, "job_name": job,
            "family": family, "vertex_id": vertex, "vertex_name": vertex and f"name-{vertex}", "opened_at": at_ms,
            "summary": f"[warning] {family} on {job}", "symptoms": []}


def test_an_incident_before_the_labelled_onset_is_early_not_missed_and_false():
    leak = {"family": "state_leak", "onset_ts": ONSET, "vertex_id": "v2", "vertex_name": "name-v2"}
    skew = {"family": "skew", "onset_ts": ONSET, "vertex_id": "v1", "vertex_name": "name-v1"}
    truths = [_truth("rocksdb-joins-011", [leak]), _truth("skewed", [skew]), _truth("healthy", []),
              _truth("elsewhere", [dict(leak)])]
    incidents = [_opened("rocksdb-joins-011", "state_leak", ONSET - 300_000, "v2", 1),  # 5 min early: early
                 _opened("skewed", "skew", ONSET + 20_000, "v1", 2),  # detected 20 s after the onset
                 _opened("healthy", "backpressure", ONSET, "v1", 3),  # false
                 _opened("elsewhere", "state_leak", ONSET - 300_000, "v9", 4)]  # early but another vertex: false
    comparison = compare(truths, incidents)
    assert len(comparison.missed) == 2 and len(comparison.false) == 3  # what the comparison alone says

    summary = DemoSummary.of(comparison, truths)
    assert [(e["job_name"], e["lead_s"]) for e in summary.early] == [("rocksdb-joins-011", 300.0)]
    assert [m["job_name"] for m in summary.missed] == ["elsewhere"]
    assert sorted(f["incident_id"] for f in summary.false) == ["i3", "i4"]
    lines = summary.lines()
    assert lines[0] == "  3 faults injected: 1 detected, 1 early, 1 missed; 2 false incidents; median delay 20s after " \
                       "the labelled onset"
    assert any(line.startswith("  EARLY    state_leak") and "300s before the labelled onset" in line for line in lines)
    assert not any("MISSED" in line and "rocksdb-joins-011" in line for line in lines)
    assert "what the lines mean:" in lines and any(line.startswith("  EARLY     ") for line in lines)


def test_an_incident_that_came_and_went_before_a_detected_fault_is_false_and_the_legend_says_so():
    """A fresh make run's rocksdb-joins-011: a leak incident opened 26 min before the onset and
    cleared before it, another 134 s after it. The fault is detected; the first is a false alarm."""
    leak = {"family": "state_leak", "onset_ts": ONSET, "vertex_id": "v2", "vertex_name": "name-v2"}
    truths = [_truth("rocksdb-joins-011", [leak])]
    incidents = [_opened("rocksdb-joins-011", "state_leak", ONSET - 1_576_000, "v2", 1),
                 _opened("rocksdb-joins-011", "state_leak", ONSET + 134_000, "v2", 2)]
    summary = DemoSummary.of(compare(truths, incidents), truths)
    assert len(summary.detected) == 1 and not summary.early and not summary.missed
    assert [f["incident_id"] for f in summary.false] == ["i1"]
    legend = " ".join(line.strip() for line in summary.lines()[summary.lines().index("what the lines mean:"):])
    assert "of the fault's own family and place that opened more than a minute before its onset" in legend
