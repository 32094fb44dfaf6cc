"""The collector's mapping against one raw REST answer per endpoint and Flink version the lab runs
(recorded by ``record_rest_bodies.py`` from a running lab job on each version's cluster: a keyed
vertex of parallelism two or more, a completed checkpoint): every event keeps the input contract
and carries the measurements that version reports. The versions differ where the mapping does not
look: 1.20 still reports ``buffers.inPoolUsage`` / ``outPoolUsage`` next to the
``Shuffle.Netty.*`` names (the mapping reads the latter first), and 2.3 adds ``jobType``,
``schedulerType``, ``pending-operators`` and ``application-id`` to the job answers."""

import json
from pathlib import Path

import pytest

from pipelines.collector import mapping
from pipelines.contracts import INPUT
from pipelines.lab.corpus import LAB_VERSIONS

BODIES = Path(__file__).parent / "rest_bodies"
VERSIONS = sorted(p.name for p in BODIES.iterdir() if p.is_dir())


def bodies(version: str) -> dict:
    folder = BODIES / version
    return {path.stem: json.loads(path.read_text()) for path in folder.glob("*.json")}


def metric_values(answer: list) -> dict:
    return {item["id"]: item.get("value") for item in answer}


def test_every_lab_version_has_its_bodies():
    assert set(LAB_VERSIONS) <= set(VERSIONS)
    for version in VERSIONS:
        recorded = bodies(version)
        assert recorded["index"]["flink_version"] == version
        assert set(recorded) - {"index"} == set(recorded["index"]["paths"])


@pytest.fixture(params=VERSIONS)
def answers(request):
    recorded = bodies(request.param)
    job_id = recorded["index"]["job_id"]
    overview = next(job for job in recorded["jobs_overview"]["jobs"] if job["jid"] == job_id)
    return request.param, recorded, overview


def test_the_job_status_keeps_the_contract_and_reads_the_checkpoint_settings(answers):
    version, recorded, overview = answers
    event = mapping.job_status_event("lab", overview, recorded["job_checkpoints"], recorded["checkpoint_config"],
                                     metric_values(recorded["job_metrics"]), metric_values(recorded["jobmanager_metrics"]),
                                     ts=overview["start-time"] + 1)
    assert INPUT.errors(event) == [], version
    assert event["state"] == "RUNNING" and event["checkpoints_completed_total"] > 0
    assert event["checkpoint_interval_ms"] == recorded["checkpoint_config"]["interval"] > 0
    assert event["checkpoint_timeout_ms"] == recorded["checkpoint_config"]["timeout"] > 0
    assert event["num_restarts"] == 0
    assert event["jm_heap_used_bytes"] > 0 and event["jm_heap_max_bytes"] > event["jm_heap_used_bytes"]


def test_a_completed_checkpoint_keeps_the_contract_with_its_vertices_and_subtasks(answers):
    version, recorded, overview = answers
    details = recorded["checkpoint_details"]
    entry = next(c for c in recorded["job_checkpoints"]["history"] if c["id"] == details["id"])
    subtasks = recorded["checkpoint_subtasks"]
    vertex_id = recorded["index"]["paths"]["checkpoint_subtasks"].rsplit("/", 1)[1]
    vertices = recorded["job"]["vertices"]
    event = mapping.checkpoint_event("lab", overview, entry, details, {vertex_id: subtasks}, vertices)
    assert INPUT.errors(event) == [], version
    assert event["status"] == "COMPLETED" and event["state_size_bytes"] > 0 and event["end_to_end_duration_ms"] >= 0
    assert event["ts"] == entry["latest_ack_timestamp"] > event["trigger_ts"] > 0
    names = {v["id"]: v["name"] for v in vertices}
    assert {v["vertex_id"]: v["vertex_name"] for v in event["vertices"]} == {v: names[v] for v in details["tasks"]}
    detailed = next(v for v in event["vertices"] if v["vertex_id"] == vertex_id)
    assert len(detailed["subtasks"]) == detailed["parallelism"] >= 2
    for sample in detailed["subtasks"]:
        assert sample["sync_duration_ms"] is not None and sample["async_duration_ms"] is not None
        assert sample["end_to_end_duration_ms"] is not None and sample["alignment_duration_ms"] is not None
        assert sample["unaligned"] is False


def test_vertex_metrics_keep_the_contract_and_every_subtask_reports_its_time_and_buffers(answers):
    version, recorded, overview = answers
    index = recorded["index"]["paths"]["vertex_metrics"]
    vertex = next(v for v in recorded["job"]["vertices"] if f"/vertices/{v['id']}/" in index)
    values = metric_values(recorded["vertex_metrics"])
    event = mapping.vertex_metrics_event("lab", overview, vertex, values, ts=overview["start-time"] + 1)
    assert INPUT.errors(event) == [], version
    assert event["vertex_name"] == vertex["name"] and event["parallelism"] == vertex["parallelism"] >= 2
    for sample in event["subtasks"]:
        # A keyed vertex (not the source): Flink measures every one of these on both versions.
        for field in ("busy_time_ms_per_s", "backpressured_time_ms_per_s", "idle_time_ms_per_s", "records_in_per_s",
                      "records_out_per_s", "in_pool_usage", "out_pool_usage", "checkpoint_start_delay_ms",
                      "checkpoint_alignment_time_ms"):
            assert sample[field] is not None, (version, field)
        assert 0 <= sample["busy_time_ms_per_s"] + sample["idle_time_ms_per_s"] + sample["backpressured_time_ms_per_s"] <= 1001
