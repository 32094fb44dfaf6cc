"""The detection job end to end: real broker, real Spark, real MLflow champions.

One simulated fleet (a job per failure family, a healthy job and a warm-up) goes through the live
job once (module fixture); the tests read what it published. Replay runs the same events.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from pipelines.contracts import DEAD_LETTER, INCIDENT
from pipelines.detection.champions import ChampionCache
from pipelines.detection.flink_job import replay
from pipelines.detection.job import start_detection
from pipelines.incidents.comparison import compare
from tests.helpers.metrics import samples, scrape, totals
from tests.helpers.detection_job import (detection_config_for, fleet, fleet_events, job_environment, key, opened,
                                         publish, read_topic, write_jsonl)
from tests.helpers.waiting import wait_for

FAMILY_FLEET = ["healthy_steady", "healthy_warmup", "leak_linear", "backpressure_slow_operator", "skew_hot_key",
                "checkpoint_storage_errors"]
SEED, MINUTES = 7, 75


def incident_events_in(text_file: str) -> float:
    """The incident events a metrics text file counts, over all families, severities and events."""
    return totals(samples(text_file)).get("checkpoint_sentinel_incident_events_total", 0.0)


def run_available_now(spark, config):
    job = start_detection(spark, config, ChampionCache(config), available_now=True)
    try:
        job.await_termination(900)
        job.scraped = scrape(job.metrics_server.url)  # what Prometheus would have seen last
    finally:
        job.stop()
    return job


@pytest.fixture(scope="module")
def live_fleet(spark, broker_config, trained_store, tmp_path_factory):
    folder = tmp_path_factory.mktemp("live-fleet")
    config = detection_config_for(broker_config, trained_store, folder)
    jobs = fleet(FAMILY_FLEET, SEED, MINUTES)
    events = fleet_events(jobs)
    publish(config, events)
    job = run_available_now(spark, config)
    return {"config": config, "jobs": jobs, "events": events, "job": job,
            "incidents": read_topic(config, config.topics.incidents), "folder": folder}


def test_each_family_gets_exactly_its_incident_and_healthy_jobs_none(live_fleet):
    jobs, incidents = live_fleet["jobs"], live_fleet["incidents"]
    comparison = compare([j.truth for j in jobs], opened(incidents))
    assert comparison.missed == [] and comparison.false == [], "\n".join(comparison.lines())
    assert sorted(d["family"] for d in comparison.detected) == ["backpressure", "checkpoint_failure", "skew",
                                                                "state_leak"]
    healthy = {j.truth["job_id"] for j in jobs if not j.truth["faults"]}
    assert [i for i in incidents if i["job_id"] in healthy] == []  # not even an anomaly
    skew_truth = next(j.truth for j in jobs if j.truth["scenario"] == "skew_hot_key")["faults"][0]
    skew = next(i for i in opened(incidents) if i["family"] == "skew")
    assert (skew["vertex_id"], skew["subtask_index"]) == (skew_truth["vertex_id"], skew_truth["subtask_index"])
    for incident in incidents:
        assert INCIDENT.errors(incident) == []
        assert incident["model"]["alias"] == "champion" and incident["runbook"] and incident["summary"]
    # The job's /metrics counted every incident event it published, by family.
    scraped = live_fleet["job"].scraped
    counted = {}
    for (name, labels), value in scraped.items():
        if name == "checkpoint_sentinel_incident_events_total":
            family = dict(labels)["family"]
            counted[family] = counted.get(family, 0) + value
    assert counted.get("anomaly") == 0  # every family's series exists from the start, at 0
    counted = {family: value for family, value in counted.items() if value}
    published = {}
    for incident in incidents:
        published[incident["family"]] = published.get(incident["family"], 0) + 1
    assert counted == published
    assert scraped[("checkpoint_sentinel_model_registry_reachable", ())] == 1


def test_replay_gives_the_same_incidents_as_the_live_job(spark, live_fleet, tmp_path):
    config = live_fleet["config"]
    recording = write_jsonl(tmp_path / "recording.jsonl", live_fleet["events"])
    result = replay(config, [recording], ChampionCache(config).require())
    assert result.events == len(live_fleet["events"]) and result.dead_letters == []
    assert sorted(map(key, result.incidents)) == sorted(map(key, live_fleet["incidents"]))


def test_the_job_reports_its_health_and_logs_its_features(spark, live_fleet):
    config = live_fleet["config"]
    metrics = config.detection.metrics_file.read_text()
    assert 'checkpoint_sentinel_input_rows_per_second{query="detection"}' in metrics
    assert 'checkpoint_sentinel_state_rows{query="detection"}' in metrics
    assert "checkpoint_sentinel_model_registry_reachable 1" in metrics
    assert incident_events_in(metrics) == len(live_fleet["incidents"])
    from feature_store.offline_store import read_features

    logged = read_features(spark, config.offline_store / "live").select("job_id").distinct().count()
    assert logged == len(live_fleet["jobs"])  # every job of the fleet: nothing waits out a lateness


def test_bad_records_go_to_the_dead_letter_topic_and_the_job_goes_on(spark, detection_config):
    config = detection_config
    jobs = fleet(["leak_seed000"], SEED, 4)
    events = fleet_events(jobs)
    half = len(events) // 2
    bad = [b"{oops", json.dumps({**events[0], "schema_version": 9}).encode(),
           json.dumps({**events[0], "kind": "savepoint"}).encode(),
           json.dumps({**events[0], "ts": events[0]["ts"] // 1000}).encode(), b"\xff\xfe\x00binary",
           # An event time that is not a number: Spark's (ANSI) cast of it failed the whole micro-batch once.
           json.dumps({**events[0], "ts": "soon"}).encode()]
    publish(config, events[:half], raw=bad)
    publish(config, events[half:])
    run_available_now(spark, config)
    letters = read_topic(config, config.topics.dead_letter)
    assert sorted(d["reason"] for d in letters) == sorted(
        ["malformed_json", "unknown_schema_version", "unknown_kind", "impossible_value", "malformed_json",
         "schema_violation"])
    for letter in letters:
        assert DEAD_LETTER.errors(letter) == []
        assert letter["source_topic"] == config.topics.input and letter["key"] == "bad/record"
    # The events after the bad records were used: the seed-000 leak is caught.
    incidents = opened(read_topic(config, config.topics.incidents))
    assert "state_leak" in [i["family"] for i in incidents]


def test_moving_the_champion_alias_changes_the_version_in_new_incidents(spark, detection_config):
    import mlflow

    from models import registry
    from pipelines import simulator

    config = detection_config
    config.detection.model_refresh_s = 1.0
    trained_leak_name = config.mlflow.models.state_leak
    config.mlflow.models.state_leak = f"sentinel-state-leak-{config.topics.input}"  # a model of this test's own
    registry.use_config(config)
    leak = registry.load_detector(trained_leak_name, "champion")
    registry.ensure_experiment(config)
    with mlflow.start_run():
        first = registry.log_detector(leak.detector, leak.post_rule, _example_rows(leak), config.mlflow.models.state_leak)
    registry.set_alias(config.mlflow.models.state_leak, "champion", first)

    job_a = simulator.simulate_job("leak_seed000", SEED, 0, 4 * 60_000, cluster="e2e")
    job_b = simulator.simulate_job("leak_seed000", SEED, 1, 4 * 60_000, cluster="e2e",
                                   start_ts=job_a.events[-1]["ts"] + 60_000)
    running = start_detection(spark, config, ChampionCache(config))
    try:
        publish(config, job_a.events)
        wait_for(lambda: any(i["job_id"] == job_a.truth["job_id"] and i["family"] == "state_leak"
                             for i in read_topic(config, config.topics.incidents)), 180)
        with mlflow.start_run():
            second = registry.log_detector(leak.detector, leak.post_rule, _example_rows(leak),
                                           config.mlflow.models.state_leak)
        registry.set_alias(config.mlflow.models.state_leak, "champion", second)
        publish(config, job_b.events)
        wait_for(lambda: any(i["job_id"] == job_b.truth["job_id"] and i["family"] == "state_leak"
                             for i in read_topic(config, config.topics.incidents)), 180)
    finally:
        running.stop()
    leaks = [i for i in read_topic(config, config.topics.incidents) if i["family"] == "state_leak"]
    versions = {(i["job_id"], i["event"]): i["model"]["version"] for i in leaks}
    assert versions[(job_a.truth["job_id"], "opened")] == first
    assert versions[(job_b.truth["job_id"], "opened")] == second != first


def test_the_python_workers_and_their_models_outlast_a_quiet_input(spark, detection_config):
    # Spark stops a Python worker idle for 60 s; the job's warm-up runs again while no batch reads
    # input, so after 70 quiet seconds the workers that loaded the champions at the start are there.
    config = detection_config
    config.detection.keep_workers_warm_s = 20.0
    running = start_detection(spark, config, ChampionCache(config))
    try:
        started_with = running.keeper.workers
        time.sleep(70)
        kept = running.keeper.workers
        runs = running.keeper.runs
    finally:
        running.stop()
    assert runs >= 2
    assert started_with and sorted(w["pid"] for w in kept) == sorted(w["pid"] for w in started_with)
    scoring = [w["models"] for w in kept if w["models"] is not None]  # the feature log writer's load none
    assert len(scoring) == len(kept) // 2 and all(models == scoring[0] != "{}" for models in scoring)


def _example_rows(loaded):
    import pandas as pd

    return pd.DataFrame([[0.0] * len(loaded.config.features)], columns=list(loaded.config.features))


def test_a_stopped_job_restarts_and_loses_no_incident(spark, detection_config, tmp_path):
    """Killed with -9 mid-batch, restarted, then stopped by SIGTERM (as systemd and Kubernetes stop
    a service) while a batch is under way: the job publishes every incident the events call for and
    none they do not. SIGTERM stops cleanly: the batch under way finishes and is committed, the
    producers are flushed and closed, the last metrics written, exit code 0. (One job stopped both
    ways, in two runs: every run starts a Spark JVM of its own. A restart after a clean stop:
    tests/infra/test_shared_storage.py and tests/pipelines/io/test_kafka_source.py.)"""
    import os
    import signal
    import subprocess
    import sys

    config = detection_config
    jobs = fleet(["leak_linear", "checkpoint_storage_errors", "skew_hot_key"], SEED + 1, 60)
    events = fleet_events(jobs)
    expected = replay(config, [write_jsonl(tmp_path / "all.jsonl", events)], ChampionCache(config).require())
    assert opened(expected.incidents), "the fleet must raise incidents for this test to mean anything"

    env = job_environment(config)
    command = [sys.executable, "-m", "pipelines.cli", "run"]
    log_path = tmp_path / "run.log"
    log = open(log_path, "wb")
    checkpoint = config.state_dir / "checkpoints" / "detection"
    metrics_file = config.state_dir / "metrics" / "sentinel.prom"
    quarter = len(events) // 4

    def batches(log_name: str) -> set[int]:
        folder = checkpoint / log_name
        return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()

    def records_read_by(batch: int) -> int:
        """How far into the topic a planned batch reads (its end offsets, summed over partitions)."""
        lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
        return sum(json.loads(lines[-1]).values()) if len(lines) >= 3 else -1  # written whole, or not yet

    def start() -> subprocess.Popen:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def feed(part: list[dict]) -> None:
        """Publish ``part`` in two halves, the second once a batch of the running job is done."""
        done_before = len(batches("commits"))
        publish(config, part[:len(part) // 2])
        wait_for(lambda: len(batches("commits")) > done_before, 240)
        publish(config, part[len(part) // 2:])

    running = start()
    try:
        feed(events[:2 * quarter])
        time.sleep(3)  # a batch is under way
    finally:
        os.killpg(running.pid, signal.SIGKILL)  # the CLI, its Spark JVM and Python workers, mid-batch
        running.wait()

    running = start()
    try:
        feed(events[2 * quarter:])
        deadline = time.monotonic() + 240
        while not (under_way := [b for b in batches("offsets") - batches("commits")
                                 if records_read_by(b) == len(events)]):
            assert running.poll() is None and time.monotonic() < deadline, \
                "no batch read to the topic's end: " + _without_query_plans(log_path.read_text())[-3000:]
            time.sleep(0.05)
        signalled = time.time()
        os.kill(running.pid, signal.SIGTERM)  # the CLI only, as systemd's KillMode=mixed does first
        assert running.wait(timeout=240) == 0, _without_query_plans(log_path.read_text())[-3000:]
    finally:
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGKILL)
        running.wait()
    said = log_path.read_text()
    assert "SIGTERM: stopping after the work under way" in said and "stopped: " in said
    assert under_way[0] in batches("commits")  # the batch under way at SIGTERM finished
    assert metrics_file.stat().st_mtime >= signalled  # the last metrics, written on the way out
    published_before_stop = re.search(r"stopped: (\d+) incident events", said).group(1)
    assert incident_events_in(metrics_file.read_text()) == int(published_before_stop)

    published = read_topic(config, config.topics.incidents)
    assert set(map(key, expected.incidents)) <= set(map(key, published))  # none lost; repeats are allowed
    assert {i["incident_id"] for i in published} == {i["incident_id"] for i in expected.incidents}


def _without_query_plans(log_text: str) -> str:
    """A failed query's message ends in its logical plan, which buries the cause: keep the rest."""
    return re.sub(r"\n\s*Logical Plan:\n(?:.*\n)*?(?=\S|\Z)", "\n[logical plan left out]\n", log_text)
