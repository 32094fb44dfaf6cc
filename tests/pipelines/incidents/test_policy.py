"""The incident policy on hand-made score sequences: when incidents open, update and resolve."""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from models.post_rule import PostRule
from pipelines.contracts import INCIDENT
from pipelines.families import ALERTNAMES
from pipelines.families import FAMILIES
from pipelines.incidents import policy
from pipelines.incidents.policy import PolicySettings, step
from tests.helpers.incidents import rows_and_scores, together

MIN = 60_000
RULES = {f: PostRule(0.5, 2, 3) for f in FAMILIES}
SETTINGS = PolicySettings(resolve_after_ms=10 * MIN, critical_eta_s=3600)


def test_opens_after_k_of_n_and_resolves_after_the_clear_time():
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.1), (2, 0.8), (3, 0.9), (4, 0.1), (5, 0.1), (6, 0.1),
                                    (10, 0.1), (16, 0.1), (17, 0.1)])
    state: dict = {}
    events = step(state, rows, scores, RULES, SETTINGS)
    assert [(e["event"], e["updated_at"] // MIN) for e in events] == [("opened", 2), ("resolved", 16)]
    opened, resolved = events
    assert opened["incident_id"] == resolved["incident_id"] == policy.incident_id("c", "j1", "state_leak", "v1", 2 * MIN)
    assert resolved["resolved_at"] == 16 * MIN and resolved["opened_at"] == 2 * MIN
    assert opened["model"] == {"name": "sentinel-state_leak", "version": "3", "alias": "champion"}
    for event in events:
        assert INCIDENT.errors(event) == []


def test_the_same_rows_from_the_same_state_give_the_same_events_in_any_batching():
    rows, scores = rows_and_scores([(m, 0.9 if 3 <= m < 9 else 0.1) for m in range(30)])
    whole = step({}, rows, scores, RULES, SETTINGS)
    state: dict = {}
    split = []
    for part in (range(0, 7), range(7, 12), range(12, 30)):
        idx = list(part)
        r = rows.iloc[idx].reset_index(drop=True)
        s = scores[scores["row"].isin(idx)].assign(row=lambda d: d["row"] - idx[0])
        before = copy.deepcopy(state)
        first = step(state, r, s, RULES, SETTINGS)
        # A re-run micro-batch starts from the state before it and re-sends the same ids.
        assert step(before, r, s, RULES, SETTINGS) == first
        split += first
    assert split == whole and [e["event"] for e in whole] == ["opened", "resolved"]


def test_a_leak_with_a_near_limit_forecast_is_critical_and_updates_when_the_eta_moves():
    # The features carry the largest subtask's ETA to the job's own limit.
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9), (2, 0.9), (3, 0.9)],
                                   limit_eta_s=[20_000, 19_940, 1_200, 1_150], limit_ratio=0.5,
                                   vertex_state_size_bytes=100.0)
    events = step({}, rows, scores, RULES, SETTINGS)
    assert [(e["event"], e["severity"]) for e in events] == [("opened", "warning"), ("updated", "critical")]
    assert events[1]["forecast"]["eta_ms"] == 1_200_000
    assert "limit in 20 min" in events[1]["summary"]
    assert events[1]["runbook"] and any("TTL" in step_ for step_ in events[1]["runbook"])


def test_severity_escalates_at_once_but_steps_down_only_after_the_clear_time():
    # Half the checkpoints failing is critical, 40% a warning; the rate hovers, then stays lower.
    fractions = [0.6, 0.6, 0.4, 0.6] + [0.4] * 12
    rows, scores = rows_and_scores([(m, 0.9) for m in range(len(fractions))], family="checkpoint_failure",
                                   vertex=None, checkpoint_failed_fraction=fractions)
    events = step({}, rows, scores, RULES, SETTINGS)
    assert [(e["event"], e["severity"], e["updated_at"] // MIN) for e in events] == [
        ("opened", "critical", 1), ("updated", "warning", 14)]


def test_anomalies_only_when_no_family_explains_the_job():
    leak_rows, leak_scores = rows_and_scores([(m, 0.9) for m in range(5)])
    job_rows, anomaly_scores = rows_and_scores([(m, 0.9) for m in range(5)], family="anomaly", vertex=None)
    rows = pd.concat([leak_rows, job_rows], ignore_index=True)
    scores = pd.concat([leak_scores, anomaly_scores.assign(row=anomaly_scores["row"] + len(leak_rows))],
                       ignore_index=True)
    families = [e["family"] for e in step({}, rows, scores, RULES, SETTINGS)]
    assert families == ["state_leak"]
    alone = step({}, job_rows, anomaly_scores, RULES, SETTINGS)
    assert [(e["family"], e["severity"]) for e in alone] == [("anomaly", "info")]


def test_a_job_that_ends_resolves_its_open_incidents():
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9), (2, 0.9)])
    state: dict = {}
    assert [e["event"] for e in step(state, rows, scores, RULES, SETTINGS)] == ["opened"]
    ended = rows.iloc[[0]].assign(ts=3 * MIN, job_state="CANCELED", vertex_id=None).reset_index(drop=True)
    events = step(state, ended, scores.iloc[0:0], RULES, SETTINGS)
    assert [(e["event"], e["vertex_id"]) for e in events] == [("resolved", "v1")]
    assert "the job ended" in events[0]["summary"]


@pytest.mark.parametrize("family,features,expected", [
    ("skew", {"hot_subtask": 3.0, "records_in_max_over_mean": 3.4}, "subtask 3 carries 3.4x"),
    ("backpressure", {"busy_max": 0.98}, "is the bottleneck (busy 98%)"),
    ("checkpoint_failure", {"checkpoint_failed_fraction": 0.5, "last_failure_message": "Checkpoint expired"},
     "50% of recent checkpoints failed"),
])
def test_each_family_names_where_and_what(family, features, expected):
    vertex = None if family == "checkpoint_failure" else "v1"
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9)], family=family, vertex=vertex, **features)
    (opened,) = step({}, rows, scores, RULES, SETTINGS)
    assert expected in opened["summary"]
    if family == "skew":
        assert opened["subtask_index"] == 3
    if family == "checkpoint_failure":
        assert opened["evidence"]["last_failure_message"] == "Checkpoint expired"
    # The alert's identity (alertname per family, cluster, job, vertex) with severity and event beside it.
    assert opened["labels"] == {"alertname": ALERTNAMES[family], "cluster": "c", "job_name": "orders", "job_id": "j1",
                                "vertex_id": vertex or "", "vertex": "Window" if vertex else "", "family": family,
                                "severity": opened["severity"], "event": "opened"}



def test_checkpoint_failures_caused_by_a_leak_are_a_symptom_in_the_leak_incident():
    rows, scores = together(rows_and_scores([(m, 0.9) for m in range(5)]),
                            rows_and_scores([(m, 0.9) for m in range(5)], family="checkpoint_failure", vertex=None,
                                            checkpoint_failed_fraction=[0.0, 0.25, 0.5, 0.75, 0.75],
                                            last_failure_message="Size of the state is larger than the maximum"))
    events = step({}, rows, scores, RULES, SETTINGS)
    assert [(e["event"], e["family"], e["severity"], e["updated_at"] // MIN) for e in events] == [
        ("opened", "state_leak", "warning", 1),
        # The failures join the leak's incident, and its severity follows them (half failing: critical).
        ("updated", "state_leak", "warning", 1), ("updated", "state_leak", "critical", 2)]
    (symptom,) = events[-1]["symptoms"]
    assert symptom["family"] == "checkpoint_failure" and symptom["first_at"] == 1 * MIN
    assert symptom["evidence"]["last_failure_message"].startswith("Size of the state")
    assert "checkpoint" in events[-1]["summary"]
    for event in events:
        assert INCIDENT.errors(event) == []
    # Without the leak the same failures are an incident of their own.
    alone_rows, alone_scores = rows_and_scores([(m, 0.9) for m in range(5)], family="checkpoint_failure", vertex=None)
    assert [e["family"] for e in step({}, alone_rows, alone_scores, RULES, SETTINGS)] == ["checkpoint_failure"]


def test_a_symptom_incident_is_resolved_into_its_cause_when_the_cause_is_recognised():
    rows, scores = together(rows_and_scores([(m, 0.9) for m in range(6)], family="checkpoint_failure", vertex=None),
                            rows_and_scores([(m, 0.9 if m >= 3 else 0.1) for m in range(6)]))
    events = step({}, rows, scores, RULES, SETTINGS)
    assert [(e["event"], e["family"], e["updated_at"] // MIN) for e in events] == [
        ("opened", "checkpoint_failure", 1), ("opened", "state_leak", 4), ("resolved", "checkpoint_failure", 4),
        ("updated", "state_leak", 4)]
    assert events[2]["evidence"]["explained_by"] == events[1]["incident_id"]
    assert events[3]["symptoms"][0]["family"] == "checkpoint_failure"
    assert events[3]["symptoms"][0]["first_at"] == 1 * MIN  # when the failures were first an incident
    assert INCIDENT.errors(events[2]) == [] and INCIDENT.errors(events[3]) == []


def test_backpressure_behind_a_hot_key_is_the_skews_symptom_on_its_vertex_only():
    skew = rows_and_scores([(m, 0.9) for m in range(4)], family="skew", vertex="hot", hot_subtask=1.0)
    backpressure_there = rows_and_scores([(m, 0.9) for m in range(4)], family="backpressure", vertex="hot")
    backpressure_elsewhere = rows_and_scores([(m, 0.9) for m in range(4)], family="backpressure", vertex="sink")
    events = step({}, *together(skew, backpressure_there, backpressure_elsewhere), RULES, SETTINGS)
    assert [(e["event"], e["family"], e["vertex_id"]) for e in events] == [
        ("opened", "skew", "hot"), ("updated", "skew", "hot"), ("opened", "backpressure", "sink")]
    assert events[1]["symptoms"][0]["family"] == "backpressure"


def test_a_job_has_one_backpressure_incident_and_the_cascade_joins_it():
    bottleneck = rows_and_scores([(m, 0.9 if m < 4 else 0.1) for m in range(20)], family="backpressure",
                                 vertex="enrich", busy_max=1.0)
    neighbour = rows_and_scores([(m, 0.9 if m >= 2 else 0.1) for m in range(20)], family="backpressure",
                                vertex="keyed", busy_max=0.6, backpressured_max=0.35)
    other_job = rows_and_scores([(m, 0.9) for m in range(4)], family="backpressure", vertex="keyed", job="j2")
    events = step({}, *together(bottleneck, neighbour, other_job), RULES, SETTINGS)
    j1 = [(e["event"], e["vertex_id"], e["updated_at"] // MIN) for e in events if e["job_id"] == "j1"]
    # The neighbour slows while the bottleneck's incident is open: its symptom, not an incident;
    # once that incident resolves, what still holds is an incident of its own.
    assert j1 == [("opened", "enrich", 1), ("updated", "enrich", 3), ("resolved", "enrich", 15),
                  ("opened", "keyed", 15)]
    updated = next(e for e in events if e["event"] == "updated")
    (symptom,) = updated["symptoms"]
    assert symptom["family"] == "backpressure" and symptom["first_at"] == 3 * MIN
    assert (symptom["evidence"]["vertex_id"], symptom["evidence"]["vertex_name"]) == ("keyed", "Window")
    assert updated["summary"].endswith("(and Window slowed too)")
    assert [(e["event"], e["vertex_id"]) for e in events if e["job_id"] == "j2"] == [("opened", "keyed")]  # per job
    for event in events:
        assert INCIDENT.errors(event) == []


def test_operator_knowledge_per_job_overrides_the_defaults():
    young_growth = {"job_age_s": [60.0, 120.0, 240.0, 300.0], "job_age_checkpoints": 20, "vertex_state_deceleration": 1.0,
                    "vertex_state_over_plateau": None,
                    "vertex_state_size_bytes": 1e6, "vertex_state_rel_slope_per_h": 20.0,
                    "vertex_state_growth_low_per_h": 19.0, "vertex_state_growth_opening_low_per_h": 18.0,
                    "vertex_state_recent_growth_low_per_h": 18.0}
    guarded = {**RULES, "state_leak": PostRule(0.5, 1, 1, warmup_guard=True)}
    rows, scores = rows_and_scores([(m, 0.9) for m in range(4)], **young_growth)
    # The default 180 s horizon: growth past it is a leak.
    assert [e["updated_at"] // MIN for e in step({}, rows, scores, guarded, SETTINGS)] == [2]
    sessions = policy.JobOverride("ord*", warmup_horizon_s=3600.0)
    assert step({}, rows, scores, guarded, SETTINGS.with_overrides([sessions])) == []
    # A configured limit the growth reaches within the horizon: a leak at once, with its forecast.
    limited = SETTINGS.with_overrides([policy.JobOverride("orders", warmup_horizon_s=3600.0, state_limit_bytes=2_000_000)])
    opened = step({}, rows, scores, guarded, limited)[0]
    assert (opened["event"], opened["updated_at"]) == ("opened", 0)
    # Its band comes from the growth test's bounds: these rows have the lower one only (open above, unknown below).
    assert opened["forecast"] == {"metric": "state_size_bytes", "limit_source": "config", "limit": 2_000_000,
                                  "eta_ms": 180_000, "eta_low_ms": None, "eta_high_ms": None, "fitted_over_ms": None,
                                  "method": "linear_trend"}
    # The first override that matches wins; a muted family opens nothing.
    muted = SETTINGS.with_overrides([policy.JobOverride("orders", mute=("state_leak",)),
                                     policy.JobOverride("*", warmup_horizon_s=1.0)])
    assert step({}, rows, scores, guarded, muted) == []
    assert muted.for_job("orders").warmup_horizon_s == SETTINGS.warmup_horizon_s
    assert muted.for_job("payments").warmup_horizon_s == 1.0


def test_a_job_back_after_the_idle_timeout_starts_afresh_unless_an_incident_is_open():
    """A job silent past the idle timeout (30 minutes) keeps no score history into its new run,
    as its features start afresh; judged on its own event time, whatever other jobs the batch holds."""
    state: dict = {}
    quiet_rows, quiet_scores = rows_and_scores([(0, 0.9)], job="quiet")
    step(state, quiet_rows, quiet_scores, RULES, SETTINGS)
    leaky_rows, leaky_scores = rows_and_scores([(0, 0.9), (1, 0.9)], job="leaky")
    step(state, leaky_rows, leaky_scores, RULES, SETTINGS)
    other_rows, other_scores = rows_and_scores([(45, 0.1)], job="other")
    step(state, other_rows, other_scores, RULES, SETTINGS)  # another job far on: nobody is forgotten for it
    assert sorted(state) == ["c/leaky", "c/other", "c/quiet"]
    # The quiet job's one high score would make two of three with a new one, within the idle timeout...
    soon = copy.deepcopy(state)
    assert [e["event"] for e in step(soon, *rows_and_scores([(20, 0.9)], job="quiet"), RULES, SETTINGS)] == ["opened"]
    # ...but 45 minutes on, it is a new run: its first high score alone opens nothing.
    assert step(state, *rows_and_scores([(45, 0.9)], job="quiet"), RULES, SETTINGS) == []
    assert state["c/quiet"]["state_leak/v1"]["scores"] == [0.9]
    # The leaky job's open incident survives the silence with its scores (two of the last three
    # are still high at minute 45), and its rows resolve it in time.
    later = step(state, *rows_and_scores([(45, 0.1), (46, 0.1), (57, 0.1)], job="leaky"), RULES, SETTINGS)
    assert [(e["event"], e["updated_at"] // MIN) for e in later] == [("resolved", 57)]


def test_runs_are_judged_by_family_place_and_time_and_a_symptom_counts_as_found():
    from pipelines.incidents.comparison import compare

    truth = {"cluster": "c", "job_id": "j1", "job_name": "orders", "run_id": "bp-run", "faults": [
        {"family": "backpressure", "onset_ts": 10 * MIN, "vertex_id": "v1", "vertex_name": "enrich"},
        {"family": "checkpoint_failure", "onset_ts": 15 * MIN, "vertex_id": None, "vertex_name": None}]}
    healthy = {"cluster": "c", "job_id": "j2", "job_name": "quiet", "faults": []}
    rows, scores = together(
        rows_and_scores([(m, 0.9 if m >= 11 else 0.1) for m in range(20)], family="backpressure"),
        # Failures from minute 13, before the labelled first failure: an early warning, not a false one.
        rows_and_scores([(m, 0.9 if m >= 13 else 0.1) for m in range(20)], family="checkpoint_failure", vertex=None),
        rows_and_scores([(m, 0.9 if 2 <= m < 4 else 0.1) for m in range(20)], family="skew", job="j2"))
    comparison = compare([truth, healthy], step({}, rows, scores, RULES, SETTINGS))
    run, quiet = comparison.runs
    assert [(f["family"], f["delay_s"], f["localised"], f["as_symptom"]) for f in run.found] == [
        ("backpressure", 120.0, True, False), ("checkpoint_failure", -60.0, True, True)]
    assert run.missed == [] and run.false == [] and run.false_families == [] and run.ok
    assert [i["family"] for i in quiet.false] == ["skew"] and not quiet.ok
    m = comparison.metrics()
    assert (m["faults"], m["faults_found"], m["false_incidents_on_healthy"], m["healthy_runs"]) == (2, 2, 1, 1)
    assert comparison.metrics("backpressure")["delay_s_median"] == 120.0
    # On another vertex it is found, but not localised.
    elsewhere = [dict(truth, faults=[{**truth["faults"][0], "vertex_id": "v9"}])]
    (moved,) = compare(elsewhere, step({}, rows, scores, RULES, SETTINGS)).runs
    assert moved.found[0]["localised"] is False and not moved.ok


# A job's feature rows do not arrive in event-time order: checkpoint rows carry the JobManager's
# clock, status rows the collector's, and a row up to features.lateness_s behind the job's latest
# is still used. An incident's times must stay ordered anyway (Alertmanager refuses an alert that
# ends before it starts).
SEC = 1000


def assert_incident_times_ordered(events: list[dict]) -> None:
    last_update: dict[str, int] = {}
    for event in events:
        assert event["updated_at"] >= event["opened_at"], event
        if event["event"] == "resolved":
            assert event["resolved_at"] == event["updated_at"], event
        assert event["updated_at"] >= last_update.get(event["incident_id"], event["opened_at"]), event
        last_update[event["incident_id"]] = event["updated_at"]


@pytest.mark.parametrize("scored", [True, False], ids=["scored-status-row", "unscored-status-row"])
def test_a_job_ending_at_a_status_behind_the_opening_checkpoint_resolves_no_earlier_than_it_opened(scored):
    state: dict = {}
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9)])
    (opened,) = step(state, rows, scores, RULES, SETTINGS)
    assert opened["opened_at"] == 60 * SEC
    # The collector's FAILED status, stamped 5 s before the checkpoint that opened the incident (the
    # JobManager's clock ahead), arrives in the next micro-batch: within the allowed lateness.
    ended, ended_scores = rows_and_scores([(0, 0.1)], ts=55 * SEC, job_state="FAILED")
    (resolved,) = step(state, ended, ended_scores if scored else ended_scores.iloc[0:0], RULES, SETTINGS)
    assert resolved["event"] == "resolved" and resolved["incident_id"] == opened["incident_id"]
    assert resolved["resolved_at"] == resolved["updated_at"] == opened["opened_at"]
    assert INCIDENT.errors(resolved) == []


def test_a_job_ending_in_the_batch_it_opened_in_resolves_no_earlier_than_it_opened():
    # One micro-batch: the FAILED status (collector's clock) sorts before the checkpoint that opens.
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9), (0, 0.1)], ts=[0, 60 * SEC, 55 * SEC],
                                   job_state=["RUNNING", "RUNNING", "FAILED"])
    events = step({}, rows, scores.iloc[:2], RULES, SETTINGS)
    assert [e["event"] for e in events] == ["opened", "resolved"]
    assert_incident_times_ordered(events)


def test_a_late_row_that_raises_the_severity_updates_no_earlier_than_the_last_event():
    state: dict = {}
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9)], family="checkpoint_failure", vertex=None,
                                   checkpoint_failed_fraction=0.4)
    (opened,) = step(state, rows, scores, RULES, SETTINGS)
    assert opened["severity"] == "warning"
    late, late_scores = rows_and_scores([(0, 0.9)], family="checkpoint_failure", vertex=None, ts=58 * SEC,
                                        checkpoint_failed_fraction=0.6)
    (updated,) = step(state, late, late_scores, RULES, SETTINGS)
    assert (updated["event"], updated["severity"]) == ("updated", "critical")
    assert updated["updated_at"] == opened["opened_at"]


@pytest.mark.parametrize("seed", range(40))
def test_incident_times_stay_ordered_over_a_replay_of_rows_out_of_order(seed):
    """A job's rows with arrival jitter within the allowed lateness, a leak and a failure family,
    cut into micro-batches anywhere, the job failing at the end: every incident event has
    opened_at <= updated_at (= resolved_at), and an incident's updates never go back in time."""
    import random

    rng = random.Random(seed)
    lateness = 10 * SEC
    points = []  # (arrival, ts, family, score, failed fraction)
    for i in range(240):  # a poll every 5 s, each row up to the lateness behind its poll
        ts = i * 5 * SEC + rng.randrange(-lateness + 1, 1)
        hot = (40 <= i < 100) or (140 <= i < 180 and seed % 2)
        for family in ("state_leak", "checkpoint_failure"):
            points.append((i, ts, family, rng.choice([0.9, 0.8, 0.2]) if hot else rng.choice([0.1, 0.1, 0.7]),
                           rng.choice([0.3, 0.6])))
    points.sort(key=lambda p: (p[0], rng.random()))
    rows = pd.DataFrame([{"cluster": "c", "job_id": "j1", "job_name": "orders",
                          "vertex_id": "v1" if family == "state_leak" else None,
                          "vertex_name": "Window" if family == "state_leak" else None, "ts": ts,
                          "trigger_kind": "checkpoint", "is_late": False, "job_state": "RUNNING",
                          "last_failure_message": None, "checkpoint_failed_fraction": fraction}
                         for _, ts, family, _, fraction in points])
    rows.loc[len(rows) - 1, "job_state"] = "FAILED"
    scores = pd.DataFrame([{"row": i, "family": family, "score": score, "model_name": f"sentinel-{family}",
                            "model_version": "1", "model_alias": "champion"}
                           for i, (_, _, family, score, _) in enumerate(points)])
    cuts = sorted(rng.sample(range(1, len(rows)), 40))
    state: dict = {}
    events: list[dict] = []
    for start, end in zip([0] + cuts, cuts + [len(rows)]):
        batch = rows.iloc[start:end].reset_index(drop=True)
        in_batch = (scores["row"] >= start) & (scores["row"] < end)
        batch_scores = scores[in_batch].assign(row=lambda d: d["row"] - start)
        events += step(state, batch, batch_scores, RULES, SETTINGS)
    assert any(e["event"] == "resolved" for e in events)
    assert_incident_times_ordered(events)


def test_a_leak_that_grows_plainly_past_its_horizon_opens_on_a_wavering_score_in_any_batching():
    """A leak whose score wavers under the threshold never gives the rule its 4 of 6, but its
    growth, certain enough to open it and held for the rule's time, stands in for that with half
    the threshold; the time it has held is kept between batches."""
    guarded = {**RULES, "state_leak": PostRule(0.9, 4, 6, warmup_guard=True, confirm_after_horizon_s=45.0,
                                                growth_confirms_after_s=90.0)}
    minutes = list(range(1, 12))
    rows, scored = rows_and_scores([(m, 0.6 if m % 3 == 0 else 0.05) for m in minutes],
                                   job_age_s=[m * 60.0 for m in minutes], job_age_checkpoints=50,
                                   vertex_state_over_plateau=None, vertex_state_size_bytes=1e6,
                                   vertex_state_growth_low_per_h=2.0, vertex_state_growth_opening_low_per_h=1.5,
                                   vertex_state_recent_growth_low_per_h=1.0, vertex_state_over_prior_max=1.0,
                                   vertex_state_filling=0.0)
    assert step({}, rows, scored, {**guarded, "state_leak": PostRule(0.9, 4, 6, warmup_guard=True)}, SETTINGS) == []
    whole = step({}, rows, scored, guarded, SETTINGS)
    # Judged from minute 4 (past the 180 s horizon and its 45 s), held 90 s by minute 6.
    assert [(e["event"], e["opened_at"] // MIN) for e in whole] == [("opened", 6)]
    state: dict = {}
    one_by_one = []
    for i in range(len(minutes)):
        one_by_one += step(state, rows.iloc[[i]].reset_index(drop=True), scored.iloc[[i]].assign(row=0), guarded,
                           SETTINGS)
        if minutes[i] == 5:  # not yet: the growth since minute 4 is kept with the entity
            assert state[policy.job_key("c", "j1")]["state_leak/v1"]["growing_since"] == 4 * MIN
    assert one_by_one == whole


def test_a_leak_stays_open_while_its_state_still_grows_though_its_score_dips_and_ends_at_its_plateau():
    """A slow leak after a fast warm-up: the detector's score may fall while the state keeps
    growing; the incident ends when the growth does (the leak family's growth test), not before,
    and says it levelled off."""
    guarded = {**RULES, "state_leak": PostRule(0.5, 1, 1, warmup_guard=True)}
    minutes = list(range(4, 40))
    scores = [0.9 if m < 6 else 0.1 for m in minutes]
    # Growing 150 %/h (its lower bound), then a plateau from minute 25: no growth since its last change of pace.
    # Growth certain enough to open a leak (99.9 %) only at first: an open leak holds on the 95 % bound.
    low = [1.5 if m < 25 else 0.001 for m in minutes]
    opening_low = [1.0 if m < 6 else 0.0 for m in minutes]
    recent = [1.2 if m < 25 else -0.02 for m in minutes]
    rows, scored = rows_and_scores(list(zip(minutes, scores)), job_age_s=[m * 60.0 for m in minutes],
                                   job_age_checkpoints=50, vertex_state_over_plateau=None, vertex_state_size_bytes=1e6,
                                   vertex_state_growth_low_per_h=low, vertex_state_growth_opening_low_per_h=opening_low,
                                   vertex_state_recent_growth_low_per_h=recent)
    events = step({}, rows, scored, guarded, SETTINGS)
    assert [(e["event"], e["updated_at"] // MIN) for e in events] == [("opened", 4), ("resolved", 35)]
    assert events[-1]["resolution"] == "levelled_off"
    # A rule without the leak's guard never sustains anything: the score decides.
    assert not PostRule(0.5, 1, 1).sustains({"vertex_state_growth_low_per_h": 9.0, "vertex_state_recent_growth_low_per_h": 9.0})
    # The vertex's growth where known, else the job's; growth that stopped since its last change of pace does not hold.
    assert guarded["state_leak"].sustains({"vertex_state_growth_low_per_h": None, "state_growth_low_per_h": 0.06,
                                           "vertex_state_recent_growth_low_per_h": None, "state_recent_growth_low_per_h": 0.01})
    assert not guarded["state_leak"].sustains({"vertex_state_growth_low_per_h": 0.9, "vertex_state_recent_growth_low_per_h": -0.1})
