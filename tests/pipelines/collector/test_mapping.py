"""Flink REST answers recorded from the lab -> input-contract events (pure mapping, no I/O)."""

import re

import pytest

from pipelines.collector import mapping
from pipelines.contracts import INPUT
from tests.pipelines.collector.flink_replay import recorded_polls

JOB_PATH = re.compile(r"^/jobs/([0-9a-f]{32})$")


def answers_of(name: str, poll: int = 0) -> tuple[dict, dict, dict]:
    answers = recorded_polls(name)[poll]
    job_path = next(p for p in answers if JOB_PATH.match(p))
    job_id = JOB_PATH.match(job_path).group(1)
    overview = next(j for j in answers["/jobs/overview"]["jobs"] if j["jid"] == job_id)
    return answers, overview, answers[job_path]


def vertex_named(job: dict, name: str) -> dict:
    return next(v for v in job["vertices"] if v["name"] == name)


def test_nan_metrics_become_null_and_reported_ones_keep_their_value():
    answers, overview, job = answers_of("leak", poll=1)
    source = vertex_named(job, "Source: records[1]")
    path = next(p for p in answers if p.startswith(f"/jobs/{overview['jid']}/vertices/{source['id']}/metrics"))
    raw = {m["id"]: m["value"] for m in answers[path]}
    assert raw["0.busyTimeMsPerSecond"] == "NaN"  # what Flink 2.3 says for the datagen source

    event = mapping.vertex_metrics_event("lab", overview, source, raw, ts=1)

    sample = event["subtasks"][0]
    assert sample["busy_time_ms_per_s"] is None
    assert sample["records_out_per_s"] == pytest.approx(float(raw["0.numRecordsOutPerSecond"]))
    assert sample["records_out_per_s"] > 0
    assert sample["out_pool_usage"] == pytest.approx(float(raw["0.Shuffle.Netty.Output.Buffers.outPoolUsage"]))
    assert sample["checkpoint_start_delay_ms"] == pytest.approx(float(raw["0.checkpointStartDelayNanos"]) / 1e6)
    assert INPUT.errors(event) == []


def test_a_metric_flink_did_not_report_is_null_not_zero():
    _, overview, job = answers_of("leak", poll=1)
    vertex = vertex_named(job, "keyed-state")
    event = mapping.vertex_metrics_event("lab", overview, vertex, {"0.busyTimeMsPerSecond": "12"}, ts=1)
    sample = event["subtasks"][0]
    assert sample["busy_time_ms_per_s"] == 12.0
    assert sample["idle_time_ms_per_s"] is None and sample["in_pool_usage"] is None


def test_completed_checkpoint_maps_full_and_persisted_sizes_per_vertex_and_subtask():
    answers, overview, job = answers_of("leak")
    history = answers[f"/jobs/{overview['jid']}/checkpoints"]["history"]
    entry = max((c for c in history if c["status"] == "COMPLETED"), key=lambda c: c["id"])
    prefix = f"/jobs/{overview['jid']}/checkpoints/details/{entry['id']}"
    subtasks = {p.rsplit("/", 1)[1]: answers[p] for p in answers if p.startswith(prefix + "/subtasks/")}

    event = mapping.checkpoint_event("lab", overview, entry, answers[prefix], subtasks, job["vertices"])

    assert INPUT.errors(event) == []
    assert event["ts"] == entry["latest_ack_timestamp"] and event["trigger_ts"] == entry["trigger_timestamp"]
    assert event["state_size_bytes"] == entry["state_size"] > 0
    assert event["checkpointed_size_bytes"] == entry["checkpointed_size"]
    keyed = next(v for v in event["vertices"] if v["vertex_name"] == "keyed-state")
    assert keyed["state_size_bytes"] == answers[prefix]["tasks"][keyed["vertex_id"]]["state_size"] > 0
    assert keyed["subtasks"][0]["state_size_bytes"] == keyed["state_size_bytes"]
    raw = subtasks[keyed["vertex_id"]]["subtasks"][0]
    assert keyed["subtasks"][0]["async_duration_ms"] == raw["checkpoint"]["async"]
    assert keyed["subtasks"][0]["alignment_duration_ms"] == raw["alignment"]["duration"]
    assert len(event["vertices"]) == len(job["vertices"])


def test_failed_checkpoint_is_timed_at_its_failure_and_keeps_the_reason():
    answers, overview, job = answers_of("checkpoint_timeout")
    history = answers[f"/jobs/{overview['jid']}/checkpoints"]["history"]
    entry = next(c for c in history if c["status"] == "FAILED")
    prefix = f"/jobs/{overview['jid']}/checkpoints/details/{entry['id']}"
    subtasks = {p.rsplit("/", 1)[1]: answers[p] for p in answers if p.startswith(prefix + "/subtasks/")}

    event = mapping.checkpoint_event("lab", overview, entry, answers[prefix], subtasks, job["vertices"])

    assert INPUT.errors(event) == []
    assert event["status"] == "FAILED"
    assert event["ts"] == entry["failure_timestamp"] != entry["latest_ack_timestamp"]
    assert event["failure_message"] == "Checkpoint expired before completing."
    assert event["num_acknowledged_subtasks"] < event["num_subtasks"]
    pending = [s for v in event["vertices"] for s in v["subtasks"] if s["end_to_end_duration_ms"] is None]
    assert pending, "subtasks that never acknowledged are in the recording"
    assert all(s["state_size_bytes"] is None and s["aborted"] is None for s in pending)


def test_an_in_progress_checkpoint_is_not_an_event():
    answers, overview, job = answers_of("checkpoint_timeout")
    entry = next(c for c in answers[f"/jobs/{overview['jid']}/checkpoints"]["history"] if c["status"] == "IN_PROGRESS")
    with pytest.raises(ValueError, match="not finished"):
        mapping.checkpoint_event("lab", overview, entry, None, {}, job["vertices"])


def test_job_status_reports_the_jobmanager_storage_limit_only_where_it_applies():
    leak, leak_job, _ = answers_of("leak")
    skew, skew_job, _ = answers_of("skew")

    def status(answers, job, configured=None):
        return mapping.job_status_event("lab", job, answers[f"/jobs/{job['jid']}/checkpoints"],
                                        answers[f"/jobs/{job['jid']}/checkpoints/config"], {}, {}, ts=1,
                                        max_state_size_bytes=configured)

    on_jobmanager = status(leak, leak_job)
    assert leak[f"/jobs/{leak_job['jid']}/checkpoints/config"]["checkpoint_storage"] == "JobManagerCheckpointStorage"
    assert on_jobmanager["max_state_size_bytes"] == 5 * 1024 * 1024
    assert on_jobmanager["checkpoint_interval_ms"] == 3000 and on_jobmanager["checkpoint_timeout_ms"] == 60000
    assert on_jobmanager["checkpoints_completed_total"] == leak[f"/jobs/{leak_job['jid']}/checkpoints"]["counts"]["completed"]
    assert status(skew, skew_job)["max_state_size_bytes"] is None  # file system storage: no known limit
    assert status(skew, skew_job, configured=10**9)["max_state_size_bytes"] == 10**9
    assert on_jobmanager["jm_heap_used_bytes"] is None  # not asked for: null, not zero
    assert INPUT.errors(on_jobmanager) == []


def test_skewed_vertex_has_one_sample_per_subtask():
    answers, overview, job = answers_of("skew", poll=1)
    keyed = vertex_named(job, "keyed-state")
    path = next(p for p in answers if p.startswith(f"/jobs/{overview['jid']}/vertices/{keyed['id']}/metrics"))
    event = mapping.vertex_metrics_event("lab", overview, keyed, {m["id"]: m["value"] for m in answers[path]}, ts=1)
    assert keyed["parallelism"] == 2
    assert [s["index"] for s in event["subtasks"]] == [0, 1]
    rates = sorted(s["records_in_per_s"] for s in event["subtasks"])
    assert rates[1] > 3 * rates[0]  # the hot key lands on one subtask


@pytest.mark.parametrize("value, expected", [("NaN", None), ("Infinity", None), ("-Infinity", None),
                                             ("", None), ("abc", None), (True, None), ("3.5", 3.5), (7, 7.0)])
def test_metric_number(value, expected):
    assert mapping.metric_number(value) == expected


def test_disabled_periodic_checkpoints_have_no_interval():
    event = mapping.job_status_event("c", {"jid": "a" * 32, "name": "j", "state": "RUNNING"}, None,
                                     {"interval": 2**63 - 1, "timeout": 600000}, {}, {}, ts=1)
    assert event["checkpoint_interval_ms"] is None and event["checkpoint_timeout_ms"] == 600000


def test_metric_ids_for_wide_vertices_fit_flinks_request_line_limit():
    from pipelines.collector.rest import MAX_QUERY_CHARS, _chunks

    names = mapping.subtask_metric_names(128)
    chunks = list(_chunks(names, MAX_QUERY_CHARS))
    assert len(chunks) > 1 and sum(map(len, chunks)) == len(names)
    assert all(len(",".join(c)) <= MAX_QUERY_CHARS for c in chunks)
