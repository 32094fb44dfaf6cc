"""`sentinel feedback` and `sentinel train --feedback`: on-call's verdicts become labels.

The incidents are the session champions' on committed lab runs (``lab_replay``), on the incident
topic of the session broker; the live job's feature log is written from the replay's feature rows
by the job's own writer, where the job writes it.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from models.feedback import CONFIRMED, FALSE_POSITIVE, LOOKBACK_MS, SOURCE, latest_verdicts, regressed
from models.training import run_training
from pipelines.contracts import FEEDBACK
from feature_store.offline_store import append_feature_log
from pipelines.families import BACKPRESSURE, SKEW, STATE_LEAK
from pipelines.feedback import give, load_fleet_feedback
from pipelines.io import kafka_clients
from tests.conftest import LAB_CORPUS, LAB_LEAK_RUN, LAB_SKEW_RUN, TRAINING_GRID, first_opened
from tests.helpers.cli import run_sentinel
from tests.helpers.topics import publish_incidents


@pytest.fixture
def fleet(lab_replay, broker_config, trained_store):
    """A config whose incident topic holds the replay's incidents and whose feature log holds
    its rows; the session's champions and offline store (its datasets' features are reused)."""
    _, result, runs = lab_replay
    suffix = uuid.uuid4().hex[:8]
    config = trained_store.model_copy(deep=True)
    config.kafka = broker_config.kafka.model_copy(deep=True)
    config.topics.incidents, config.topics.feedback = f"incidents-{suffix}", f"feedback-{suffix}"
    kafka = config.kafka
    kafka_clients.ensure_topics(kafka.bootstrap_servers, kafka.client_kwargs(), [config.topics.incidents], 3)
    publish_incidents(kafka, config.topics.incidents, result.incidents)
    live = Path(config.features.offline_path) / "live"
    append_feature_log(result.rows, live, batch_id=0)
    yield config, result, runs
    shutil.rmtree(live)


def read_feedback_topic(config) -> list[dict]:
    consumer = kafka_clients.make_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    try:
        return [json.loads(r.value) for r in kafka_clients.read_records(consumer, config.topics.feedback)]
    finally:
        consumer.close()


def test_a_verdict_goes_to_the_feedback_topic_with_the_incidents_identity(fleet, tmp_path):
    config, result, runs = fleet
    leak = first_opened(result.incidents, STATE_LEAK, LAB_LEAK_RUN, runs)
    latest = [i for i in result.incidents if i["incident_id"] == leak["incident_id"]][-1]
    env = {"SENTINEL_STATE_DIR": str(tmp_path), "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
           "SENTINEL_TOPICS__INCIDENTS": config.topics.incidents, "SENTINEL_TOPICS__FEEDBACK": config.topics.feedback}
    done = run_sentinel("feedback", leak["incident_id"], "--false-positive", "--note", "planned backfill",
                        "--by", "on-call-ana", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"state_leak incident {leak['incident_id']} on {leak['job_name']}" in done.stdout
    assert "was a false positive (by on-call-ana)" in done.stdout
    (record,) = read_feedback_topic(config)
    assert FEEDBACK.errors(record) == []
    assert {k: record[k] for k in ("incident_id", "verdict", "note", "given_by", "family", "job_id", "vertex_id",
                                   "opened_at", "last_seen_at")} == {
        "incident_id": leak["incident_id"], "verdict": FALSE_POSITIVE, "note": "planned backfill",
        "given_by": "on-call-ana", "family": STATE_LEAK, "job_id": leak["job_id"], "vertex_id": leak["vertex_id"],
        "opened_at": leak["opened_at"], "last_seen_at": latest.get("resolved_at") or latest["updated_at"]}

    unknown = run_sentinel("feedback", "no-such-incident", "--confirmed", env=env)
    assert unknown.returncode == 1 and "no incident no-such-incident on" in unknown.stderr
    no_verdict = run_sentinel("feedback", leak["incident_id"], env=env)
    assert no_verdict.returncode == 2 and "--false-positive" in no_verdict.stderr
    assert len(read_feedback_topic(config)) == 1  # neither wrote anything


def test_verdicts_become_labels_of_their_family_only(fleet, spark):
    config, result, runs = fleet
    leak = first_opened(result.incidents, STATE_LEAK, LAB_LEAK_RUN, runs)
    skew = first_opened(result.incidents, SKEW, LAB_SKEW_RUN, runs)
    give(config, leak["incident_id"], CONFIRMED, given_by="first-look")
    give(config, leak["incident_id"], FALSE_POSITIVE, "a migration refilling state", given_by="second-look")
    give(config, skew["incident_id"], CONFIRMED, given_by="on-call")
    feedback = load_fleet_feedback(spark, config)
    assert sorted((v["incident_id"], v["verdict"]) for v in feedback.verdicts) == sorted(
        [(leak["incident_id"], FALSE_POSITIVE), (skew["incident_id"], CONFIRMED)])  # the latest verdict wins

    negatives = feedback.training_rows(STATE_LEAK)
    assert len(negatives) > 10
    assert set(negatives["label"]) == {"healthy"} and set(negatives["source"]) == {SOURCE}
    assert set(negatives["vertex_id"]) == {leak["vertex_id"]}  # the incident's vertex only
    assert negatives["ts"].min() >= leak["opened_at"] - LOOKBACK_MS
    positives = feedback.training_rows(SKEW)
    assert set(positives["label"]) == {SKEW} and positives["ts"].min() >= skew["opened_at"]
    assert set(positives["onset_ts"]) == {skew["opened_at"]}
    assert feedback.training_rows(BACKPRESSURE).empty


def test_train_with_feedback_reports_what_the_challenger_does_on_it(fleet, spark):
    """A dry run against the session's champions: the champion opened the leak incident on-call
    calls a false positive, so it opens it again; the challenger (trained on the real-Flink corpus
    and the verdicts) is judged next to it."""
    config, result, runs = fleet
    leak = first_opened(result.incidents, STATE_LEAK, LAB_LEAK_RUN, runs)
    skew = first_opened(result.incidents, SKEW, LAB_SKEW_RUN, runs)
    give(config, leak["incident_id"], FALSE_POSITIVE, given_by="on-call")
    give(config, skew["incident_id"], CONFIRMED, given_by="on-call")  # another family's: not the leak's business
    feedback = load_fleet_feedback(spark, config)
    lines: list[str] = []
    (outcome,) = run_training(spark, config, [LAB_CORPUS], families=[STATE_LEAK], dry_run=True,
                              grid=TRAINING_GRID, progress=lines.append, feedback=feedback)
    assert f"  {STATE_LEAK}: on-call's verdicts on 1 incident: {len(feedback.training_rows(STATE_LEAK))} rows" in lines
    assert outcome.feedback["false_positives"] == 1 and outcome.feedback["confirmed"] == 0
    reason = next(r for r in outcome.reasons if r.startswith("on the fleet's feedback"))
    refired = outcome.feedback["false_positives_refired"]
    assert reason == (f"on the fleet's feedback: the challenger opens again {refired} of 1 false positives, catches 0 of "
                      "0 confirmed (the champion: opens again 1 of 1 false positives, catches 0 of 0 confirmed)")
    assert outcome.version is None  # a dry run registers nothing


def test_the_gate_compares_feedback_outcomes():
    champion = {"false_positives": 2, "false_positives_refired": 1, "confirmed": 3, "confirmed_caught": 3}
    assert not regressed(dict(champion), champion)
    assert not regressed({**champion, "false_positives_refired": 0}, champion)
    assert regressed({**champion, "false_positives_refired": 2}, champion)
    assert regressed({**champion, "confirmed_caught": 2}, champion)


def test_the_latest_verdict_per_incident_wins():
    given = [{"incident_id": "a", "verdict": CONFIRMED, "given_at": 2}, {"incident_id": "a", "verdict": FALSE_POSITIVE,
             "given_at": 1}, {"incident_id": "b", "verdict": CONFIRMED, "given_at": 1}]
    assert {v["incident_id"]: v["verdict"] for v in latest_verdicts(given)} == {"a": CONFIRMED, "b": CONFIRMED}
