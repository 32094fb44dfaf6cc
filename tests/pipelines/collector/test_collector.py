"""The collector against a real HTTP server answering with REST responses recorded from real
Flink, and a real Kafka broker: once-only checkpoints (also across a restart), terminal jobs,
REST errors, several clusters and the CLI."""

import json
import re
import threading

import pytest

from pipelines.cli import main
from pipelines.collector import ClusterCollector, run_collector
from pipelines.config import CollectorConfig, FlinkClusterEndpoint
from pipelines.contracts import INPUT
from pipelines.io import kafka_clients
from tests.pipelines.collector.flink_replay import RecordedFlink, recorded_polls
from tests.helpers.waiting import wait_for


def settings(tmp_path, **overrides) -> CollectorConfig:
    values = {"state_dir": tmp_path / "collector", "retries": 2, "backoff_s": 0.05, "request_timeout_s": 1.0}
    return CollectorConfig(**{**values, **overrides})


def collector_for(flink: RecordedFlink, tmp_path, published: list, name: str = "lab", **overrides) -> ClusterCollector:
    return ClusterCollector(FlinkClusterEndpoint(name=name, rest_url=flink.url), settings(tmp_path, **overrides),
                            published.extend)


def checkpoint_ids(events: list[dict]) -> list[int]:
    return [e["checkpoint_id"] for e in events if e["kind"] == "checkpoint"]


def finished_ids(poll: dict) -> set[int]:
    history = next(v for p, v in poll.items() if re.fullmatch(r"/jobs/[0-9a-f]{32}/checkpoints", p))["history"]
    return {c["id"] for c in history if c["status"] in ("COMPLETED", "FAILED")}


def test_each_finished_checkpoint_is_published_once_and_a_canceled_job_is_then_left_alone(tmp_path):
    polls = recorded_polls("leak")
    published: list[dict] = []
    with RecordedFlink(polls) as flink:
        collector = collector_for(flink, tmp_path, published)
        per_poll = []
        for poll in range(len(polls)):
            flink.poll = poll
            before = len(published)
            result = collector.poll()
            assert result.errors == [] and result.invalid == 0
            per_poll.append(published[before:])
        last_look = collector.poll().events  # one more look at the ended job, then it is left alone
        assert [e["state"] for e in last_look if e["kind"] == "job_status"] == ["CANCELED"]
        assert checkpoint_ids(last_look) == []  # nothing published twice
        requests_before = len(flink.requests)
        assert collector.poll().events == []  # the job is CANCELED and was reported: nothing more
        assert len(flink.requests) - requests_before == 2  # only the overview and the JobManager heap

    ids = checkpoint_ids(published)
    assert len(ids) == len(set(ids)) and set(ids) == finished_ids(polls[-1])
    assert checkpoint_ids(per_poll[0]) == sorted(finished_ids(polls[0]))
    statuses = [e["state"] for e in published if e["kind"] == "job_status"]
    assert statuses == ["RUNNING", "RUNNING", "CANCELED", "CANCELED"]  # the ended job, looked at twice
    assert [e for e in per_poll[-1] if e["kind"] == "vertex_metrics"] == []  # a canceled job has no samples
    sizes = [e["state_size_bytes"] for e in published if e["kind"] == "checkpoint" and e["status"] == "COMPLETED"]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]  # the leak grows
    assert all(INPUT.errors(e) == [] and e["source"] == "collector" and e["cluster"] == "lab" for e in published)
    heap = [e["jm_heap_used_bytes"] for e in published if e["kind"] == "job_status"]
    assert heap[0] is None and heap[1] > 0  # Flink's first metric answer is empty: null, not a made-up zero


def test_a_restarted_collector_does_not_publish_a_checkpoint_twice(tmp_path):
    polls = recorded_polls("skew")
    first, second = [], []
    with RecordedFlink(polls) as flink:
        collector_for(flink, tmp_path, first).poll()
        flink.poll = 1
        collector_for(flink, tmp_path, second).poll()  # a new process: only the ledger on disk remembers

    assert set(checkpoint_ids(first)) == finished_ids(polls[0])
    assert set(checkpoint_ids(second)) == finished_ids(polls[1]) - finished_ids(polls[0])
    assert checkpoint_ids(second), "the second poll has new checkpoints"
    ledger = json.loads((tmp_path / "collector" / "lab.json").read_text())
    assert list(ledger["jobs"].values())[0]["watermark"] >= max(checkpoint_ids(second))


def test_checkpoints_are_not_marked_published_when_kafka_did_not_take_them(tmp_path):
    polls = recorded_polls("leak")
    delivered: list[dict] = []
    attempts = []

    def flaky_publish(events):
        attempts.append(len(events))
        if len(attempts) == 1:
            raise TimeoutError("broker did not acknowledge")
        delivered.extend(events)

    with RecordedFlink(polls) as flink:
        collector = ClusterCollector(FlinkClusterEndpoint(name="lab", rest_url=flink.url), settings(tmp_path), flaky_publish)
        with pytest.raises(TimeoutError):
            collector.poll()
        collector.poll()
    assert set(checkpoint_ids(delivered)) == finished_ids(polls[0])


def test_server_errors_garbage_and_timeouts_are_retried(tmp_path):
    polls = recorded_polls("leak")
    published: list[dict] = []
    with RecordedFlink(polls) as flink:
        flink.poll = 1  # Flink's first answer for JobManager metrics is empty: its metric fetcher starts lazily
        flink.hang_s = 1.5
        flink.faults = {"/jobs/overview": [503, "garbage"], "/jobmanager/metrics": ["hang"]}
        result = collector_for(flink, tmp_path, published).poll()
        assert flink.requests.count("/jobs/overview") == 3
    assert result.reachable and result.errors == []
    assert set(checkpoint_ids(published)) == finished_ids(polls[1])
    heap = [e["jm_heap_used_bytes"] for e in published if e["kind"] == "job_status"]
    assert heap and heap[0] > 0  # the heap request was retried after its timeout


def test_missing_checkpoint_details_publish_the_summary_without_vertices(tmp_path):
    polls = recorded_polls("leak")
    published: list[dict] = []
    with RecordedFlink(polls) as flink:
        job_id = polls[0]["/jobs/overview"]["jobs"][0]["jid"]
        # Gone from Flink's checkpoint statistics cache: every vertex's details of it are a 404.
        flink.faults = {f"/jobs/{job_id}/checkpoints/details/2/": [404] * 8}
        result = collector_for(flink, tmp_path, published).poll()
    assert any("checkpoint 2 details" in e and "404" in e for e in result.errors)
    by_id = {e["checkpoint_id"]: e for e in published if e["kind"] == "checkpoint"}
    assert by_id[2]["vertices"] == [] and by_id[2]["state_size_bytes"] > 0
    assert by_id[1]["vertices"]


def test_a_job_that_cannot_be_read_is_tried_again_next_poll_with_nothing_lost(tmp_path):
    polls = recorded_polls("leak")
    published: list[dict] = []
    with RecordedFlink(polls) as flink:
        job_id = polls[0]["/jobs/overview"]["jobs"][0]["jid"]
        flink.faults = {f"/jobs/{job_id}/checkpoints$": [500, 500, 500]}  # every retry of this poll
        collector = collector_for(flink, tmp_path, published)
        failed = collector.poll()
        assert failed.reachable and failed.errors and checkpoint_ids(published) == []
        collector.poll()
    assert set(checkpoint_ids(published)) == finished_ids(polls[0])


def test_an_unreachable_cluster_is_reported_not_raised(tmp_path):
    from infra.embedded_stack import free_port

    published: list[dict] = []
    collector = ClusterCollector(FlinkClusterEndpoint(name="gone", rest_url=f"http://127.0.0.1:{free_port()}"),
                                 settings(tmp_path, retries=1), published.extend)
    result = collector.poll()
    assert not result.reachable and "unreachable" in result.errors[0] and published == []


def test_several_clusters_go_to_the_input_topic_keyed_by_cluster_and_job(config, tmp_path):
    config.collector.state_dir = tmp_path / "collector"
    with RecordedFlink(recorded_polls("leak")) as eu, RecordedFlink(recorded_polls("skew")) as us:
        endpoints = [FlinkClusterEndpoint(name="eu", rest_url=eu.url), FlinkClusterEndpoint(name="us", rest_url=us.url)]
        results = run_collector(config, endpoints, once=True)
    assert [r.cluster for r in results] == ["eu", "us"] and all(r.reachable for r in results)

    consumer = kafka_clients.make_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    try:
        records = list(kafka_clients.read_records(consumer, config.topics.input, timeout_s=30))
    finally:
        consumer.close()
    events = [json.loads(r.value) for r in records]
    assert len(events) == sum(len(r.events) for r in results)
    assert {e["cluster"] for e in events} == {"eu", "us"}
    assert all(r.key.decode() == f"{json.loads(r.value)['cluster']}/{json.loads(r.value)['job_id']}" for r in records)


def test_continuous_collection_stops_when_asked(config, tmp_path):
    config.collector.state_dir = tmp_path / "collector"
    config.collector.interval_s = 0.2
    stop = threading.Event()
    reports = []

    def report(result):
        reports.append(result)
        if len(reports) == 3:
            stop.set()

    with RecordedFlink(recorded_polls("leak")) as flink:
        published: list[dict] = []
        thread = threading.Thread(target=run_collector, args=(config, [FlinkClusterEndpoint(name="lab", rest_url=flink.url)]),
                                  kwargs={"stop": stop, "report": report, "publish": published.extend})
        thread.start()
        thread.join(timeout=30)
    assert not thread.is_alive() and len(reports) >= 3
    assert len(checkpoint_ids(published)) == len(set(checkpoint_ids(published)))


def test_cli_collect_once(config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SENTINEL_KAFKA__BOOTSTRAP_SERVERS", config.kafka.bootstrap_servers)
    monkeypatch.setenv("SENTINEL_TOPICS__INPUT", config.topics.input)
    monkeypatch.setenv("SENTINEL_STATE_DIR", str(tmp_path / "state"))
    with RecordedFlink(recorded_polls("leak")) as flink:
        assert main(["collect", "--once", "--flink-rest", flink.url, "--cluster", "prod-eu"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"prod-eu: 1 jobs, \d+ checkpoints, 8 vertex samples, 1 job statuses \(\d+ requests", out)
    assert (tmp_path / "state" / "collector" / "prod-eu.json").is_file()


def test_the_collector_service_stops_cleanly_on_sigterm(config, tmp_path):
    """systemd and Kubernetes stop the collector with SIGTERM: it finishes the poll under way,
    flushes its producer and exits 0; what it published is on the topic, each checkpoint once."""
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
           "SENTINEL_TOPICS__INPUT": config.topics.input, "SENTINEL_STATE_DIR": str(tmp_path / "state"),
           "SENTINEL_COLLECTOR__METRICS_PORT": "0"}
    with RecordedFlink(recorded_polls("leak")) as flink:
        service = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "collect", "--flink-rest", flink.url,
                                    "--cluster", "prod-eu", "--interval", "1s"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            def a_poll_published() -> bool:
                assert service.poll() is None, service.stdout.read()
                return (tmp_path / "state" / "collector" / "prod-eu.json").is_file()
            wait_for(a_poll_published, 60, every_s=0.2)
            service.send_signal(signal.SIGTERM)
            out, _ = service.communicate(timeout=60)
        finally:
            if service.poll() is None:
                service.kill()
    assert service.returncode == 0, out
    assert "SIGTERM: stopping after the work under way" in out and "stopped: the producer flushed and closed" in out
    consumer = kafka_clients.make_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    try:
        events = [json.loads(r.value) for r in kafka_clients.read_records(consumer, config.topics.input, timeout_s=30)]
    finally:
        consumer.close()
    assert checkpoint_ids(events) and len(checkpoint_ids(events)) == len(set(checkpoint_ids(events)))
    assert {e["cluster"] for e in events} == {"prod-eu"}


def test_cli_collect_says_what_is_wrong(config, tmp_path, monkeypatch, capsys):
    from infra.embedded_stack import free_port

    monkeypatch.setenv("SENTINEL_KAFKA__BOOTSTRAP_SERVERS", config.kafka.bootstrap_servers)
    monkeypatch.setenv("SENTINEL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SENTINEL_COLLECTOR__RETRIES", "0")
    assert main(["collect", "--once", "--flink-rest", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "could not reach flink" in capsys.readouterr().err
    assert main(["collect", "--once"]) == 2
    assert "no Flink cluster to poll" in capsys.readouterr().err
    assert main(["collect", "--once", "--flink-rest", "flink-jm:8081"]) == 2
    assert "http" in capsys.readouterr().err


def test_a_restarting_job_is_followed_through_its_restart(tmp_path):
    """Flink keeps the JobID over a failover: statuses go on, no samples while it restarts, and the
    checkpoints after the restart continue the ledger."""
    import copy

    polls = copy.deepcopy(recorded_polls("leak"))
    restarting = copy.deepcopy(polls[0])
    for job in restarting["/jobs/overview"]["jobs"]:
        job["state"] = "RESTARTING"
    published: list[dict] = []
    with RecordedFlink([restarting, polls[1]]) as flink:
        collector = collector_for(flink, tmp_path, published)
        collector.poll()
        flink.poll = 1
        collector.poll()
    statuses = [e["state"] for e in published if e["kind"] == "job_status"]
    assert statuses == ["RESTARTING", "RUNNING"]
    samples = [e["ts"] for e in published if e["kind"] == "vertex_metrics"]
    restarted_at = next(e["ts"] for e in published if e["kind"] == "job_status" and e["state"] == "RUNNING")
    assert samples and min(samples) >= restarted_at  # none while restarting
    ids = checkpoint_ids(published)
    assert len(ids) == len(set(ids)) and set(ids) == finished_ids(polls[1])


@pytest.mark.parametrize("storage", [None, "Unknown"], ids=["left out", "Unknown"])
def test_a_starting_jobs_checkpoint_config_is_read_again_until_it_names_the_storage(tmp_path, storage):
    """Just after a job starts, Flink's REST cache can answer ``/checkpoints/config`` from the
    starting job's graph, without the storage (Flink 2.3 answers ``"Unknown"``, seen by polling a
    starting lab job). The collector asks again rather than losing the JobManager storage's state
    limit for the job's whole life; a settled job's answer is kept."""
    import copy

    polls = copy.deepcopy(recorded_polls("leak"))
    job = polls[0]["/jobs/overview"]["jobs"][0]
    config_path = f"/jobs/{job['jid']}/checkpoints/config"
    starting = copy.deepcopy(polls[0])
    if storage is None:
        del starting[config_path]["checkpoint_storage"]
    else:
        starting[config_path]["checkpoint_storage"] = storage
    just_changed = job["last-modification"] / 1000 + 1  # one second after the job began running
    published: list[dict] = []
    running = {**polls[1], config_path: polls[0][config_path]}  # the replay serves the latest answer
    with RecordedFlink([starting, running, polls[2]]) as flink:
        collector = ClusterCollector(FlinkClusterEndpoint(name="lab", rest_url=flink.url), settings(tmp_path),
                                     published.extend, clock=lambda: just_changed)
        for poll in range(3):
            flink.poll = poll
            collector.poll()
    limits = [e["max_state_size_bytes"] for e in published if e["kind"] == "job_status"]
    assert limits == [None, 5 * 1024 * 1024, 5 * 1024 * 1024]
    assert flink.requests.count(config_path) == 2  # asked again once, then kept

    settled = job["last-modification"] / 1000 + 60
    published.clear()
    with RecordedFlink([starting, starting]) as flink:
        collector = ClusterCollector(FlinkClusterEndpoint(name="lab", rest_url=flink.url),
                                     settings(tmp_path / "settled"), published.extend, clock=lambda: settled)
        collector.poll()
        flink.poll = 1
        collector.poll()
    assert flink.requests.count(config_path) == 1  # a settled job's answer is kept, storage or not
    assert [e["max_state_size_bytes"] for e in published if e["kind"] == "job_status"] == [None, None]


def test_the_collectors_metrics_count_requests_and_each_jobs_time_to_published(tmp_path):
    from pipelines.telemetry import CollectorMetrics

    metrics = CollectorMetrics()
    with RecordedFlink(recorded_polls("skew")) as flink:
        result = collector_for(flink, tmp_path, []).poll()
        metrics.record(result)
        asked = len(set(flink.requests))  # each path once, whatever a loaded machine's timeouts retried
    seen = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in metrics.registry.collect() for s in m.samples}
    lab = (("cluster", "lab"),)
    assert seen[("checkpoint_sentinel_collector_requests_total", lab)] == result.requests >= asked > 50
    assert seen[("checkpoint_sentinel_collector_job_published_seconds_count", lab)] == 1  # one job, published once
    assert 0 < seen[("checkpoint_sentinel_collector_job_published_seconds_sum", lab)] <= result.duration_s
