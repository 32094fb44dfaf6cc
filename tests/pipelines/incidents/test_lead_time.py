"""The lead time `sentinel evaluate` reports: from the first warning to the first failed checkpoint."""

import math

from pipelines.incidents.lead_time import LeadTime, fails, lead_times, summary, warnings_without_failure

START = 1_000_000
HORIZON_MS = 900_000


def _truth(faults, job_id="j1", run="run-1", end_s=3600):
    return {"cluster": "lab", "job_id": job_id, "job_name": f"lab-{run}", "run_id": run, "start_ts": START,
            "end_ts": START + end_s * 1000, "faults": faults}


def _event(kind, family, at_s, forecasts=(), job_id="j1", incident="i1"):
    return {"cluster": "lab", "job_id": job_id, "incident_id": incident, "event": kind, "family": family,
            "updated_at": START + int(at_s * 1000), "opened_at": START, "forecasts": list(forecasts)}


def _timeout(eta_s, low_s, high_s):
    return {"metric": "checkpoint_duration_ms", "limit": 3000, "limit_source": "job", "eta_ms": int(eta_s * 1000),
            "eta_low_ms": int(low_s * 1000), "eta_high_ms": None if high_s is None else int(high_s * 1000)}


LEAK_TO_TIMEOUT = [{"family": "state_leak", "onset_ts": START, "vertex_id": "v"},
                   {"family": "checkpoint_failure", "onset_ts": START + 600_000, "vertex_id": None}]


def test_the_first_event_with_a_forecast_within_the_horizon_is_the_warning():
    events = [_event("opened", "state_leak", 240),  # no forecast: no warning yet
              _event("updated", "state_leak", 300, [_timeout(2000, 1500, 2500)]),  # beyond the horizon
              _event("updated", "state_leak", 360, [_timeout(200, 150, 300)]),
              _event("updated", "state_leak", 420, [_timeout(150, 100, 200)])]
    [run] = lead_times([_truth(LEAK_TO_TIMEOUT)], events, lambda name: HORIZON_MS)
    assert run.cause == "state_leak" and run.build_up_ms == 600_000
    assert run.warning_ts == START + 360_000 and run.lead_ms == 240_000
    assert run.eta_ms == 200_000 and math.isclose(run.eta_error, (200 - 240) / 240)
    assert run.band_held is True  # 240 s within 150-300 s
    assert run.warned_in_time is True  # a 10-minute build-up warned of 240 s ahead


def test_a_band_that_misses_the_real_time_and_a_late_warning_are_told():
    events = [_event("opened", "state_leak", 560, [_timeout(10, 5, 20)])]
    [run] = lead_times([_truth(LEAK_TO_TIMEOUT)], events, lambda name: HORIZON_MS)
    assert run.lead_ms == 40_000
    assert run.band_held is False and run.warned_in_time is False


def test_an_incident_resolved_before_the_failure_does_not_warn_and_a_word_after_it_has_a_negative_lead():
    events = [_event("opened", "state_leak", 60, [_timeout(500, 400, 600)], incident="early"),
              _event("resolved", "state_leak", 100, [_timeout(500, 400, 600)], incident="early"),
              _event("opened", "checkpoint_failure", 605, [_timeout(0, 0, 0)], incident="late")]
    [run] = lead_times([_truth(LEAK_TO_TIMEOUT)], events, lambda name: HORIZON_MS)
    assert run.warning_ts == START + 605_000 and run.lead_ms == -5_000
    assert not run.warned and run.eta_error is None and run.band_held is None and run.warned_in_time is False


def test_static_alarms_warn_only_by_an_opened_checkpoint_failure():
    events = [_event("updated", "state_leak", 360, [_timeout(200, 150, 300)]),
              _event("opened", "checkpoint_failure", 600, incident="i2")]
    [with_forecasts] = lead_times([_truth(LEAK_TO_TIMEOUT)], events, lambda name: HORIZON_MS)
    [static] = lead_times([_truth(LEAK_TO_TIMEOUT)], events, lambda name: HORIZON_MS, with_forecasts=False)
    assert with_forecasts.lead_ms == 240_000 and with_forecasts.warned
    assert static.lead_ms == 0 and not static.warned and static.eta_ms is None and static.band_held is None


def test_a_failure_joining_a_cause_as_its_symptom_is_its_first_word():
    leak = _event("updated", "state_leak", 630)
    leak["symptoms"] = [{"family": "checkpoint_failure", "first_at": START + 610_000, "evidence": {}}]
    [run] = lead_times([_truth(LEAK_TO_TIMEOUT)], [_event("opened", "state_leak", 240), leak],
                       lambda name: HORIZON_MS, with_forecasts=False)
    assert run.warning_ts == START + 610_000 and run.lead_ms == -10_000 and run.warning_family == "state_leak"


def test_runs_without_a_failure_are_not_judged_and_a_failure_without_a_cause_has_no_build_up():
    outage = [{"family": "checkpoint_failure", "onset_ts": START + 80_000, "vertex_id": None}]
    healthy = _truth([], job_id="j2", run="healthy")
    runs = lead_times([_truth(outage), healthy], [_event("opened", "checkpoint_failure", 80)],
                      lambda name: HORIZON_MS)
    assert [r.run for r in runs] == ["run-1"]
    assert runs[0].cause == "checkpoint_failure" and runs[0].build_up_ms is None and runs[0].warned_in_time is None
    assert runs[0].lead_ms == 0 and summary(runs)["warned"] == 0


def test_the_job_s_own_warning_horizon_applies():
    events = [_event("updated", "state_leak", 360, [_timeout(200, 150, 300)])]
    [run] = lead_times([_truth(LEAK_TO_TIMEOUT)], events, lambda name: 100_000 if name == "lab-run-1" else HORIZON_MS)
    assert run.warning_ts is None and not run.warned


def test_summary_per_cause():
    def run(cause, lead_s, eta_s, held_low, build_up_s):
        return LeadTime("r", "j", cause, START + lead_s * 1000, build_up_s * 1000, START, cause, eta_s * 1000,
                        held_low * 1000, None, "checkpoint_duration_ms")
    runs = [run("state_leak", 200, 180, 100, 600), run("state_leak", 100, 150, 120, 600),
            run("backpressure", 60, 60, 30, 100)]
    leak = summary(runs, "state_leak")
    assert leak["runs"] == 2 and leak["warned"] == 2 and leak["lead_s_median"] == 150
    assert math.isclose(leak["eta_error_median"], (0.1 + 0.5) / 2)
    assert leak["band_held"] == 0.5  # 150 s's band starts at 120 s: 100 s is before it
    assert leak["warned_in_time"] == 1 and leak["build_ups"] == 2
    assert summary(runs)["runs"] == 3 and summary(runs, "backpressure")["warned_in_time"] == 1


def test_a_forecast_on_a_run_whose_checkpoints_never_fail_is_told_and_overdue_once_its_band_passed():
    episodes = _truth([{"family": "backpressure", "onset_ts": START + 75_000, "vertex_id": "v"}], job_id="j2",
                      run="episodes")
    healthy, quiet = _truth([], job_id="j3", run="twin"), _truth([], job_id="j4", run="quiet")
    short = _truth([], job_id="j5", run="short", end_s=300)
    events = [_event("updated", "state_leak", 360, [_timeout(200, 150, 300)]),  # the failing run: not here
              _event("opened", "backpressure", 100, job_id="j2", incident="b"),  # no forecast yet
              _event("updated", "backpressure", 130, [_timeout(2000, 1500, 2500)], job_id="j2", incident="b"),
              _event("updated", "backpressure", 140, [_timeout(90, 60, None)], job_id="j2", incident="b"),
              _event("updated", "backpressure", 160, [_timeout(90, 60, 120)], job_id="j2", incident="b"),
              _event("opened", "backpressure", 70, [_timeout(300, 200, 400)], job_id="j3", incident="c"),
              _event("opened", "skew", 70, job_id="j4", incident="d"),  # an incident, but no forecast
              # the run ends at 300 s, before the band's late end (100 + 240 s): it could not be wrong yet
              _event("opened", "backpressure", 100, [_timeout(180, 120, 240)], job_id="j5", incident="e")]
    warned = warnings_without_failure([_truth(LEAK_TO_TIMEOUT), episodes, healthy, quiet, short], events,
                                      lambda name: HORIZON_MS)
    # the episodes' first warning is at 140 s (unbounded above); at 160 s a band ends at 280 s and the run goes on
    assert [(w.run, w.healthy, w.warning_ts - START, w.family, w.eta_ms, w.overdue) for w in warned] == [
        ("episodes", False, 140_000, "backpressure", 90_000, True), ("twin", True, 70_000, "backpressure", 300_000, True),
        ("short", True, 100_000, "backpressure", 180_000, False)]
    assert not fails(healthy) and fails(_truth(LEAK_TO_TIMEOUT))
