"""Detection on real Flink: the committed lab test split, replayed as a user would.

The champions come from the session's training on the simulated dataset and the real-Flink
corpus's train and validation splits (`sentinel train`'s default); the test split's runs are
parameter combinations training never saw. Every run goes through ``sentinel evaluate``'s path:
validation, features, the champions, their post-rules and the incident policy, judged run by run.
"""

from __future__ import annotations

import pytest

from pipelines.datasets import read_jsonl
from pipelines.detection.backtest import evaluate_dataset, write_report
from pipelines.detection.scoring import ChampionCache
from pipelines.families import BACKPRESSURE, CHECKPOINT_FAILURE, SKEW, STATE_LEAK
from tests.conftest import LAB_CORPUS

# The acceptance bounds of the issue, in seconds after the labelled onset.
DELAY_BOUND_S = {BACKPRESSURE: 60.0, SKEW: 60.0}
LEAK_GRACE_S = 60.0


@pytest.fixture(scope="module")
def evaluation(spark, trained_store):
    models = ChampionCache(trained_store).require()
    return evaluate_dataset(spark, trained_store, LAB_CORPUS, "test", models)


def first_failure_ts(job_id: str, onset_ts: int) -> int | None:
    """The first sign of a failing checkpoint from the onset on: a FAILED checkpoint, or Flink's
    failed-checkpoint counter going up (restarts and refused triggers never reach the history)."""
    events = [e for e in read_jsonl(LAB_CORPUS / "test" / "events.jsonl.gz") if e["job_id"] == job_id]
    failed = [e["ts"] for e in events if e["kind"] == "checkpoint" and e["status"] == "FAILED" and e["ts"] >= onset_ts]
    counts = [(e["ts"], e["checkpoints_failed_total"]) for e in events if e["kind"] == "job_status"]
    before = max((c for ts, c in counts if ts < onset_ts), default=0)
    counted = [ts for ts, c in counts if ts >= onset_ts and c > before]
    return min(failed + counted, default=None)


def test_the_test_split_is_real_flink_runs_never_trained_on(evaluation):
    runs = evaluation.comparison.runs
    assert len(runs) >= 15 and sum(r.healthy for r in runs) >= 5
    assert {f for r in runs for f in r.expected} == {STATE_LEAK, BACKPRESSURE, SKEW, CHECKPOINT_FAILURE}
    trained = {t["run_id"] for split in ("train", "validation") for t in read_jsonl(LAB_CORPUS / split / "ground_truth.jsonl")}
    assert not trained & {r.run for r in runs}


def test_every_fault_of_every_faulty_run_is_found_on_the_right_vertex(evaluation):
    missed = [(r.run, m["family"]) for r in evaluation.comparison.runs for m in r.missed]
    assert missed == []
    elsewhere = [(r.run, f["family"]) for r in evaluation.comparison.runs for f in r.found if not f["localised"]]
    assert elsewhere == []


def test_no_incident_on_a_healthy_run_and_no_false_family_on_a_faulty_one(evaluation):
    false = [(r.run, i["family"], i.get("vertex_name")) for r in evaluation.comparison.runs for i in r.false]
    assert false == []
    assert [(r.run, r.false_families) for r in evaluation.comparison.runs if r.false_families] == []


def test_faults_are_found_within_the_issue_s_bounds(evaluation, trained_store):
    horizon = trained_store.detection.warmup_horizon_s
    truths = {t["job_id"]: t for t in evaluation.truths}
    late = []
    for run in evaluation.comparison.runs:
        faults = {f["family"]: f for f in truths[run.job_id]["faults"]}
        for found in run.found:
            family, delay = found["family"], found["delay_s"]
            if family == STATE_LEAK:
                bound = horizon + LEAK_GRACE_S
            elif family == CHECKPOINT_FAILURE:
                first = first_failure_ts(run.job_id, faults[family]["onset_ts"])
                bound = (first - faults[family]["onset_ts"]) / 1000.0 if first is not None else 0.0
            else:
                bound = DELAY_BOUND_S[family]
            if delay > bound:
                late.append((run.run, family, delay, bound))
    assert late == []


def test_sentinel_evaluate_writes_a_report_with_a_plot_per_run(evaluation, tmp_path):
    index = write_report(evaluation, tmp_path / "report", "lab test split")
    text = index.read_text()
    assert "| family" not in text and "static: found" in text  # the per-family table, next to the baseline
    for run in evaluation.comparison.runs:
        assert f"### {run.run}" in text
        plot = tmp_path / "report" / "plots" / f"{run.run}.png"
        assert plot.stat().st_size > 5_000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "report" / "results.json").is_file()
