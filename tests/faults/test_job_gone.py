"""A Flink job that disappears with an incident open: its incident resolves as "job gone" once the
job has been silent for the idle timeout, in the live job and in a replay alike. Before, the
incident stayed open for ever and the alert relay re-sent it for ever.
"""

from __future__ import annotations

import pytest

from pipelines.contracts import INCIDENT
from pipelines.detection.champions import ChampionCache
from pipelines.detection.flink_job import replay
from pipelines.detection.job import start_detection
from pipelines.incidents.policy import JOB_GONE
from tests.helpers.detection_job import detection_config_for, fleet, fleet_events, publish, read_topic, write_jsonl
from tests.helpers.waiting import wait_for

IDLE_S = 600


def _vanishing_leak(config):
    """A leaking job that stops reporting after 6 minutes (no last status: its cluster went away),
    beside a healthy job of the same input that goes on for 25 minutes."""
    config.features.idle_timeout_s = IDLE_S
    leak, healthy = fleet(["leak_seed000", "healthy_steady"], 7, 25)
    cut = leak.events[0]["ts"] + 6 * 60_000
    leak_events = [e for e in leak.events if e["ts"] < cut]
    assert not any(e.get("state") in ("CANCELED", "FAILED", "FINISHED") for e in leak_events)
    events = sorted(leak_events + list(healthy.events), key=lambda e: e["ts"])
    return leak.truth["job_id"], events, max(e["ts"] for e in leak_events)


def _gone(incidents: list[dict], job_id: str, last_ts: int) -> dict:
    mine = [i for i in incidents if i["job_id"] == job_id]
    opened = {i["incident_id"] for i in mine if i["event"] == "opened"}
    assert opened, f"the leak was not caught: {[(i['family'], i['event']) for i in mine]}"
    resolved = [i for i in mine if i["event"] == "resolved"]
    assert {i["incident_id"] for i in resolved} == opened, "an incident of the vanished job stayed open"
    gone = [i for i in resolved if i.get("resolution") == JOB_GONE]
    assert gone, [i["summary"] for i in resolved]
    for incident in gone:
        assert INCIDENT.errors(incident) == []
        assert incident["resolved_at"] == incident["updated_at"] >= incident["opened_at"]
        assert incident["resolved_at"] >= last_ts + IDLE_S * 1000  # not before the idle timeout passed
        assert "the job is gone" in incident["summary"] and incident["labels"]["event"] == "resolved"
    return gone[0]


def test_a_replay_resolves_the_incidents_of_a_job_gone_silent(trained_store, tmp_path):
    config = trained_store.model_copy(deep=True)
    job_id, events, last_ts = _vanishing_leak(config)
    result = replay(config, [write_jsonl(tmp_path / "events.jsonl", events)], ChampionCache(config).require())
    _gone(result.incidents, job_id, last_ts)


@pytest.mark.slow
def test_the_live_job_resolves_the_incidents_of_a_job_gone_silent(spark, broker_config, trained_store, tmp_path):
    config = detection_config_for(broker_config, trained_store, tmp_path)
    job_id, events, last_ts = _vanishing_leak(config)
    publish(config, events)
    job = start_detection(spark, config, ChampionCache(config))
    try:
        def resolved() -> bool:
            assert job.query.exception() is None, job.query.exception()
            return any(i["job_id"] == job_id and i.get("resolution") == JOB_GONE
                       for i in read_topic(config, config.topics.incidents))
        wait_for(resolved, 300, 3.0)
    finally:
        job.stop()
    _gone(read_topic(config, config.topics.incidents), job_id, last_ts)
