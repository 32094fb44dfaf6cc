"""Faults that end in their run are judged on how their incidents end."""

from pipelines.families import BACKPRESSURE, STATE_LEAK
from pipelines.incidents.comparison import compare

START = 1_000_000
FIXED_AT = START + 400_000


def _truth(run: str, end_ts: int | None = FIXED_AT) -> dict:
    return {"cluster": "lab", "job_id": run, "run_id": run, "job_name": run, "scenario": "leak_fixed",
            "faults": [{"family": STATE_LEAK, "onset_ts": START, "vertex_id": "v1", "vertex_name": "keyed-state",
                        "end_ts": end_ts}]}


def _incident(run: str, incident_id: str, opened_at: int, family: str = STATE_LEAK, vertex_id: str = "v1") -> dict:
    return {"incident_id": incident_id, "event": "opened", "cluster": "lab", "job_id": run, "family": family,
            "vertex_id": vertex_id, "vertex_name": "keyed-state", "opened_at": opened_at, "symptoms": [],
            "summary": "", "job_name": run}


def _resolved(incident: dict, at: int, resolution: str = "levelled_off") -> dict:
    return {**incident, "event": "resolved", "resolved_at": at, "resolution": resolution}


def test_a_fixed_leak_is_judged_on_when_its_last_incident_resolved_after_the_fix():
    first = _incident("fixed", "i1", START + 200_000)
    again = _incident("fixed", "i2", START + 300_000)
    events = [first, _resolved(first, START + 280_000), again, _resolved(again, FIXED_AT + 630_000)]
    (found,) = compare([_truth("fixed")], events).ended
    assert found["job_name"] == "fixed" and found["resolution"] == "levelled_off"
    assert found["resolved_after_end_s"] == 630.0  # the second incident's end, not the first's
    assert found["delay_s"] == 200.0


def test_a_leak_whose_incident_stays_open_is_not_resolved_and_a_fault_without_an_end_is_not_judged():
    open_ = _incident("open", "i1", START + 200_000)
    other = _incident("ongoing", "i2", START + 200_000)
    comparison = compare([_truth("open"), _truth("ongoing", end_ts=None)], [open_, other])
    (found,) = comparison.ended
    assert found["job_name"] == "open"
    assert found["resolved_at"] is None and found["resolved_after_end_s"] is None and found["resolution"] is None
    assert "ended_at" not in comparison.runs[1].found[0]


def test_another_familys_incident_on_the_job_does_not_stand_for_the_leaks_end():
    leak = _incident("fixed", "i1", START + 200_000)
    backpressure = _incident("fixed", "i2", START + 100_000, family=BACKPRESSURE, vertex_id="v2")
    (found,) = compare([_truth("fixed")], [backpressure, _resolved(backpressure, START + 150_000), leak]).ended
    assert found["incident_id"] == "i1" and found["resolved_after_end_s"] is None
