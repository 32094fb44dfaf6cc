"""The family registry: each family declared once, and what lists families reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from feature_store.definitions import FEATURES
from pipelines.config import ConfigError, load_config
from pipelines.families import (ALERTNAMES, ANOMALY, BACKPRESSURE, BY_NAME, CHECKPOINT_FAILURE, EVALUATION_ORDER,
                                EXPLAINED_BY, FAMILIES, REGISTRY, SKEW, STATE_LEAK)

ROOT = Path(__file__).resolve().parents[3]


def test_names_alertnames_and_model_names_are_unique():
    for field in ("name", "label", "alertname", "model_name"):
        values = [getattr(f, field) for f in REGISTRY]
        assert len(set(values)) == len(values), field


def test_every_cause_a_family_names_is_a_family_and_same_vertex_causes_are_causes():
    for family in REGISTRY:
        assert set(family.explained_by) <= set(FAMILIES) - {family.name}
        assert set(family.same_vertex_causes) <= set(family.explained_by)
        assert not family.one_per_job or family.localised  # one per job: its vertices join it


def test_the_policy_judges_causes_before_their_symptoms():
    assert EVALUATION_ORDER == (STATE_LEAK, SKEW, BACKPRESSURE, CHECKPOINT_FAILURE, ANOMALY)
    for family, causes in EXPLAINED_BY.items():
        assert all(EVALUATION_ORDER.index(cause) < EVALUATION_ORDER.index(family) for cause in causes)
    assert EXPLAINED_BY[ANOMALY] == (STATE_LEAK, BACKPRESSURE, SKEW, CHECKPOINT_FAILURE)


def test_each_decisive_plot_is_a_declared_feature():
    names = {f.name for f in FEATURES}
    assert {f.decisive_plot.column for f in REGISTRY if f.decisive_plot} <= names


def test_the_config_has_a_model_name_per_family_and_mutes_only_families(tmp_path):
    config = load_config(environ={}, base_dir=tmp_path)
    assert config.mlflow.models.model_dump() == {f.name: f.model_name for f in REGISTRY}
    muted = load_config(environ={"SENTINEL_DETECTION__JOB_OVERRIDES": "[{job_name: 'a-*', mute: [skew]}]"},
                        base_dir=tmp_path)
    assert muted.detection.job_overrides[0].mute == ["skew"]
    with pytest.raises(ConfigError) as refused:
        load_config(environ={"SENTINEL_DETECTION__JOB_OVERRIDES": "[{job_name: 'a-*', mute: [gc_pause]}]"},
                    base_dir=tmp_path)
    assert "mute" in str(refused.value) and "state_leak" in str(refused.value)


def test_the_cli_offers_the_families_to_train():
    from pipelines.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["train", "--family", "skew", "--family", ANOMALY]).family == ["skew", ANOMALY]
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--family", "gc_pause"])


def test_incidents_carry_the_registry_s_alertname_and_runbook():
    from pipelines.incidents import evidence

    row = {"ts": 0, "checkpointed_rel_slope_per_h": 0.5, "state_rel_slope_per_h": 0.5}
    for family in REGISTRY:
        assert evidence.runbook(family.name, row) == list(family.runbook)
    assert ALERTNAMES[CHECKPOINT_FAILURE] == BY_NAME[CHECKPOINT_FAILURE].alertname == "FlinkCheckpointFailure"


def test_what_operators_route_on_lists_every_alertname():
    """Alertmanager routes on the alertname: the docs and the example Alertmanager config say which
    there are, and a family added to the registry must show up in both."""
    for path in ("docs/OPERATIONS.md", "infra/alertmanager/alertmanager.yml"):
        text = " ".join((ROOT / path).read_text().split())
        assert [f.alertname for f in REGISTRY if f.alertname not in text] == [], path
