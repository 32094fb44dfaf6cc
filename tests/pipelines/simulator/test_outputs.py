"""Where simulated events go: files, a labelled dataset split by job, fleets, and the real broker."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from pipelines import simulator
from pipelines.io import kafka_clients
from pipelines.simulator.publish import publish_to_kafka
from tests.conftest import PROJECT_ROOT


def test_dataset_is_split_by_job_and_labels_match_events(tmp_path):
    names = ["healthy_steady", "leak_linear", "skew_hot_key"]
    manifest = simulator.write_dataset(tmp_path, names, jobs_per_scenario=5, seed=4, duration_ms=20 * 60_000)
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    seen_jobs: dict[str, str] = {}
    for split in simulator.SPLITS:
        truth = list(simulator.read_jsonl(tmp_path / split / "ground_truth.jsonl"))
        events = list(simulator.read_jsonl(tmp_path / split / "events.jsonl"))
        job_ids = {t["job_id"] for t in truth}
        assert {e["job_id"] for e in events} == job_ids  # a job's events live only in its split
        assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
        for job_id in job_ids:
            assert job_id not in seen_jobs, f"{job_id} is in {seen_jobs.get(job_id)} and {split}"
            seen_jobs[job_id] = split
        assert sorted(manifest["splits"][split]["job_ids"]) == sorted(job_ids)
        assert manifest["splits"][split]["events"] == len(events)
        # Stratified: 5 jobs of each scenario give 3 / 1 / 1.
        assert Counter(t["scenario"] for t in truth) == Counter(
            {name: {"train": 3, "validation": 1, "test": 1}[split] for name in names})
    assert len(seen_jobs) == 15


def test_fleet_draws_every_scenario_of_the_mix_and_respects_weights():
    mix = simulator.parse_mix(["healthy_steady:8", "leak_linear:1", "skew_hot_key:1"])
    jobs = simulator.fleet_jobs(40, mix, seed=2, duration_ms=10 * 60_000)
    counts = Counter(job.truth["scenario"] for job in jobs)
    assert set(counts) == {"healthy_steady", "leak_linear", "skew_hot_key"}
    assert counts["healthy_steady"] > counts["leak_linear"] + counts["skew_hot_key"]
    assert len({job.truth["job_id"] for job in jobs}) == 40
    assert {job.truth["cluster"] for job in jobs} == {"sim-eu", "sim-us"}
    merged = list(simulator.merged_events(jobs))
    assert len(merged) == sum(len(job.events) for job in jobs)
    assert [e["ts"] for e in merged] == sorted(e["ts"] for e in merged)


def test_bad_mix_is_a_clear_error():
    with pytest.raises(simulator.SimulationError, match="unknown scenario 'leak_lineer'"):
        simulator.parse_mix(["leak_lineer"])
    with pytest.raises(simulator.SimulationError, match="must be positive"):
        simulator.parse_mix(["leak_linear:0"])


def test_publish_to_kafka_keys_by_job_and_keeps_each_job_in_order(config):
    jobs = simulator.fleet_jobs(4, simulator.parse_mix(["healthy_steady", "leak_seed000"]), seed=5, duration_ms=5 * 60_000)
    events = list(simulator.merged_events(jobs))
    sent = publish_to_kafka(events, config, speed=None)
    assert sent == len(events)
    consumer = kafka_clients.make_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    records = kafka_clients.read_records(consumer, config.topics.input)
    consumer.close()
    assert len(records) == len(events)
    partitions_of_job: dict[str, set[int]] = {}
    for record in records:
        event = json.loads(record.value)
        assert record.key.decode() == f"{event['cluster']}/{event['job_id']}"
        partitions_of_job.setdefault(event["job_id"], set()).add(record.partition)
    assert all(len(p) == 1 for p in partitions_of_job.values())
    for job in jobs:
        in_topic = [json.loads(r.value) for r in sorted(records, key=lambda r: r.offset)
                    if json.loads(r.value)["job_id"] == job.truth["job_id"]]
        assert in_topic == job.events


def test_publish_paces_on_event_time(config):
    job = simulator.simulate_job("leak_seed000", seed=1, duration_ms=60_000)
    import time

    started = time.monotonic()
    publish_to_kafka(job.events, config, speed=30.0)  # ~60 s of event time at 30x: ~2 s
    elapsed = time.monotonic() - started
    span_s = (job.events[-1]["ts"] - job.events[0]["ts"]) / 1000
    assert span_s / 30 - 0.1 <= elapsed


def _sentinel(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=300, env=env)


def test_cli_lists_the_catalogue_and_writes_events_with_ground_truth(tmp_path):
    listing = _sentinel("simulate", "--list")
    assert listing.returncode == 0
    lines = listing.stdout.strip().splitlines()
    assert len(lines) == len(simulator.CATALOGUE)
    assert any(line.startswith("leak_seed000") and "state_leak" in line for line in lines)

    out = tmp_path / "run.jsonl"
    result = _sentinel("simulate", "--scenario", "leak_seed000", "--scenario", "healthy_steady", "--seed", "3",
                       "--duration", "5m", "--out", str(out))
    assert result.returncode == 0, result.stderr
    truth = list(simulator.read_jsonl(tmp_path / "run.ground_truth.jsonl"))
    assert [t["scenario"] for t in truth] == ["leak_seed000", "healthy_steady"]
    events = list(simulator.read_jsonl(out))
    expected = list(simulator.merged_events([simulator.simulate_job("leak_seed000", 3, 0, 300_000),
                                             simulator.simulate_job("healthy_steady", 3, 1, 300_000)]))
    assert events == expected


def test_cli_rejects_bad_parameters_with_exit_2(tmp_path):
    result = _sentinel("simulate", "--scenario", "nope", "--out", str(tmp_path / "x.jsonl"))
    assert result.returncode == 2
    assert "unknown scenario 'nope'" in result.stderr and "Traceback" not in result.stderr
    result = _sentinel("simulate", "--scenario", "leak_linear")
    assert result.returncode == 2 and "--out FILE.jsonl, --kafka or --out-dataset DIR" in result.stderr
