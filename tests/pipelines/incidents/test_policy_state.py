"""The incident policy's stored state (:mod:`pipelines.incidents.policy_state`): states stored
mid-incident by the code before the state was typed (``tests/fixtures/policy_state``, made by its
``make_fixture.py`` with the code of that time) resume to the same events and are stored again as
that code stored them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import orjson
import pandas as pd
import pytest

from models.post_rule import PostRule
from pipelines.families import FAMILIES
from pipelines.incidents.policy import PolicySettings, step

FIXTURE = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "policy_state" / "resumed_states.json")
                     .read_text())
SCENARIOS = FIXTURE["scenarios"]


def as_stored(value):
    """``value`` as the state store and the incidents topic keep it: JSON."""
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))


def without_unset(stored):
    """A stored state less the optional keys its writer set to null (``lower_since``): an unset
    optional key is read the same, absent or null, by this code and the code before it."""
    if isinstance(stored, dict):
        return {k: without_unset(v) for k, v in stored.items() if not (k == "lower_since" and v is None)}
    if isinstance(stored, list):
        return [without_unset(v) for v in stored]
    return stored


def with_todays_methods(stored):
    """The code before's events (and the last event a state keeps) as today's name their
    forecasts: the timeout forecasts became ``checkpoint_cadence`` (a method of the rows they are
    read from, not of the stored state)."""
    if isinstance(stored, list):
        return [with_todays_methods(v) for v in stored]
    if not isinstance(stored, dict):
        return stored
    renamed = {k: with_todays_methods(v) for k, v in stored.items()}
    if renamed.get("metric") in ("checkpoint_duration_ms", "checkpoint_barrier_wait_ms") and "method" in renamed:
        renamed["method"] = "checkpoint_cadence"
    return renamed


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_state_stored_by_the_code_before_resumes_to_the_same_events(name):
    scenario = SCENARIOS[name]
    rules = {family: PostRule(**scenario["rules"]) for family in FAMILIES}
    settings = PolicySettings(**scenario["settings"])
    state = copy.deepcopy(scenario["stored_state"])
    events = step(state, pd.DataFrame(scenario["after"]["rows"]), pd.DataFrame(scenario["after"]["scores"]), rules,
                  settings)
    assert as_stored(events) == with_todays_methods(scenario["events_after"])
    assert without_unset(as_stored(state)) == without_unset(with_todays_methods(scenario["state_after"]))


def test_the_fixture_holds_what_a_resumed_state_must_carry():
    """Each part of an entity's state is stored mid-incident in some scenario, so each is read back."""
    open_keys, entity_keys = set(), set()
    for scenario in SCENARIOS.values():
        for job in scenario["stored_state"].values():
            for entity in (v for v in job.values() if isinstance(v, dict)):
                entity_keys |= entity.keys()
                open_keys |= (entity["open"] or {}).keys()
    assert {"held", "predicting_since", "open", "recent", "scores"} <= entity_keys
    assert {"symptoms", "predicted", "warned_at", "first_failure_at", "failure_told", "lower_since",
            "summary_base", "last_event"} <= open_keys
