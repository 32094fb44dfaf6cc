"""Predicted checkpoint failures: an incident that opens on a credible timeout forecast, before any
checkpoint fails, says when the failure came, and resolves if the forecast recedes."""

from __future__ import annotations

import pandas as pd

from models.post_rule import PostRule
from pipelines.contracts import INCIDENT
from pipelines.families import FAMILIES
from pipelines.incidents.policy import FORECAST_RECEDED, PolicySettings, step
from tests.helpers.incidents import rows_and_scores

MIN = 60_000
RULES = {f: PostRule(0.5, 2, 3) for f in FAMILIES}
SETTINGS = PolicySettings(resolve_after_ms=2 * MIN, critical_eta_s=3600)
STEP_S = 10


def _build_up(n: int, failing_from: int | None = None, receding_from: int | None = None, score: float = 0.1):
    """Job rows every 10 s of checkpoints taking ever more of a 3 s timeout, the forecast's band
    within the horizon; failing from row ``failing_from`` (score 0.9 there), the forecast gone
    from row ``receding_from``."""
    points, over, high, eta, failed = [], [], [], [], []
    for i in range(n):
        failing = failing_from is not None and i >= failing_from
        receding = receding_from is not None and i >= receding_from
        points.append((i * STEP_S / 60, 0.9 if failing else score))
        over.append(min(1.0, 0.55 + 0.02 * i))
        eta.append(None if receding else max(0.0, 240.0 - STEP_S * i))
        high.append(None if receding else max(0.0, 360.0 - STEP_S * i))
        failed.append(0.25 if failing else 0.0)
    return rows_and_scores(points, family="checkpoint_failure", vertex=None, checkpoint_timeout_ms=3000.0,
                           checkpoint_duration_over_timeout=over, checkpoint_timeout_eta_s=eta,
                           checkpoint_timeout_eta_low_s=[None if e is None else e * 0.75 for e in eta],
                           checkpoint_timeout_eta_high_s=high, checkpoint_duration_fitted_over_s=300.0,
                           checkpoint_failed_fraction=failed)


def _brief(events):
    return [(e["event"], e["family"], e["updated_at"] // 1000, e.get("predicted"), e.get("first_failure_at"),
             e.get("lead_time_ms"), e.get("resolution")) for e in events]


def test_a_sustained_credible_forecast_opens_a_predicted_incident_that_records_the_failure_and_its_lead_time():
    rows, scores = _build_up(20, failing_from=15)
    events = step({}, rows, scores, RULES, SETTINGS)
    # 30 s of predicting rows (0, 10, 20, 30 s) before it opens; the failure at 150 s is told as
    # soon as the family's rule holds (2 of 3 scores here: the next row), with when it came.
    assert _brief(events) == [("opened", "checkpoint_failure", 30, True, None, None, None),
                              ("updated", "checkpoint_failure", 160, True, 150_000, 120_000, None)]
    opened = events[0]
    assert opened["severity"] == "warning"
    assert opened["summary"].startswith("[warning] checkpoint failure predicted in orders: none has failed yet; "
                                        "the latest took 61% of the timeout; checkpoints will exceed their 3s timeout "
                                        "in ~4 min (3 min-6 min)")
    assert [f["metric"] for f in opened["forecasts"]] == ["checkpoint_duration_ms"]
    assert "predicted" not in events[1]["summary"]  # a checkpoint failure now, in its own words
    for event in events:
        assert INCIDENT.errors(event) == []


def test_a_forecast_that_recedes_resolves_the_predicted_incident_and_a_blip_opens_none():
    rows, scores = _build_up(40, receding_from=6)
    events = step({}, rows, scores, RULES, SETTINGS)
    assert _brief(events) == [("opened", "checkpoint_failure", 30, True, None, None, None),
                              # clear from 60 s, resolved two minutes (resolve_after) later
                              ("resolved", "checkpoint_failure", 180, True, None, None, FORECAST_RECEDED)]
    assert INCIDENT.errors(events[-1]) == []
    blip_rows, blip_scores = _build_up(40, receding_from=3)  # 20 s of it: not sustained
    assert step({}, blip_rows, blip_scores, RULES, SETTINGS) == []


def test_predictions_are_the_same_in_any_batching():
    rows, scores = _build_up(20, failing_from=15)
    whole = step({}, rows, scores, RULES, SETTINGS)
    state: dict = {}
    one_by_one = []
    for i in range(len(rows)):
        part = rows.iloc[[i]].reset_index(drop=True)
        one_by_one += step(state, part, scores.iloc[[i]].assign(row=0).reset_index(drop=True), RULES, SETTINGS)
    assert one_by_one == whole


def test_no_prediction_while_a_cause_is_open_or_when_predictions_are_off():
    leak_rows, leak_scores = rows_and_scores([(i * STEP_S / 60, 0.9) for i in range(20)])
    rows, scores = _build_up(20)
    both = pd.concat([leak_rows, rows], ignore_index=True)
    both_scores = pd.concat([leak_scores, scores.assign(row=scores["row"] + len(leak_rows))], ignore_index=True)
    events = step({}, both, both_scores, RULES, SETTINGS)
    assert {e["family"] for e in events} == {"state_leak"}
    assert step({}, rows, scores, RULES, SETTINGS.without_predictions()) == []
