"""The dead-letter spool against the real broker: letters wait while their topic cannot take them,
go out in order once it can, and the micro-batch that spooled them never waits."""

from __future__ import annotations

import time
import uuid

import orjson

from pipelines.detection.dead_letters import DeadLetterSpool
from pipelines.io import kafka_clients
from pipelines.telemetry import DetectionMetrics
from tests.helpers.detection_job import read_topic
from tests.helpers.waiting import wait_for


def _letters(n: int, start: int = 0) -> list[tuple[str, bytes]]:
    return [(f"bad/{i}", orjson.dumps({"reason": "malformed_json", "offset": i})) for i in range(start, start + n)]


def _value(metrics: DetectionMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def test_letters_wait_while_the_broker_is_unreachable_and_go_out_in_order_when_it_answers(broker_config, tmp_path):
    from infra.embedded_stack import free_port

    kafka = broker_config.kafka
    topic = f"dlq-{uuid.uuid4().hex[:8]}"
    kafka_clients.ensure_topics(kafka.bootstrap_servers, kafka.client_kwargs(), [topic], 1)
    reachable = {"servers": f"127.0.0.1:{free_port()}"}  # nothing listens there yet
    metrics = DetectionMetrics()
    spool = DeadLetterSpool(tmp_path / "spool", topic, lambda: kafka_clients.make_producer(
        reachable["servers"], kafka.client_kwargs(), max_block_ms=2_000, request_timeout_ms=2_000), metrics,
        send_timeout_s=3, max_backoff_s=1).start()
    try:
        started = time.monotonic()
        spool.put(0, _letters(3))
        spool.put(1, _letters(2, start=3))
        assert time.monotonic() - started < 1.0  # the batch does not wait for the topic
        wait_for(lambda: _value(metrics, "checkpoint_sentinel_dead_letter_publish_failures_total") >= 3, 30, 0.5)
        assert _value(metrics, "checkpoint_sentinel_dead_letters_pending") == 5
        assert spool.last_error is not None
        reachable["servers"] = kafka.bootstrap_servers
        wait_for(lambda: spool.pending() == 0, 60, 0.5)
    finally:
        spool.close(timeout_s=5)
    assert [letter["offset"] for letter in read_topic(broker_config, topic)] == [0, 1, 2, 3, 4]
    assert _value(metrics, "checkpoint_sentinel_dead_letters_pending") == 0


def test_letters_spooled_by_a_job_that_stopped_are_sent_by_the_next_one(broker_config, tmp_path):
    kafka = broker_config.kafka
    topic = f"dlq-{uuid.uuid4().hex[:8]}"
    kafka_clients.ensure_topics(kafka.bootstrap_servers, kafka.client_kwargs(), [topic], 1)
    unreachable = DeadLetterSpool(tmp_path / "spool", topic, lambda: kafka_clients.make_producer(
        "127.0.0.1:9", kafka.client_kwargs(), max_block_ms=1_000, request_timeout_ms=1_000), send_timeout_s=2)
    unreachable.put(7, _letters(4))
    unreachable.close(timeout_s=2)  # never started: what it holds stays on disk
    assert unreachable.pending() == 4
    restarted = DeadLetterSpool(tmp_path / "spool", topic, lambda: kafka_clients.make_producer(
        kafka.bootstrap_servers, kafka.client_kwargs()))
    assert restarted.drain(30)
    assert sorted(letter["offset"] for letter in read_topic(broker_config, topic)) == [0, 1, 2, 3]


def test_a_letter_too_large_for_the_producer_goes_without_the_records_bytes(broker_config, tmp_path):
    kafka = broker_config.kafka
    topic = f"dlq-{uuid.uuid4().hex[:8]}"
    kafka_clients.ensure_topics(kafka.bootstrap_servers, kafka.client_kwargs(), [topic], 1)
    spool = DeadLetterSpool(tmp_path / "spool", topic, lambda: kafka_clients.make_producer(
        kafka.bootstrap_servers, kafka.client_kwargs(), max_request_size=50_000))
    large = {"reason": "malformed_json", "offset": 0, "value": "x" * 80_000, "value_bytes": 80_000}
    spool.put(0, [("big", orjson.dumps(large))] + _letters(2, start=1))
    assert spool.drain(30)
    got = read_topic(broker_config, topic)
    assert [letter["offset"] for letter in got] == [0, 1, 2]
    assert got[0]["value"] is None and got[0]["value_truncated"] is True and got[0]["value_bytes"] == 80_000
