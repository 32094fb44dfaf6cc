"""The lab's grids across Flink versions, job kinds and lengths: their splits, their run ids, the
ground truth of SQL vertices Flink names, and a virtualenv and cluster folder per version."""

import json

import pytest

from infra.flink_cluster import cluster_root
from pipelines import lab
from pipelines.config import load_config
from pipelines.lab import corpus as grids
from pipelines.lab.scenarios import SQL, sql_skew, sql_slow_udf
from tests.conftest import PROJECT_ROOT


def test_the_original_corpus_keeps_the_splits_it_was_recorded_with():
    manifest = json.loads((PROJECT_ROOT / "data" / "lab" / "manifest.json").read_text())
    scenarios = {v.scenario for v in grids.corpus()}  # the first grid's (later grids add scenarios of their own)
    original = {run_id: run["split"] for run_id, run in manifest["runs"].items()
                if run.get("flink_version") == "2.3.0" and run.get("job_kind", "datastream") == "datastream"
                and run.get("length", "short") == "short" and run["scenario"] in scenarios}
    assert len(original) >= 77
    assert {v.run_id: v.split for v in grids.corpus() if v.run_id in original} == original


def test_a_grid_on_another_version_names_the_version_and_is_split_within_its_own_strata():
    on_120 = grids.corpus(version="1.20.5")
    assert len(on_120) == len(grids.corpus())
    assert all(v.run_id.endswith("-v1.20.5") and v.flink_version == "1.20.5" for v in on_120)
    for scenario in {v.scenario for v in on_120}:
        splits = {v.split for v in on_120 if v.scenario == scenario}
        assert splits == {"train", "validation", "test"}, scenario


def test_every_long_run_is_tested_and_runs_half_an_hour_or_more():
    for version in grids.LAB_VERSIONS:
        runs = grids.long_runs(version=version)
        assert {v.family for v in runs} == {"state_leak", "healthy", "backpressure", "skew"}
        assert all(v.split == "test" and v.length == "long" and v.duration_s >= 1800 for v in runs)
    drift = next(v for v in grids.long_runs() if v.scenario == "skew")
    assert drift.job_args["hot-ramp-s"] == 600 and drift.onset_args == ("hot-onset-ms",)
    warmup = next(v for v in grids.long_runs() if v.family == "healthy")
    assert 600 <= warmup.job_args["ttl-s"] <= 1200 and warmup.faults == ()


def test_a_sql_scenario_is_tested_on_one_version_and_trained_on_another():
    runs = [v for version in grids.LAB_VERSIONS for v in grids.sql(version=version)]
    assert all(v.kind == SQL and v.script == "sql_job.py" for v in runs)
    assert {v.job_args["query"] for v in runs} == {"window", "join", "dedup", "skew", "slow_udf"}
    for scenario in {v.scenario for v in runs}:
        group = [v for v in runs if v.scenario == scenario]
        assert sorted(v.split for v in group) == ["test", "train", "train", "validation"], scenario
    tested_versions = {v.flink_version for v in runs if v.split == "test"}
    assert tested_versions == set(grids.LAB_VERSIONS)


def _vertex(job_id: str, vertex_id: str, name: str, ts: int, rates: list[float], backpressured: float = 0.0) -> dict:
    return {"schema_version": 1, "kind": "vertex_metrics", "cluster": "lab", "job_id": job_id, "job_name": "j",
            "ts": ts, "vertex_id": vertex_id, "vertex_name": name, "parallelism": len(rates),
            "subtasks": [{"index": i, "records_in_per_s": r, "backpressured_time_ms_per_s": backpressured}
                         for i, r in enumerate(rates)]}


def test_a_sql_fault_is_labelled_on_the_vertex_whose_generated_name_matches():
    job_id = "d" * 32
    source, aggregate = "Source: records[1] -> Calc[2]", "GroupAggregate[4] -> Sink: results[5]"
    events = [_vertex(job_id, "s" * 32, source, 5000, [300.0]), _vertex(job_id, "g" * 32, aggregate, 5000, [10.0, 290.0])]
    truth = lab.ground_truth(sql_skew(onset_s=3), job_id, "j", events, onset_ms=4000, submitted_at=0)
    fault = truth["faults"][0]
    assert (fault["vertex_id"], fault["vertex_name"], fault["subtask_index"]) == ("g" * 32, aggregate, 1)
    # A pattern that names no vertex (or several) labels the fault without one, never a guess.
    renamed = [dict(e, vertex_name=e["vertex_name"].replace("GroupAggregate", "Calc")) for e in events]
    fault = lab.ground_truth(sql_skew(onset_s=3), job_id, "j", renamed, 4000, 0)["faults"][0]
    assert (fault["vertex_id"], fault["vertex_name"]) == (None, None)


def test_sql_backpressure_is_labelled_on_the_python_function_where_the_source_first_waits():
    job_id = "e" * 32
    udf = "Calc[2] -> PythonCalc[3] -> Sink: results[4]"
    events = [_vertex(job_id, "s" * 32, "Source: records[1]", 5000, [200.0], backpressured=20.0),
              _vertex(job_id, "p" * 32, udf, 5000, [100.0, 100.0]),
              _vertex(job_id, "s" * 32, "Source: records[1]", 9000, [60.0], backpressured=800.0)]
    truth = lab.ground_truth(sql_slow_udf(onset_s=3), job_id, "j", events, onset_ms=4000, submitted_at=0)
    assert [(f["family"], f["vertex_name"], f["onset_ts"]) for f in truth["faults"]] == [("backpressure", udf, 9000)]


def test_each_flink_version_has_its_own_virtualenv_and_cluster_folder(tmp_path):
    default = load_config(environ={}, base_dir=tmp_path)
    assert default.lab.flink_venv == tmp_path / ".venv-flink"
    assert cluster_root(default) == default.state_dir / "flink"
    lts = load_config(environ={"SENTINEL_LAB__FLINK_VERSION": "1.20.5"}, base_dir=tmp_path)
    assert lts.lab.flink_venv == tmp_path / ".venv-flink-1.20.5"
    assert cluster_root(lts) == lts.state_dir / "flink-1.20.5"
    chosen = load_config(environ={"SENTINEL_LAB__FLINK_VERSION": "1.20.5",
                                                          "SENTINEL_LAB__FLINK_VENV": "/opt/pyflink"}, base_dir=tmp_path)
    assert str(chosen.lab.flink_venv) == "/opt/pyflink"


def test_a_session_refuses_runs_meant_for_another_flink_version(tmp_path):
    config = load_config(environ={}, base_dir=tmp_path)
    variant = grids.sql(version="1.20.5")[0]
    session = lab.LabSession(config, tmp_path, progress=lambda _: None)
    with pytest.raises(lab.LabError, match="another Flink version"):
        session.run([variant])


def _record(dataset, variant, job_id: str, ts: int, info_extra: dict | None = None) -> None:
    events = [_vertex(job_id, "v" * 32, "keyed-state", t, [1.0]) for t in (ts, ts + 1000)]
    truth = lab.ground_truth(variant, job_id, "j", events, 0, 0)
    info = {"run_id": variant.run_id, "split": variant.split, "job_id": job_id, "duration_s": variant.duration_s,
            "job_kind": variant.kind, "length": variant.length, "flink_version": variant.flink_version,
            **(info_extra or {})}
    lab.record_run(dataset, variant.split, events, truth, info)


def test_recorded_runs_merge_into_the_corpus_in_their_splits_and_a_rerecorded_run_replaces_its_old_recording(tmp_path):
    from pipelines.datasets import read_jsonl

    corpus_dir, recorded = tmp_path / "corpus", tmp_path / "recorded"
    old = grids.corpus()[0]
    _record(corpus_dir, old, "a" * 32, 1000)
    sql_runs = [v for v in grids.sql(version="1.20.5") if v.split in ("test", "train")][:2]
    for i, variant in enumerate(sql_runs):
        _record(recorded, variant, f"{i}" * 32, 5000 + i)
    _record(recorded, old, "f" * 32, 9000)  # the old run recorded again, as another job

    assert lab.merge_runs(recorded, corpus_dir) == sorted([old.run_id] + [v.run_id for v in sql_runs])
    manifest = json.loads((corpus_dir / "manifest.json").read_text())
    assert {r: (m["split"], m["job_kind"], m["flink_version"]) for r, m in manifest["runs"].items()} == {
        old.run_id: (old.split, "datastream", "2.3.0"),
        **{v.run_id: (v.split, "sql", "1.20.5") for v in sql_runs}}
    jobs = {split: {e["job_id"] for e in read_jsonl(corpus_dir / split / "events.jsonl.gz")}
            for split in {old.split, *(v.split for v in sql_runs)}}
    assert "a" * 32 not in set().union(*jobs.values()) and "f" * 32 in jobs[old.split]
    truths = [t for split in jobs for t in read_jsonl(corpus_dir / split / "ground_truth.jsonl")]
    assert sorted(t["job_id"] for t in truths) == sorted(["f" * 32] + [f"{i}" * 32 for i in range(2)])


def test_runs_recorded_before_kinds_and_lengths_were_told_apart_are_described_as_datastream_by_their_duration(tmp_path):
    variant = grids.corpus()[0]
    _record(tmp_path, variant.with_(run_id="old-short"), "a" * 32, 1000, {"job_kind": None, "length": None})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    for entry in manifest["runs"].values():
        del entry["job_kind"], entry["length"]
    manifest["runs"]["old-long"] = dict(manifest["runs"]["old-short"], run_id="old-long", duration_s=2400)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    _record(tmp_path, grids.sql()[0], "b" * 32, 2000)
    runs = json.loads((tmp_path / "manifest.json").read_text())["runs"]
    assert (runs["old-short"]["job_kind"], runs["old-short"]["length"]) == ("datastream", "short")
    assert (runs["old-long"]["job_kind"], runs["old-long"]["length"]) == ("datastream", "long")
    assert (runs[grids.sql()[0].run_id]["job_kind"], runs[grids.sql()[0].run_id]["length"]) == ("sql", "short")


@pytest.mark.slow
def test_a_real_flink_120_sql_join_leaks_in_the_vertex_flink_named(tmp_path):
    """Real Flink 1.20 (its own virtualenv and cluster folder, created on first use), a SQL join
    without TTL: the ground truth names the join's vertex as Flink's planner named it."""
    from infra.embedded_stack import free_port, port_in_use

    config = load_config(environ={"SENTINEL_STATE_DIR": str(tmp_path / "state")}, base_dir=tmp_path)
    config.lab.flink_version = "1.20.5"
    config.lab.flink_venv = PROJECT_ROOT / ".venv-flink-1.20.5"
    config.lab.rest_port, config.lab.rpc_port = free_port(), free_port()
    config.lab.taskmanager_memory = "2048m"
    config.lab.datasets_dir = tmp_path / "lab"
    lines: list[str] = []

    run = lab.run_lab(config, "sql_join_leak", duration="50s", dataset=tmp_path / "dataset", interval_s=3.0,
                      publish_to_kafka=False, progress=lines.append)

    assert run.variant.run_id == "sql_join_leak-v1.20.5" and run.variant.kind == SQL
    names = {e["vertex_name"] for e in run.events if e["kind"] == "vertex_metrics"}
    join = [name for name in names if name.startswith("Join[")]
    assert len(join) == 1 and " -> " in join[0] and any(name.startswith("Source: orders[") for name in names), names
    fault = run.truth["faults"][0]
    assert (fault["family"], fault["vertex_name"]) == ("state_leak", join[0])
    sizes = [e["state_size_bytes"] for e in run.events if e["kind"] == "checkpoint" and e["status"] == "COMPLETED"]
    assert len(sizes) >= 5 and sizes[-1] > 2 * sizes[0] > 0, lines
    manifest = json.loads((tmp_path / "dataset" / "manifest.json").read_text())
    entry = manifest["runs"][run.variant.run_id]
    assert (entry["flink_version"], entry["job_kind"], entry["length"]) == ("1.20.5", "sql", "short")
    assert cluster_root(config) == config.state_dir / "flink-1.20.5"
    assert not port_in_use("127.0.0.1", config.lab.rest_port)


def test_the_cli_lists_several_grids_for_a_version_and_merges_a_recorded_folder(tmp_path):
    from tests.helpers.cli import run_sentinel

    env = {"SENTINEL_STATE_DIR": str(tmp_path / "state")}
    listed = run_sentinel("lab", "--grid", "long,sql", "--flink-version", "1.20.5", "--list", "--dataset",
                          str(tmp_path / "none"), "--only", "*-d38m-*,sql_skew*", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert len(rows) == 6 and all(row[0].endswith("-v1.20.5") for row in rows)
    assert sorted(row[2] for row in rows) == ["datastream"] * 4 + ["sql"] * 2
    unknown = run_sentinel("lab", "--grid", "long,oops", "--list", env=env)
    assert unknown.returncode != 0 and "unknown grid 'oops'" in unknown.stderr

    variant = grids.sql(version="1.20.5")[0]
    _record(tmp_path / "recorded", variant, "c" * 32, 1000)
    merged = run_sentinel("lab", "--merge-from", str(tmp_path / "recorded"), "--dataset", str(tmp_path / "corpus"), env=env)
    assert merged.returncode == 0 and "added 1 runs" in merged.stdout, merged.stderr
    assert lab.recorded_runs(tmp_path / "corpus") == {variant.run_id}


def test_a_restart_after_the_lab_asked_the_job_to_stop_does_not_make_the_run_unsound():
    # Flink 1.20 restarts a job whose stop-with-savepoint failed (its checkpoints were timing out):
    # that is the lab ending the run, not the scenario misbehaving.
    job_id = "f" * 32
    checkpoints = [_checkpoint_event(job_id, ts) for ts in (10, 20, 30)]
    statuses = [{"kind": "job_status", "job_id": job_id, "ts": ts, "num_restarts": r} for ts, r in ((25, 0), (45, 1))]
    timeout = grids.corpus()[0].with_(run_id="t", faults=())
    assert lab.unsound(timeout, checkpoints + statuses, cancelled_at=40) is None
    assert lab.unsound(timeout, checkpoints + statuses, cancelled_at=50) == "1 restarts the scenario does not cause"
    assert lab.unsound(timeout, checkpoints + statuses) == "1 restarts the scenario does not cause"


def _checkpoint_event(job_id: str, ts: int) -> dict:
    return {"kind": "checkpoint", "job_id": job_id, "ts": ts, "status": "COMPLETED"}
