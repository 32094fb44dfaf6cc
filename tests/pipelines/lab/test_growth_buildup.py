"""Issue 57 and 58's lab scenarios: growth that levels off, leaks that begin late or are fixed
(``end_ts``), build-up until checkpoints fail and its healthy twins, and their grids."""

import json

from pipelines import lab
from pipelines.lab import corpus as grids
from pipelines.lab.scenarios import (SQL, bounded_keys, leak_fixed, leak_late, leak_to_limit, leak_to_timeout,
                                     backpressure_deepening, healthy_large_state, sql_cep_leak, ttl_horizon)
from tests.conftest import PROJECT_ROOT


def _checkpoint(job_id: str, ts: int, status: str = "COMPLETED", message: str | None = None) -> dict:
    return {"schema_version": 1, "kind": "checkpoint", "cluster": "lab", "job_id": job_id, "job_name": "j", "ts": ts,
            "checkpoint_id": ts, "status": status, "failure_message": message}


def _vertex(job_id: str, ts: int, name: str = "keyed-state") -> dict:
    return {"schema_version": 1, "kind": "vertex_metrics", "cluster": "lab", "job_id": job_id, "job_name": "j",
            "ts": ts, "vertex_id": "v" * 32, "vertex_name": name, "parallelism": 1,
            "subtasks": [{"index": 0, "records_in_per_s": 100.0}]}


def test_a_fixed_leak_ends_where_the_job_stops_storing_new_keys():
    variant = leak_fixed(300)
    assert variant.at_args == (("reject-new-keys-onset-ms", 300.0),) and variant.duration_s == 300 + 900
    session = lab.LabSession(config=None, dataset=None)
    argv = session._argv(variant, submitted_at=1_000_000)
    fix_ms = int(argv[argv.index("--reject-new-keys-onset-ms") + 1])
    assert fix_ms == 1_000_000 + lab.STARTUP_MARGIN_MS + 300_000
    job_id = "f" * 32
    events = [_vertex(job_id, ts) for ts in (1_010_000, 1_400_000)]
    truth = lab.ground_truth(variant, job_id, "j", events, onset_ms=1_000_000, submitted_at=1_000_000)
    (fault,) = truth["faults"]
    # The leak is there from the start and ends at the fix: the same epoch the job was given.
    assert (fault["family"], fault["vertex_name"], fault["onset_ts"], fault["end_ts"]) == (
        "state_leak", "keyed-state", 1_010_000, fix_ms)
    # A fault without an end carries no end_ts (it lasts to the end of the run).
    plain = lab.ground_truth(leak_late(), job_id, "j", events, onset_ms=1_000_000, submitted_at=1_000_000)
    assert "end_ts" not in plain["faults"][0]


def test_bounded_keys_fill_for_three_time_constants_and_then_plateau():
    variant = bounded_keys(6000, 150)
    assert variant.job_args["key-space"] == 6000 and variant.job_args["ttl-s"] == 0 and variant.faults == ()
    assert variant.duration_s == 540  # 3 x 40 s and 7 minutes of plateau
    assert bounded_keys(45000, 150).duration_s >= 3 * 300 + 360


def test_a_ttl_warm_up_declares_the_horizon_it_is_given():
    before, at, after = ttl_horizon(240, 60), ttl_horizon(360, 30), ttl_horizon(480, 0)
    assert (before.warmup_horizon_s, at.warmup_horizon_s, after.warmup_horizon_s) == (300.0, 390.0, 480.0)
    assert before.scenario == "ttl_horizon" and before.job_args["ttl-s"] == 240 and before.faults == ()
    truth = lab.ground_truth(after, "a" * 32, "j", [_vertex("a" * 32, 1000)], 0, 0)
    assert truth["warmup_horizon_s"] == 480.0 and truth["family"] == "healthy"


def test_a_late_leak_begins_at_its_onset_after_ttl_bounded_state():
    variant = leak_late(60, 2400)
    assert variant.onset_s == 2400 and variant.duration_s == 2400 + 480 and variant.length == "long"
    assert variant.job_args["ttl-s"] == 60 and variant.onset_args == ("leak-onset-ms",)


def test_a_build_up_is_unsound_without_failed_checkpoints_and_a_healthy_twin_with_them():
    job_id = "b" * 32
    completed = [_checkpoint(job_id, ts) for ts in (10, 20, 30)]
    failing = completed + [_checkpoint(job_id, 40, "FAILED", "Checkpoint expired before completing.")]
    stopped = completed + [_checkpoint(job_id, 40, "FAILED", "Checkpoint Coordinator is suspending.")]
    for build_up in (leak_to_timeout(), leak_to_limit(), backpressure_deepening()):
        assert build_up.expect_failures is True
        assert lab.unsound(build_up, completed) == "no checkpoint failed: the build-up did not reach its failure"
        assert lab.unsound(build_up, stopped) is not None  # a failure the stop caused is not the build-up's
        assert lab.unsound(build_up, failing) is None
    twin = healthy_large_state()
    assert lab.unsound(twin, completed) is None and lab.unsound(twin, stopped) is None
    assert "must stay under its timeout" in lab.unsound(twin, failing)
    # Scenarios that expect nothing either way are not checked.
    assert lab.unsound(bounded_keys(), failing) is None


def test_a_leak_to_timeout_is_labelled_a_leak_from_the_start_and_a_failure_at_the_first_expiry():
    variant = leak_to_timeout(300, 4000, 4000, interval_ms=10000)
    args = variant.job_args
    assert (args["state-backend"], args["checkpoint-timeout-ms"], args["checkpoint-min-pause-ms"]) == ("hashmap", 4000, 10000)
    job_id = "c" * 32
    events = [_vertex(job_id, 1000), _checkpoint(job_id, 60_000),
              _checkpoint(job_id, 300_000, "FAILED", "Checkpoint expired before completing."),
              _checkpoint(job_id, 310_000, "FAILED", "Checkpoint expired before completing.")]
    truth = lab.ground_truth(variant, job_id, "j", events, onset_ms=0, submitted_at=0)
    assert [(f["family"], f["onset_ts"]) for f in truth["faults"]] == [("state_leak", 1000), ("checkpoint_failure", 300_000)]


def test_the_new_grids_keep_three_runs_a_scenario_across_the_splits_and_leave_the_corpus_alone():
    manifest = json.loads((PROJECT_ROOT / "data" / "lab" / "manifest.json").read_text())
    recorded = {run_id: run["split"] for run_id, run in manifest["runs"].items()}
    runs = grids.growth() + grids.buildup() + grids.hour() + grids.fixed()
    assert len({v.run_id for v in runs}) == len(runs)
    older = [v for grid in (grids.corpus, grids.long_runs, grids.sql) for version in grids.LAB_VERSIONS
             for v in grid(version=version)]
    assert not {v.run_id for v in runs} & {v.run_id for v in older}  # only added, no run id reused
    # Every recorded run is in the split its grid gives it: the grids that were there before are
    # unchanged, and the new ones were recorded with the splits they have.
    for v in older + runs:
        if v.run_id in recorded:
            assert recorded[v.run_id] == v.split, v.run_id
    short = [v for v in grids.growth() + grids.buildup() if v.length == "short" and v.kind != SQL]
    # leak_late's 40-minute onset makes a long run (a stratum of its own): its two short runs go to test and train.
    assert sorted(v.split for v in short if v.scenario == "leak_late") == ["test", "train"]
    for scenario in {v.scenario for v in short} - {"leak_late"}:
        assert sorted({v.split for v in short if v.scenario == scenario}) == ["test", "train", "validation"], scenario
    assert all(v.split == "test" and v.duration_s >= 3600 for v in grids.hour())
    assert {v.family for v in grids.hour()} == {"healthy", "state_leak"}
    # The fixed leaks' fixes come well after a leak is found (the horizon and a minute, plus the
    # job's start on a loaded machine), one in each split.
    assert sorted(v.split for v in grids.fixed()) == ["test", "train", "validation"]
    assert all(v.faults[0].end_s >= 480 and v.duration_s > v.faults[0].end_s + 600 for v in grids.fixed())
    assert grids.GRIDS["growth+buildup"]()[0].duration_s == max(v.duration_s for v in runs if v in grids.growth()
                                                                 or v in grids.buildup())


def test_a_sql_cep_leak_is_found_on_the_match_vertex():
    job_id = "e" * 32
    events = [_vertex(job_id, 1000, "Source: records[1] -> Calc[2]"), _vertex(job_id, 1000, "Match[4] -> results[5]: Writer")]
    events[1]["vertex_id"] = "m" * 32
    truth = lab.ground_truth(sql_cep_leak(), job_id, "j", events, 0, 0)
    assert truth["faults"][0]["vertex_name"] == "Match[4] -> results[5]: Writer"


def test_a_fixed_leak_whose_fix_came_before_the_job_ran_is_unsound():
    # A submission that took minutes on a loaded machine: the fix's epoch passed before the first record.
    job_id = "g" * 32
    variant = leak_fixed(180)
    late = [_checkpoint(job_id, ts) for ts in (400_000, 403_000, 406_000)]
    assert "ended before" in lab.unsound(variant, late, submitted_at=0)
    early = [_checkpoint(job_id, ts) for ts in (20_000, 23_000, 26_000)]
    assert lab.unsound(variant, early, submitted_at=0) is None
