"""The retraining workflow against the test run's champions (tests/champions.py): the gate on the
real-Flink corpus, and the anomaly rule calibrated beside the models it runs with."""

from __future__ import annotations

import re

from models import registry
from models.training import run_training
from tests.conftest import LAB_CORPUS


def test_the_gate_refuses_a_challenger_that_regresses_on_real_flink_runs(spark, trained_store):
    """A dry run against the session's champions: a skew detector that sees only the job's age and
    checkpoint interval, judged on the lab's validation runs as the job would run it, is worse than
    the champion on faults found, false incidents or false families, and the gate says which.
    (Trained on the real-Flink corpus alone: the gate judges its runs whatever else is trained on.
    Not backpressure: a blind backpressure model, behind its evidence guard (upstream
    backpressure), tied its champion on those runs: 4 of 4 faults, no more false incidents or
    families.)"""
    blind = {"features": (("job_age_checkpoints", "checkpoint_interval_ms"),)}
    registry.use_config(trained_store)
    challenger_before = registry.alias_version(trained_store.mlflow.models.skew, registry.CHALLENGER)
    lines: list[str] = []
    (outcome,) = run_training(spark, trained_store, [LAB_CORPUS], families=["skew"], grid=blind,
                              dry_run=True, progress=lines.append)
    assert not outcome.promoted and outcome.version is None
    new, old = outcome.challenger_gate, outcome.champion
    worse = {label for metric, label, sign in (("faults_found", "faults found", -1),
                                               ("false_incidents", "false incidents", 1),
                                               ("false_families_on_faulty", "false families on faulty runs", 1))
             if sign * (new[metric] - old[metric]) > 0}
    assert worse, (dict(new), dict(old))
    said = {m.group(1) for r in outcome.reasons
            if (m := re.match(r"on the real-Flink validation runs: (.+) \d+ is worse than the champion's", r))}
    assert said == worse, outcome.reasons
    registry.use_config(trained_store)  # a dry run registers nothing and moves no alias
    assert registry.alias_version(trained_store.mlflow.models.skew, registry.CHALLENGER) == challenger_before


def test_the_anomaly_rule_is_calibrated_beside_the_models_it_runs_with(spark, trained_store):
    """Judged alone, an anomaly on a faulty run is excused as if the policy always folded it into
    its cause; beside the supervised champions (as the job and the gate run it) one that opens
    before its cause is a false family. The calibration counts what the gate counts."""
    from models.evaluation import judge
    from models.training import calibrate_for_incidents, champions, load_splits
    from pipelines.families import ANOMALY
    from pipelines.incidents.policy import PolicySettings

    validation = load_splits(spark, trained_store, [LAB_CORPUS], lambda _: None)["validation"]
    settings = PolicySettings.from_config(trained_store)
    held = champions(trained_store, ["state_leak", "backpressure", "skew", "checkpoint_failure", ANOMALY])
    anomaly = held.pop(ANOMALY)
    alone_rule, alone = calibrate_for_incidents(ANOMALY, anomaly.detector, validation, settings)
    rule, beside = calibrate_for_incidents(ANOMALY, anomaly.detector, validation, settings, others=held)

    def gate_count(r):
        model = registry.LoadedDetector("a", "1", "c", anomaly.detector, r, {})
        return judge(validation, {**held, ANOMALY: model}, settings).metrics(ANOMALY)["false_incidents"]

    counted, counted_alone = gate_count(rule), gate_count(alone_rule)
    assert beside["false_incidents"] == counted  # what the gate will count, not a lower bound
    assert alone["false_incidents"] <= counted_alone  # alone, the excuse can only hide anomalies
    assert counted <= counted_alone  # the rule calibrated alone was a candidate too
