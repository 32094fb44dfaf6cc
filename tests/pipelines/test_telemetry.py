"""The sentinel's own metrics over HTTP, as Prometheus scrapes them."""

from __future__ import annotations

import time

from pipelines.collector import PollResult
from pipelines.telemetry import BatchProgress, CollectorMetrics, DetectionMetrics, serve
from tests.helpers.metrics import scrape


def test_the_detection_job_s_metrics_are_served_and_count_what_happened():
    metrics = DetectionMetrics()
    server = serve(metrics.registry, "127.0.0.1", 0)
    try:
        metrics.incidents([{"family": "state_leak", "severity": "warning", "event": "opened"},
                           {"family": "state_leak", "severity": "critical", "event": "updated"},
                           {"family": "state_leak", "severity": "warning", "event": "opened"}])
        metrics.dead_letters.labels("malformed_json").inc(2)
        metrics.progress("detection", BatchProgress(batch_id=4, input_rows=120, input_rows_per_second=90.0,
                                                    processed_rows_per_second=80.0, duration_s=1.5, state_rows=42,
                                                    rows_dropped_by_watermark=3, newest_event_s=time.time() - 12.5))
        metrics.models({"skew": ("sentinel-skew", "7")}, reachable=False)
        seen = scrape(server.url)
    finally:
        server.close()
    name = "checkpoint_sentinel_incident_events_total"
    assert seen[(name, (("event", "opened"), ("family", "state_leak"), ("severity", "warning")))] == 2
    assert seen[(name, (("event", "updated"), ("family", "state_leak"), ("severity", "critical")))] == 1
    assert seen[("checkpoint_sentinel_dead_letters_total", (("reason", "malformed_json"),))] == 2
    assert seen[("checkpoint_sentinel_input_rows_total", (("query", "detection"),))] == 120
    assert 12.5 <= seen[("checkpoint_sentinel_event_lag_seconds", (("query", "detection"),))] < 17.5  # as scraped
    assert seen[("checkpoint_sentinel_state_rows", (("query", "detection"),))] == 42
    assert seen[("checkpoint_sentinel_model_version_info", (("family", "skew"), ("name", "sentinel-skew"),
                                                            ("version", "7")))] == 1
    assert seen[("checkpoint_sentinel_model_registry_reachable", ())] == 0


def test_a_new_model_version_replaces_the_old_one_and_no_family_is_ever_without_one():
    metrics = DetectionMetrics()
    metrics.models({"skew": ("sentinel-skew", "1"), "state_leak": ("sentinel-state-leak", "3")}, reachable=True)
    seen_during = []
    real_remove = metrics.model_version.remove

    def remove(*labels):  # what a scrape at that moment reads
        seen_during.append({dict(s.labels)["family"] for s in list(metrics.model_version.collect())[0].samples})
        real_remove(*labels)

    metrics.model_version.remove = remove
    metrics.models({"skew": ("sentinel-skew", "2"), "state_leak": ("sentinel-state-leak", "3")}, reachable=True)
    samples = list(metrics.model_version.collect())[0].samples
    assert {(s.labels["family"], s.labels["version"]) for s in samples} == {("skew", "2"), ("state_leak", "3")}
    assert seen_during == [{"skew", "state_leak"}]


def test_the_collector_s_metrics_account_for_every_poll():
    metrics = CollectorMetrics()
    events = [{"kind": "checkpoint"}, {"kind": "vertex_metrics"}, {"kind": "vertex_metrics"}]
    metrics.record(PollResult("prod-eu", events, jobs=3, requests=4, duration_s=0.2, request_seconds=[0.01, 0.3]))
    metrics.record(PollResult("prod-eu", reachable=False, errors=["unreachable"], duration_s=5.0))
    server = serve(metrics.registry, "127.0.0.1", 0)
    try:
        seen = scrape(server.url)
    finally:
        server.close()
    eu = (("cluster", "prod-eu"),)
    assert seen[("checkpoint_sentinel_collector_polls_total", eu)] == 2
    assert seen[("checkpoint_sentinel_collector_poll_errors_total", eu)] == 1
    assert seen[("checkpoint_sentinel_collector_cluster_reachable", eu)] == 0
    assert seen[("checkpoint_sentinel_collector_events_published_total", (("cluster", "prod-eu"), ("kind", "vertex_metrics")))] == 2
    assert seen[("checkpoint_sentinel_collector_request_duration_seconds_count", eu)] == 2
    assert seen[("checkpoint_sentinel_collector_request_duration_seconds_bucket", (("cluster", "prod-eu"), ("le", "0.025")))] == 1
    assert seen[("checkpoint_sentinel_collector_jobs", eu)] == 0  # the latest poll saw none


def test_each_part_serves_its_process_s_memory_and_cpu_and_what_build_it_runs():
    from importlib.metadata import version

    from pipelines.alerting import RelayMetrics

    for component, metrics in (("detection", DetectionMetrics()), ("collector", CollectorMetrics()),
                               ("alert", RelayMetrics())):
        server = serve(metrics.registry, "127.0.0.1", 0)
        try:
            seen = scrape(server.url)
        finally:
            server.close()
        builds = [dict(labels) for (name, labels) in seen if name == "checkpoint_sentinel_build_info"]
        assert builds == [{"component": component, "version": version("checkpoint-sentinel"),
                           "python_version": builds[0]["python_version"]}]
        # This very process: its resident memory is that of a Python with prometheus_client loaded.
        assert 10 * 2**20 < seen[("process_resident_memory_bytes", ())] < 16 * 2**30
        assert seen[("process_cpu_seconds_total", ())] > 0
        assert any(name == "python_info" for name, _ in seen)


def test_batch_durations_are_a_histogram_a_quantile_can_be_read_from():
    metrics = DetectionMetrics()
    for batch_id, seconds in enumerate((0.3, 0.7, 4.0, 45.0)):
        metrics.progress("detection", BatchProgress(batch_id=batch_id, input_rows=1, input_rows_per_second=1.0,
                                                    processed_rows_per_second=1.0, duration_s=seconds, state_rows=1,
                                                    rows_dropped_by_watermark=0))
    server = serve(metrics.registry, "127.0.0.1", 0)
    try:
        seen = scrape(server.url)
    finally:
        server.close()
    name = "checkpoint_sentinel_batch_duration_seconds"
    assert seen[(f"{name}_count", (("query", "detection"),))] == 4
    assert seen[(f"{name}_sum", (("query", "detection"),))] == 50.0
    assert seen[(f"{name}_bucket", (("le", "0.5"), ("query", "detection")))] == 1
    assert seen[(f"{name}_bucket", (("le", "5.0"), ("query", "detection")))] == 3
    assert seen[(f"{name}_bucket", (("le", "30.0"), ("query", "detection")))] == 3
    assert seen[(f"{name}_bucket", (("le", "+Inf"), ("query", "detection")))] == 4


def test_the_driver_s_jvm_is_watched_beside_its_python_process(spark):
    metrics = DetectionMetrics()
    metrics.watch_jvm(spark.sparkContext._gateway.proc.pid)
    server = serve(metrics.registry, "127.0.0.1", 0)
    try:
        seen = scrape(server.url)
    finally:
        server.close()
    # A JVM with Spark's classes loaded holds far more than this Python's memory.
    assert seen[("checkpoint_sentinel_jvm_process_resident_memory_bytes", ())] > 100 * 2**20
    assert seen[("checkpoint_sentinel_jvm_process_cpu_seconds_total", ())] > 1


def test_every_dead_letter_reason_the_contract_names_is_counted_from_zero():
    """A counter that appears at 1 has no increase() in Prometheus: its first letter would not fire
    SentinelDeadLetters. The reasons are those the dead-letter contract lists."""
    import re

    from prometheus_client import generate_latest

    from pipelines.contracts import DEAD_LETTER
    from pipelines.telemetry import DEAD_LETTER_REASONS
    from tests.helpers.metrics import samples

    described = DEAD_LETTER.schema["properties"]["reason"]["description"]
    named = re.findall(r"\b([a-z]+(?:_[a-z]+)+|unprocessable)\b", described.split(":", 1)[1])
    assert set(named) == set(DEAD_LETTER_REASONS)
    seen = {labels: value for (name, labels), value in samples(generate_latest(DetectionMetrics().registry).decode())
            .items() if name == "checkpoint_sentinel_dead_letters_total"}
    assert {dict(labels)["reason"] for labels in seen} == set(DEAD_LETTER_REASONS)
    assert set(seen.values()) == {0.0}
