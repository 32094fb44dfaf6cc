"""`sentinel replay` and `sentinel evaluate` as a user runs them, against the test run's champions
(tests/champions.py)."""

from __future__ import annotations

from tests.helpers.cli import run_sentinel


def test_replay_backtests_the_champions_on_a_recording(trained_store, tmp_path):
    from pipelines import simulator

    recording = tmp_path / "seed000.jsonl"
    job = simulator.simulate_job("leak_seed000", seed=3)
    simulator.write_jsonl(recording, job.events)
    truth = tmp_path / "truth.jsonl"
    simulator.write_jsonl(truth, [job.truth])
    with recording.open("a") as out:
        out.write("{not json\n")
    result = run_sentinel("replay", str(recording), "--out", str(tmp_path / "incidents.jsonl"), "--truth", str(truth),
                          env={"SENTINEL_STATE_DIR": str(tmp_path / "state"),
                               "SENTINEL_MLFLOW__TRACKING_URI": trained_store.mlflow.tracking_uri,
                               "SENTINEL_MLFLOW__REGISTRY_URI": trained_store.mlflow.registry_uri}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "injected faults: 1   detected: 1   missed: 0" in result.stdout
    assert "1 unusable lines" in result.stdout
    letters = (tmp_path / "incidents.dead_letters.jsonl").read_text().splitlines()
    assert len(letters) == 1 and '"malformed_json"' in letters[0]
    assert (tmp_path / "incidents.jsonl").read_text().count('"state_leak"') >= 1


def test_evaluate_judges_chosen_lab_runs_next_to_the_static_alarms(trained_store, tmp_path):
    runs = ["healthy_ttl-ttl150-hashmap-p1-r100-i3000", "leak_start-hashmap-filesystem-p1-r250-b100-i1000"]
    result = run_sentinel("evaluate", "--run", runs[0], "--run", runs[1], "--report", str(tmp_path / "report"),
                          env={"SENTINEL_STATE_DIR": str(tmp_path / "state"),
                               "SENTINEL_MLFLOW__TRACKING_URI": trained_store.mlflow.tracking_uri,
                               "SENTINEL_MLFLOW__REGISTRY_URI": trained_store.mlflow.registry_uri}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    table = [line for line in result.stdout.splitlines() if line.startswith(tuple(runs))]
    assert len(table) == 2 and "healthy" in table[0] and "state_leak" in table[1]
    assert "static: found" in result.stdout and "healthy runs: 1;" in result.stdout
    assert (tmp_path / "report" / "index.md").is_file()
    assert sorted(p.name for p in (tmp_path / "report" / "plots").iterdir()) == sorted(f"{r}.png" for r in runs)
