"""Poison on the input topic: the live detection job (real broker, real Spark, the session's
champions) keeps running, every record is either used or a dead letter of bounded size, and the
incident behind the poison is published.

Before dead letters were bounded, a 400 KB value of control bytes made a 2.4 MB dead letter: the
micro-batch failed on the producer's size limit, and so did every restart.
"""

from __future__ import annotations

import json
import time

import orjson

from pipelines.contracts import DEAD_LETTER, input_event_key
from pipelines.detection.champions import ChampionCache
from pipelines.detection.flink_job import replay
from pipelines.detection.job import start_detection
from pipelines.io import kafka_clients
from tests.helpers.detection_job import detection_config_for, fleet, fleet_events, opened, read_topic, write_jsonl
from tests.helpers.waiting import wait_for
from tests.helpers.metrics import scrape, totals

LETTER_LIMIT = 100_000  # bytes: far below the producer's 1 MiB request limit


def _deeply_nested(depth: int) -> bytes:
    return b'{"schema_version": 1, "x": ' + b"[" * depth + b"]" * depth + b"}"


def _poison(event: dict) -> list[tuple[bytes, bytes, str]]:
    """``(key, value, reason)`` of each poison record."""
    return [
        (b"bad/record", bytes(range(32)) * 12_800, "malformed_json"),  # 400 KB of control bytes
        (b"\xff\xfe\xfd/not-text", b"\x00\x9f garbage", "malformed_json"),
        (b"bad/record", _deeply_nested(100_000), "malformed_json"),
        (b"bad/record", json.dumps({**event, "schema_version": 99}).encode(), "unknown_schema_version"),
        (b"bad/record", json.dumps(event).replace('"ts": ', '"ts": 1e400, "was": ', 1).encode(), "malformed_json"),
        (b"bad/record", json.dumps({**event, "cluster": "c" * 300_000}).encode(), "schema_violation"),
    ]


def test_poison_records_become_bounded_dead_letters_and_the_job_goes_on(spark, broker_config, trained_store,
                                                                         tmp_path):
    config = detection_config_for(broker_config, trained_store, tmp_path)
    events = fleet_events(fleet(["leak_seed000"], 7, 4))
    half = len(events) // 2
    poison = _poison(events[0])
    # Valid events that a strict reader could choke on, and that must be used: a name of 600 KB, and
    # a record key that is not UTF-8 (the job is read from the JSON then; a job of its own, since a
    # job's records on two partitions are read partition by partition).
    renamed = next(i for i, e in enumerate(events[half:], half) if e["kind"] == "vertex_metrics")
    events[renamed] = {**events[renamed], "vertex_name": "Calc(select=[a, EXPR$0]) $x_1_2$ " * 20_000}
    status = next(e for e in events[half:] if e["kind"] == "job_status")
    odd_key = half + 1
    events.insert(odd_key, {**status, "job_id": "f" * 32, "job_name": "keyed-otherwise"})
    kafka = config.kafka
    producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs(), max_request_size=2**21)
    for i, event in enumerate(events):
        key = b"\xff\xfe" if i == odd_key else input_event_key(event)
        producer.send(config.topics.input, key=key, value=json.dumps(event).encode())
        if i == half:
            for poison_key, value, _ in poison:
                producer.send(config.topics.input, key=poison_key, value=value)
    producer.flush()
    producer.close()

    job = start_detection(spark, config, ChampionCache(config))
    try:
        def caught_up() -> bool:
            assert job.query.exception() is None, job.query.exception()
            progress = job.query.recentProgress
            return sum(p.numInputRows for p in progress) >= len(events) + len(poison) and \
                job.sinks.spool.pending() == 0 and not job.query.status["isDataAvailable"]
        wait_for(caught_up, 300, 1.0)
        time.sleep(3)  # another trigger or two: the job is still running after the poison
        assert job.query.isActive and job.query.exception() is None
        scraped = totals(scrape(job.metrics_server.url))  # each metric summed over its labels
    finally:
        job.stop()

    raw_letters = _raw(config, config.topics.dead_letter)
    letters = [orjson.loads(value) for value in raw_letters]
    assert sorted(letter["reason"] for letter in letters) == sorted(reason for _, _, reason in poison)
    for value, letter in zip(raw_letters, letters):
        assert len(value) < LETTER_LIMIT, (letter["reason"], len(value))
        assert DEAD_LETTER.errors(letter) == []
        assert letter["source_topic"] == config.topics.input
    control = next(letter for letter in letters if letter["value_bytes"] == 32 * 12_800)
    assert control["value_truncated"] and control["value_encoding"] == "base64" and len(control["value_sha256"]) == 64
    not_text = next(letter for letter in letters if letter.get("key_encoding") == "base64")
    assert not_text["key"] == "//79L25vdC10ZXh0"  # base64 of the key's bytes, as they were
    # Nothing else was lost: no other record was dead-lettered, and the valid ones were used as a
    # replay of them alone uses them (the simulator delivers a few late, on purpose).
    assert scraped.get("checkpoint_sentinel_dead_letters_total") == len(poison)
    alone = replay(config, [write_jsonl(tmp_path / "valid.jsonl", events)], ChampionCache(config).require())
    assert alone.dead_letters == []
    assert scraped.get("checkpoint_sentinel_late_events_total", 0.0) == sum(alone.late.values())
    incidents = read_topic(config, config.topics.incidents)
    assert "state_leak" in [i["family"] for i in opened(incidents)]
    assert all(len(orjson.dumps(i)) < LETTER_LIMIT for i in incidents)


def _raw(config, topic: str) -> list[bytes]:
    kafka = config.kafka
    consumer = kafka_clients.make_consumer(kafka.bootstrap_servers, kafka.client_kwargs())
    try:
        return [r.value for r in kafka_clients.read_records(consumer, topic, timeout_s=30)]
    finally:
        consumer.close()
