"""How often an open incident is updated (docs/CONTRACTS.md, "How often an open incident is
updated"): a forecast that keeps moving updates it at most once every
``min_update_interval_s``; a severity change is published at once."""

from __future__ import annotations

import pytest

from models.post_rule import PostRule
from pipelines.families import FAMILIES
from pipelines.incidents.policy import PolicySettings, step
from tests.helpers.incidents import rows_and_scores

MIN = 60_000
RULES = {f: PostRule(0.5, 2, 3) for f in FAMILIES}


def _leak(etas_s: list[float], settings: PolicySettings) -> list[dict]:
    """A critical leak for len(etas_s) minutes whose forecast says these ETAs, minute by minute."""
    rows, scores = rows_and_scores([(m, 0.9) for m in range(len(etas_s))], limit_eta_s=etas_s, limit_ratio=0.5,
                                   vertex_state_size_bytes=100.0)
    return step({}, rows, scores, RULES, settings)


def test_a_forecast_that_keeps_moving_updates_at_most_once_per_interval():
    # A noisy forecast: each minute's ETA is twice or half the last one, far beyond 25 % and 5 min.
    etas = [3000.0 if m % 2 == 0 else 1500.0 for m in range(30)]
    events = _leak(etas, PolicySettings(critical_eta_s=3600))
    assert events[0]["event"] == "opened" and {e["severity"] for e in events} == {"critical"}
    updated = [e["updated_at"] for e in events if e["event"] == "updated"]
    assert len(updated) >= 3  # the forecast is still published as it moves
    assert all(b - a >= 5 * MIN for a, b in zip([events[0]["updated_at"], *updated], updated)), updated

    # Without the interval, the same forecast updates it every minute: the interval is what bounds it.
    every = _leak(etas, PolicySettings(critical_eta_s=3600, min_update_interval_ms=0))
    assert sum(e["event"] == "updated" for e in every) > 2 * len(updated)


def test_a_severity_change_is_published_within_the_interval():
    # Opened as a warning (the limit in 5.5 h), critical a minute later (in 20 min): at once.
    etas = [20_000.0, 19_940.0, 1_200.0, 1_140.0, 1_080.0]
    events = _leak(etas, PolicySettings(critical_eta_s=3600))
    assert [(e["event"], e["severity"], e["updated_at"] // MIN) for e in events][:2] == [
        ("opened", "warning", events[0]["updated_at"] // MIN), ("updated", "critical", 2)]
    assert events[1]["updated_at"] - events[0]["updated_at"] < 5 * MIN


def test_near_its_end_a_forecast_needs_an_absolute_move_too():
    # A leak's ETA shrinking with time, 2.5 min either side of its trend in turn: a move by more than
    # a quarter of what is left as the end nears, but never by eta_change_min_s (5 min).
    etas = [1000.0 - 60 * m + (150 if m % 2 else -150) for m in range(12)]
    assert [e["event"] for e in _leak(etas, PolicySettings(critical_eta_s=3600, min_update_interval_ms=0))] == ["opened"]
    moved = _leak(etas, PolicySettings(critical_eta_s=3600, min_update_interval_ms=0, eta_change_min_ms=60_000))
    assert [e["event"] for e in moved].count("updated") >= 5


def test_a_leak_already_at_its_limit_is_not_updated_while_its_forecast_stays_there():
    """The demo's kinesis-percentiles-012 leak: at its limit (ETA 0) for 30 min, it was updated
    every min_update_interval_s with only evidence.ts new (the old ETA minus the time passed went
    below 0, and 0 read as a move). A forecast that leaves the limit is still told."""
    events = _leak([0.0] * 31, PolicySettings(critical_eta_s=3600))
    assert [e["event"] for e in events] == ["opened"]
    receded = _leak([0.0] * 11 + [1800.0] * 10, PolicySettings(critical_eta_s=3600))
    assert [e["event"] for e in receded].count("updated") >= 1
