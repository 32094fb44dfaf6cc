"""The retraining workflow end to end (real Spark, real MLflow store), and the gate's rules."""

from __future__ import annotations

import math

import pytest

from models import registry
from models.training import gate, run_training
from models.validation import TrainingSetInvalid
from pipelines import simulator
from tests.conftest import config_for

GOOD = {"f1": 0.8, "fault_recall": 1.0, "false_incidents_per_job_day": 2.0, "delay_s_median": 120.0}


def test_gate_promotes_a_better_model_and_refuses_a_worse_one():
    baseline = {"f1": 0.3}
    better = dict(GOOD, false_incidents_per_job_day=1.0, delay_s_median=90.0)
    ok, reasons = gate(better, GOOD, baseline)
    assert ok and "at least as good as the champion" in reasons[-1]
    worse = dict(GOOD, fault_recall=0.75, delay_s_median=300.0)
    ok, reasons = gate(worse, GOOD, baseline)
    assert not ok
    assert any("fault_recall 0.750 is worse than the champion's 1.000" in r for r in reasons)
    assert any("delay_s_median 300.000 is worse" in r for r in reasons)


def test_gate_requires_beating_the_static_baseline_even_without_a_champion():
    ok, reasons = gate(dict(GOOD, f1=0.2), None, {"f1": 0.3})
    assert not ok and "does not beat the static baseline" in reasons[0]
    ok, reasons = gate(GOOD, None, {"f1": 0.3})
    assert ok and reasons[-1] == "no champion yet"
    # A champion that never caught anything: a candidate that does catch is not "worse" on delay.
    never = dict(GOOD, fault_recall=0.0, delay_s_median=math.nan)
    assert gate(GOOD, never, None)[0]
    assert not gate(never, GOOD, None)[0]


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("dataset")
    names = list(simulator.CATALOGUE)
    simulator.write_dataset(root / "sim", names, jobs_per_scenario=3, seed=21, duration_ms=20 * 60_000)
    return root / "sim"


def test_training_registers_every_family_and_moves_aliases_through_the_gate(spark, small_dataset, tmp_path):
    config = config_for(tmp_path)
    grid = {"learning_rate": (0.1,), "max_depth": (4,)}
    lines: list[str] = []
    dry = run_training(spark, config, [small_dataset], dry_run=True, grid=grid, progress=lines.append)
    assert all(o.version is None and not o.promoted for o in dry)
    assert any(line.startswith("training set validation:") for line in lines)  # progress is shown
    registry.use_config(config)
    assert registry.alias_version(config.mlflow.models.skew, registry.CHALLENGER) is None  # dry run moved nothing

    outcomes = run_training(spark, config, [small_dataset], grid=grid, progress=lines.append)
    assert [o.family for o in outcomes] == ["state_leak", "backpressure", "skew", "checkpoint_failure", "anomaly"]
    for outcome in outcomes:
        assert registry.alias_version(outcome.registered_name, registry.CHALLENGER) == outcome.version
        if outcome.promoted:
            loaded = registry.load_detector(outcome.registered_name, config.mlflow.alias)
            assert loaded.version == outcome.version and loaded.post_rule is not None
    skew = next(o for o in outcomes if o.family == "skew")
    assert skew.promoted and skew.metrics["f1"] > skew.baseline["f1"]

    # The same training again is exactly as good: the gate compares on the same test rows.
    again = run_training(spark, config, [small_dataset], families=["skew"], grid=grid, progress=lines.append)
    assert again[0].champion_version == skew.version
    assert again[0].champion == pytest.approx(skew.metrics, nan_ok=True)
    assert again[0].promoted  # "at least as good" includes as good
    champion = registry.alias_version(skew.registered_name, config.mlflow.alias)

    # A deliberately worse model (it sees only the job's age and interval) is registered as the
    # challenger, and the gate keeps the champion, saying why.
    blind = {"features": (("job_age_checkpoints", "checkpoint_interval_ms"),)}
    worse = run_training(spark, config, [small_dataset], families=["skew"], grid=blind, progress=lines.append)[0]
    assert not worse.promoted and worse.version != champion
    assert registry.alias_version(skew.registered_name, config.mlflow.alias) == champion
    assert registry.alias_version(skew.registered_name, registry.CHALLENGER) == worse.version
    assert any("worse than the champion" in r or "does not beat the static baseline" in r for r in worse.reasons)


def test_a_broken_dataset_stops_before_anything_is_registered(spark, tmp_path):
    simulator.write_dataset(tmp_path / "healthy", ["healthy_steady"], jobs_per_scenario=3, seed=2,
                            duration_ms=10 * 60_000)
    config = config_for(tmp_path)
    with pytest.raises(TrainingSetInvalid, match="expect_column_distinct_values_to_contain_set"):
        run_training(spark, config, [tmp_path / "healthy"], progress=lambda _: None)
    registry.use_config(config)
    assert registry.alias_version(config.mlflow.models.skew, registry.CHALLENGER) is None
