"""A fault shorter than its guard is told, not swallowed.

A real Flink leak (the lab's test split) that ends before its warm-up horizon: the leak decision
is held back by the horizon the whole run, and the run ends. The policy publishes what it held as
an ``info`` incident opened where the guard first held it, resolved at the end as
``unconfirmed``. The same run to its end is confirmed as a warning past the horizon, with no
suspicion published.
"""

from __future__ import annotations

import pytest

from pipelines.contracts import INCIDENT
from pipelines.datasets import read_jsonl
from pipelines.detection.champions import ChampionCache
from pipelines.detection.flink_job import replay
from pipelines.families import STATE_LEAK
from pipelines.incidents.policy import TERMINAL_STATES, UNCONFIRMED
from tests.conftest import LAB_CORPUS
from tests.helpers.detection_job import write_jsonl

LEAK_RUN = "leak_start-hashmap-filesystem-p1-r250-b100-i1000"  # leaks from its start; default horizon 180 s
CUT_S = 150  # ends before the horizon


def recorded_run(run_id: str) -> tuple[dict, list[dict]]:
    truth = next(t for t in read_jsonl(LAB_CORPUS / "test" / "ground_truth.jsonl") if t["run_id"] == run_id)
    events = [e for e in read_jsonl(LAB_CORPUS / "test" / "events.jsonl.gz") if e["job_id"] == truth["job_id"]]
    return truth, events


def ended_at(events: list[dict], start_ts: int, cut_s: float) -> list[dict]:
    """The run's events up to ``cut_s`` after its start, then its own last status (the job's end) at that time."""
    cut = start_ts + int(cut_s * 1000)
    kept = [e for e in events if e["ts"] <= cut]
    last_status = [e for e in events if e["kind"] == "job_status"][-1]
    assert last_status["state"] in TERMINAL_STATES
    return kept + [{**last_status, "ts": cut + 1}]


@pytest.fixture(scope="module")
def models(trained_store):
    return ChampionCache(trained_store).require()


def test_a_leak_ending_within_its_warm_up_horizon_is_published_as_an_unconfirmed_suspicion(trained_store, models,
                                                                                            tmp_path):
    truth, events = recorded_run(LEAK_RUN)
    horizon_s = trained_store.detection.warmup_horizon_s
    assert CUT_S < horizon_s
    incidents = replay(trained_store, [write_jsonl(tmp_path / "events.jsonl", ended_at(events, truth["start_ts"], CUT_S))],
                       models).incidents
    leak = [i for i in incidents if i["family"] == STATE_LEAK]
    assert [i["event"] for i in leak] == ["opened", "resolved"], incidents
    opened, resolved = leak
    fault = truth["faults"][0]
    assert opened["severity"] == resolved["severity"] == "info" and opened["labels"]["severity"] == "info"
    assert opened["vertex_id"] == fault["vertex_id"]
    assert opened["summary"].startswith("[suspected]") and f"{horizon_s:.0f} s warm-up horizon" in opened["summary"]
    assert resolved["resolution"] == UNCONFIRMED and "the job ended" in resolved["summary"]
    assert opened["incident_id"] == resolved["incident_id"]
    assert truth["start_ts"] <= opened["opened_at"] <= truth["start_ts"] + CUT_S * 1000
    assert resolved["resolved_at"] == truth["start_ts"] + CUT_S * 1000 + 1
    for incident in leak:
        INCIDENT.validator.validate(incident)
    assert not [i for i in incidents if i["family"] != STATE_LEAK and i["severity"] != "info"]


def test_the_same_leak_run_to_its_end_is_confirmed_past_the_horizon_and_no_suspicion_is_published(trained_store, models,
                                                                                                 tmp_path):
    truth, events = recorded_run(LEAK_RUN)
    incidents = replay(trained_store, [write_jsonl(tmp_path / "events.jsonl", events)], models).incidents
    leak = [i for i in incidents if i["family"] == STATE_LEAK]
    assert leak and leak[0]["event"] == "opened" and leak[0]["severity"] != "info"
    assert leak[0]["opened_at"] - truth["start_ts"] >= trained_store.detection.warmup_horizon_s * 1000
    assert not [i for i in incidents if i.get("resolution") == UNCONFIRMED or i["summary"].startswith("[suspected]")]
