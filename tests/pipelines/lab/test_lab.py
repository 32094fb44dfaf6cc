"""The lab: its scenarios, its ground truth and dataset recording, and one real Flink run."""

import json

import pytest

from infra.embedded_stack import free_port, port_in_use
from pipelines import lab
from pipelines.contracts import INPUT
from pipelines.io import kafka_clients
from tests.conftest import PROJECT_ROOT


def _vertex_event(job_id: str, ts: int, rates: list[float]) -> dict:
    return {"schema_version": 1, "kind": "vertex_metrics", "cluster": "lab", "job_id": job_id, "job_name": "lab-skew",
            "ts": ts, "vertex_id": "v" * 32, "vertex_name": "keyed-state", "parallelism": len(rates),
            "subtasks": [{"index": i, "records_in_per_s": r} for i, r in enumerate(rates)]}


def _checkpoint(job_id: str, ts: int, status: str = "COMPLETED", message: str | None = None) -> dict:
    return {"schema_version": 1, "kind": "checkpoint", "cluster": "lab", "job_id": job_id, "job_name": "j", "ts": ts,
            "checkpoint_id": ts, "status": status, "failure_message": message}


def _upstream(job_id: str, ts: int, backpressured: float) -> dict:
    return {"schema_version": 1, "kind": "vertex_metrics", "cluster": "lab", "job_id": job_id, "job_name": "j",
            "ts": ts, "vertex_id": "u" * 32, "vertex_name": "assign-key", "parallelism": 1,
            "subtasks": [{"index": 0, "records_in_per_s": 100.0, "backpressured_time_ms_per_s": backpressured}]}


def test_backpressure_begins_when_another_vertex_first_waits_and_not_before():
    job_id = "b" * 32
    # The slowdown is injected at 500; the buffers absorb it until the upstream waits at 3000.
    events = [_upstream(job_id, 1000, 0.0), _upstream(job_id, 2000, 60.0), _upstream(job_id, 3000, 400.0),
              _upstream(job_id, 4000, 990.0)]
    truth = lab.ground_truth(lab.scenario("backpressure", 240), job_id, "j", events, onset_ms=500, submitted_at=0)
    assert [(f["family"], f["onset_ts"]) for f in truth["faults"]] == [("backpressure", 3000)]
    # A slowdown that never backs up into another vertex is no backpressure at all.
    calm = [_upstream(job_id, 1000, 0.0), _upstream(job_id, 2000, 60.0)]
    assert lab.ground_truth(lab.scenario("backpressure", 240), job_id, "j", calm, onset_ms=500, submitted_at=0)["faults"] == []


def test_skew_truth_names_the_subtask_that_got_the_hot_key_after_the_onset():
    job_id = "a" * 32
    events = [_vertex_event(job_id, 1000, [900.0, 10.0]),  # before the onset: does not count
              _vertex_event(job_id, 5000, [20.0, 280.0]), _vertex_event(job_id, 6000, [None, 290.0])]
    truth = lab.ground_truth(lab.scenario("skew", 240), job_id, "lab-skew", events, onset_ms=4000, submitted_at=0)
    fault = truth["faults"][0]
    assert (truth["family"], fault["family"], fault["onset_ts"]) == ("skew", "skew", 4000)
    assert (fault["vertex_id"], fault["vertex_name"], fault["subtask_index"]) == ("v" * 32, "keyed-state", 1)
    assert (truth["start_ts"], truth["end_ts"], truth["run_id"]) == (1000, 6000, "skew")


def test_checkpoint_failures_are_labelled_where_the_run_really_had_them():
    job_id = "c" * 32
    quiet = [_vertex_event(job_id, 1000, [1.0]), _upstream(job_id, 1000, 500.0), _checkpoint(job_id, 2000)]
    # Backpressure that never failed a checkpoint: its planned symptom is not labelled.
    truth = lab.ground_truth(lab.scenario("backpressure", 240), job_id, "j", quiet, onset_ms=500, submitted_at=0)
    assert truth["families"] == ["backpressure"]
    # One that did: the failure is labelled from the first failed checkpoint after the onset.
    failing = quiet + [_checkpoint(job_id, 400, "FAILED", "Checkpoint expired before completing."),
                       _checkpoint(job_id, 3000, "FAILED", "Checkpoint expired before completing.")]
    truth = lab.ground_truth(lab.scenario("backpressure", 240), job_id, "j", failing, onset_ms=500, submitted_at=0)
    assert truth["families"] == ["backpressure", "checkpoint_failure"]
    assert [f["onset_ts"] for f in truth["faults"] if f["family"] == "checkpoint_failure"] == [3000]
    # A cancellation aborts a checkpoint: that is not the job failing, even in a healthy run.
    cancelled = quiet + [_checkpoint(job_id, 9000, "FAILED", "Checkpoint Coordinator is suspending.")]
    assert lab.ground_truth(lab.scenario("healthy_ttl", 240), job_id, "j", cancelled, 0, 0)["faults"] == []
    # Failures no scenario planned are labelled all the same.
    surprise = lab.ground_truth(lab.scenario("healthy_ttl", 240), job_id, "j", failing, 0, 0)
    assert surprise["families"] == ["checkpoint_failure"] and surprise["faults"][0]["onset_ts"] == 400


def test_named_scenarios_scale_to_the_duration_and_unknown_ones_are_refused():
    warmup = lab.scenario("warmup", 240)
    assert warmup.family == "healthy" and warmup.faults == () and warmup.job_args["ttl-s"] == 120
    backpressure = lab.scenario("backpressure", 400)
    assert backpressure.onset_s == 100 and backpressure.onset_args == ("slow-onset-ms",)
    with pytest.raises(lab.LabError, match="unknown lab scenario"):
        lab.scenario("oom", 240)


def test_the_corpus_splits_by_variant_and_every_split_covers_every_kind():
    from pipelines.lab.corpus import corpus

    variants = corpus()
    assert len(variants) >= 60 and len({v.run_id for v in variants}) == len(variants)
    by_split = {split: [v for v in variants if v.split == split] for split in lab.SPLITS}
    for split in ("validation", "test"):
        scenarios = {v.scenario for v in by_split[split]}
        assert scenarios >= {"healthy_ttl", "leak_start", "leak_after_plateau", "leak_slow_on_ttl", "leak_one_of_two",
                             "backpressure", "skew", "checkpoint_timeout", "restart_loop", "storage_outage"}, split
        assert {v.run_id.split("-")[1] for v in by_split[split] if v.scenario == "backpressure"} >= {"severe"}
        assert {v.run_id.split("-")[3] for v in by_split[split] if v.scenario == "skew"} == {"bp", "nobp"}
    # Every parameter combination is in exactly one split: the test runs are combinations never trained on.
    train_params = [v.job_args for v in by_split["train"]]
    assert not [v for v in by_split["test"] if v.job_args in train_params]
    assert corpus("leak_start-*") and all(v.scenario == "leak_start" for v in corpus("leak_start-*"))


def test_runs_accumulate_in_the_dataset_layout_in_time_order_and_a_grid_skips_what_is_recorded(tmp_path):
    first = [_vertex_event("a" * 32, ts, [1.0]) for ts in (10, 30)]
    second = [_vertex_event("b" * 32, ts, [1.0]) for ts in (20, 40)]
    variant = lab.scenario("healthy_ttl", 240)
    for events, run_id in ((first, "one"), (second, "two")):
        truth = lab.ground_truth(variant, events[0]["job_id"], "j", events, 0, 0)
        lab.record_run(tmp_path, "test", events, truth, {"run_id": run_id})
    lab.record_run(tmp_path, "test", second, lab.ground_truth(variant, "b" * 32, "j", second, 0, 0), {"run_id": "two"})

    from pipelines.datasets import read_jsonl

    lines = list(read_jsonl(tmp_path / "test" / "events.jsonl.gz"))
    assert [e["ts"] for e in lines] == [10, 20, 30, 40]  # recording a job again replaces it
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["splits"]["test"]["jobs"] == 2 and manifest["scenarios"] == ["lab_healthy_ttl"]
    assert lab.recorded_runs(tmp_path) == {"one", "two"}
    from feature_store.offline_store import dataset_files

    assert dataset_files(tmp_path) == ([tmp_path / "test" / "events.jsonl.gz"],
                                       [tmp_path / "test" / "ground_truth.jsonl"])
    # The same events give the same bytes (compressed without a timestamp): re-recording diffs cleanly.
    before = (tmp_path / "test" / "events.jsonl.gz").read_bytes()
    lab.record_run(tmp_path, "test", second, lab.ground_truth(variant, "b" * 32, "j", second, 0, 0), {"run_id": "two"})
    assert (tmp_path / "test" / "events.jsonl.gz").read_bytes() == before
    # A grid with nothing left to record starts no cluster.
    assert lab.run_grid(None, [variant.with_(run_id="one")], tmp_path, progress=lambda _: None) == []


@pytest.mark.slow
def test_a_real_flink_leak_job_reaches_the_input_topic_with_growing_state(config, tmp_path):
    """Real Flink 2.3 (the lab's own virtualenv, created on first use), a real leak job, the
    collector publishing to the real broker."""
    config.state_dir = tmp_path / "state"
    config.lab.flink_venv = PROJECT_ROOT / ".venv-flink"
    config.lab.rest_port, config.lab.rpc_port = free_port(), free_port()
    config.lab.datasets_dir = tmp_path / "lab"
    config.collector.state_dir = tmp_path / "collector"
    lines: list[str] = []

    run = lab.run_lab(config, "leak", duration="45s", dataset=tmp_path / "dataset", interval_s=3.0,
                      progress=lines.append)

    consumer = kafka_clients.make_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    try:
        events = [json.loads(r.value) for r in kafka_clients.read_records(consumer, config.topics.input, timeout_s=30)]
    finally:
        consumer.close()
    mine = [e for e in events if e["job_id"] == run.job_id]
    assert mine and all(INPUT.errors(e) == [] and e["source"] == "lab" for e in mine)
    completed = [e for e in mine if e["kind"] == "checkpoint" and e["status"] == "COMPLETED"]
    sizes = [e["state_size_bytes"] for e in sorted(completed, key=lambda e: e["checkpoint_id"])]
    assert len(sizes) >= 5, lines
    assert sizes == sorted(sizes) and sizes[-1] > 3 * sizes[0] > 0  # a leak: state only grows
    keyed = [v for v in completed[-1]["vertices"] if v["vertex_name"] == "keyed-state"]
    assert keyed and keyed[0]["state_size_bytes"] == completed[-1]["state_size_bytes"]
    statuses = [e for e in mine if e["kind"] == "job_status"]
    # Stopped with a savepoint (its tasks finish; no cancel races a Python worker), the last event a savepoint.
    assert statuses[-1]["state"] == "FINISHED"
    # The JobManager storage's limit: once a poll of the running job has it, every later one does
    # (it is never lost), and the job's last running poll has it. The first polls may lack it: Flink
    # answers them from a cached execution graph that can still be the starting job's sparse one,
    # without the storage, for longer than its refresh interval on a loaded machine.
    running = [e for e in statuses if e["state"] == "RUNNING"]
    limits = [e["max_state_size_bytes"] for e in running]
    first_known = next((i for i, limit in enumerate(limits) if limit is not None), len(limits))
    assert running and limits[first_known:] and all(limit == 5 * 1024 * 1024 for limit in limits[first_known:]), [
        (e["ts"], e["max_state_size_bytes"], e["checkpoint_interval_ms"], e["checkpoints_completed_total"])
        for e in statuses]
    assert any(e.get("is_savepoint") for e in completed)
    assert {e["vertex_name"] for e in mine if e["kind"] == "vertex_metrics"} >= {"keyed-state", "enrich", "assign-key"}

    truth = [json.loads(line) for line in (tmp_path / "dataset" / "test" / "ground_truth.jsonl").read_text().splitlines()]
    assert truth[0]["job_id"] == run.job_id and truth[0]["faults"][0]["family"] == "state_leak"
    assert truth[0]["faults"][0]["vertex_id"] == keyed[0]["vertex_id"]
    from pipelines.datasets import read_jsonl

    assert len(list(read_jsonl(tmp_path / "dataset" / "test" / "events.jsonl.gz"))) == len(mine)
    # Stopped by PID: nothing listens on the lab's ports any more.
    assert not port_in_use("127.0.0.1", config.lab.rest_port)


def test_a_recorded_lab_run_is_a_training_set(spark, tmp_path):
    """Events the collector made from real Flink answers, recorded as a lab run, come back out of the
    offline store as labelled feature rows: what `sentinel train --dataset` reads."""
    from feature_store import offline_store
    from pipelines.collector import ClusterCollector
    from pipelines.config import CollectorConfig, FlinkClusterEndpoint
    from tests.pipelines.collector.flink_replay import RecordedFlink, recorded_polls

    polls = recorded_polls("leak")
    events: list[dict] = []
    with RecordedFlink(polls) as flink:
        collector = ClusterCollector(FlinkClusterEndpoint(name="lab", rest_url=flink.url),
                                     CollectorConfig(state_dir=None), events.extend, source="lab")
        for poll in range(len(polls)):
            flink.poll = poll
            collector.poll()
    job_id = events[0]["job_id"]
    truth = lab.ground_truth(lab.scenario("leak", 240), job_id, "lab-leak", events, onset_ms=0, submitted_at=0)
    lab.record_run(tmp_path / "dataset", "train", events, truth)

    event_files, truth_files = offline_store.dataset_files(tmp_path / "dataset")
    assert offline_store.backfill(spark, event_files, tmp_path / "store") > 0
    rows = offline_store.training_set(spark, tmp_path / "store", truth_files).toPandas()
    keyed = rows[rows["vertex_name"] == "keyed-state"]
    assert len(keyed) > 0 and set(keyed["label"]) == {"state_leak"}
    assert set(rows["job_id"]) == {job_id}


def test_a_run_that_does_not_show_its_scenario_is_unsound_and_can_be_taken_out(tmp_path):
    job_id = "d" * 32
    statuses = [{"kind": "job_status", "job_id": job_id, "ts": ts, "num_restarts": r} for ts, r in ((1, 0), (2, 3))]
    checkpoints = [_checkpoint(job_id, ts) for ts in (10, 20, 30)]
    healthy = lab.scenario("healthy_ttl", 240)
    assert lab.unsound(healthy, checkpoints[:2]) == "only 2 completed checkpoints"
    assert lab.unsound(healthy, checkpoints + statuses) == "3 restarts the scenario does not cause"
    assert lab.unsound(lab.scenario("restart_loop", 240), checkpoints + statuses) is None  # its restarts are the fault

    events = [_vertex_event(job_id, ts, [1.0]) for ts in (10, 20)]
    lab.record_run(tmp_path, "train", events, lab.ground_truth(healthy, job_id, "j", events, 0, 0),
                   {"run_id": "crashed", "split": "train", "job_id": job_id})
    other = [_vertex_event("e" * 32, 15, [1.0])]
    lab.record_run(tmp_path, "train", other, lab.ground_truth(healthy, "e" * 32, "j", other, 0, 0),
                   {"run_id": "fine", "split": "train", "job_id": "e" * 32})
    assert lab.remove_runs(tmp_path, ["crashed", "never-recorded"]) == ["crashed"]
    from pipelines.datasets import read_jsonl

    assert {e["job_id"] for e in read_jsonl(tmp_path / "train" / "events.jsonl.gz")} == {"e" * 32}
    assert lab.recorded_runs(tmp_path) == {"fine"}
    assert json.loads((tmp_path / "manifest.json").read_text())["splits"]["train"]["jobs"] == 1


def test_a_dataset_subset_keeps_only_the_named_runs_in_their_splits(tmp_path):
    from pipelines.datasets import dataset_files, read_jsonl, subset

    variant = lab.scenario("healthy_ttl", 240)
    for split, job_id, run_id in (("train", "a" * 32, "one"), ("test", "b" * 32, "two"), ("test", "c" * 32, "three")):
        events = [_vertex_event(job_id, 10, [1.0])]
        truth = {**lab.ground_truth(variant, job_id, "j", events, 0, 0), "run_id": run_id}
        lab.record_run(tmp_path / "all", split, events, truth, {"run_id": run_id})
    subset(tmp_path / "all", ["two"], tmp_path / "some")
    events, truths = dataset_files(tmp_path / "some")
    assert [p.parent.name for p in events] == ["test"]
    assert [t["run_id"] for t in read_jsonl(truths[0])] == ["two"]
    assert {e["job_id"] for e in read_jsonl(events[0])} == {"b" * 32}
    with pytest.raises(ValueError, match="has no run four"):
        subset(tmp_path / "all", ["two", "four"], tmp_path / "none")
