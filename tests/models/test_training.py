"""The retraining workflow end to end (real Spark, real MLflow store), and the gate's rules.

The gate and the calibration judged against the test run's champions are in
``test_training_against_champions.py``: those tests wait for the champions' training, these do not.
"""

from __future__ import annotations

import pytest

from models import registry
from models.training import gate, run_training, soonest_among_best
from models.validation import TrainingSetInvalid
from pipelines import simulator
from tests.conftest import config_for

GOOD = {"faults_found": 5.0, "false_incidents": 1.0, "false_families_on_faulty": 0.0}


def test_gate_promotes_no_regression_and_refuses_one():
    baseline = {"faults_found": 4.0, "false_incidents": 3.0, "false_families_on_faulty": 1.0}
    better = dict(GOOD, false_incidents=0.0)
    ok, reasons = gate("skew", better, GOOD, baseline, "real-Flink validation runs")
    assert ok and "at least as good as the champion" in reasons[-1]
    assert reasons[0].startswith("on the real-Flink validation runs: 5 faults found net")
    worse = dict(GOOD, faults_found=3.0, false_families_on_faulty=1.0)
    ok, reasons = gate("skew", worse, GOOD, baseline, "real-Flink validation runs")
    assert not ok
    assert "on the real-Flink validation runs: faults found 3 is worse than the champion's 5" in reasons
    assert any("false families on faulty runs 1 is worse than the champion's 0" in r for r in reasons)


def test_gate_requires_the_static_alarms_net_result_even_without_a_champion():
    ok, reasons = gate("skew", dict(GOOD, faults_found=1.0), None, {"faults_found": 4.0, "false_incidents": 0.0,
                                                                    "false_families_on_faulty": 0.0})
    assert not ok and "is below the static alarms' 4" in reasons[0]
    ok, reasons = gate("skew", GOOD, None, {"faults_found": 4.0, "false_incidents": 0.0, "false_families_on_faulty": 0.0})
    assert ok and reasons[-1] == "no champion yet"
    assert gate("anomaly", GOOD, None, None) == (True, ["no champion yet"])


def test_calibration_takes_the_soonest_rule_unless_a_more_conservative_one_is_as_soon():
    def candidate(key, threshold, persistence, delay):
        return ((key, threshold, persistence), f"t{threshold}p{persistence}", {"delay_s": delay}, None)

    # Equal on faults and false incidents: 226.6 s against 227.2 s is a tie the higher threshold wins ...
    tied = [candidate((7, -2), 0.3, 1, 226.6), candidate((7, -2), 0.6, 1, 227.2), candidate((7, -2), 0.9, 1, 260.0)]
    assert soonest_among_best(tied)[1] == "t0.6p1"
    # ... 30 s sooner is not, and a better key beats any delay.
    assert soonest_among_best(tied + [candidate((7, -2), 0.4, 3, 196.0)])[1] == "t0.4p3"
    assert soonest_among_best(tied + [candidate((8, -1), 0.8, 1, 400.0)])[1] == "t0.8p1"
    # Short delays tie within seconds, not within a share of a second; more persistence wins a tie too.
    short = [candidate((3, 0), 0.5, 1, 10.0), candidate((3, 0), 0.5, 3, 11.5), candidate((3, 0), 0.7, 1, 14.0)]
    assert soonest_among_best(short)[1] == "t0.5p3"
    assert soonest_among_best([candidate((0, 0), 0.3, 1, float("nan")), candidate((0, 0), 0.9, 1, float("nan"))])[1] == "t0.9p1"
    # The anomaly rule's candidates carry no delay: the best key, then the most conservative.
    novelty = [((k, t, 1), f"t{t}", {}, None) for k, t in (((0, 0.5), 0.3), ((0, 0.5), 0.9), ((-1, 0.9), 0.95))]
    assert soonest_among_best(novelty)[1] == "t0.9"


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("dataset")
    names = list(simulator.CATALOGUE)
    simulator.write_dataset(root / "sim", names, jobs_per_scenario=3, seed=21, duration_ms=20 * 60_000)
    return root / "sim"


def test_training_registers_every_family_and_moves_aliases_through_the_gate(spark, small_dataset, tmp_path):
    import mlflow

    config = config_for(tmp_path)
    grid = {"learning_rate": (0.1,), "max_depth": (4,)}
    lines: list[str] = []
    outcomes = run_training(spark, config, [small_dataset], grid=grid, progress=lines.append)
    assert any(line.startswith("training set validation:") for line in lines)  # progress is shown
    assert [o.family for o in outcomes] == ["state_leak", "backpressure", "skew", "checkpoint_failure", "anomaly"]
    for outcome in outcomes:
        assert registry.alias_version(outcome.registered_name, registry.CHALLENGER) == outcome.version
        if outcome.promoted:
            loaded = registry.load_detector(outcome.registered_name, config.mlflow.alias)
            assert loaded.version == outcome.version and loaded.post_rule is not None
    skew = next(o for o in outcomes if o.family == "skew")
    # No lab runs in this dataset: the gate judged the simulated validation runs.
    assert skew.promoted and any(r.startswith("on the validation runs") for r in skew.reasons)
    assert skew.metrics["faults_found"] == skew.metrics["faults"] > 0 and skew.metrics["f1"] > 0.5
    assert any(line.startswith("test runs, every family together:") for line in lines)

    # The same training again, as a dry run (one family is enough: each family's training is the
    # same code): exactly as good, since the gate compares on the same runs, and it would promote
    # ("at least as good" includes as good), but it registers nothing and moves no alias.
    (again,) = run_training(spark, config, [small_dataset], families=["skew"], dry_run=True, grid=grid,
                            progress=lines.append)
    assert again.champion_version == skew.version
    assert again.champion == pytest.approx(skew.challenger_gate, nan_ok=True)
    assert again.version is None and not again.promoted and again.reasons[-1].endswith("(would promote)")
    registry.use_config(config)
    assert registry.alias_version(skew.registered_name, registry.CHALLENGER) == skew.version
    assert registry.alias_version(skew.registered_name, config.mlflow.alias) == skew.version
    assert len(mlflow.MlflowClient().search_model_versions(f"name='{skew.registered_name}'")) == 1


def test_a_broken_dataset_stops_before_anything_is_registered(spark, tmp_path):
    simulator.write_dataset(tmp_path / "healthy", ["healthy_steady"], jobs_per_scenario=3, seed=2,
                            duration_ms=10 * 60_000)
    config = config_for(tmp_path)
    with pytest.raises(TrainingSetInvalid, match="expect_column_distinct_values_to_contain_set"):
        run_training(spark, config, [tmp_path / "healthy"], progress=lambda _: None)
    registry.use_config(config)
    assert registry.alias_version(config.mlflow.models.skew, registry.CHALLENGER) is None
