"""Input validation: each kind of bad record gets its reason; good ones pass untouched."""

from __future__ import annotations

import base64
import json

import pytest

from pipelines.contracts import DEAD_LETTER
from pipelines.contracts.examples import example_events
from pipelines.detection.validation import check_event

NOW = 1_700_000_000_000 + 3_600_000
CHECKPOINT, VERTEX, STATUS = list(example_events(3))


def encoded(event) -> bytes:
    return json.dumps(event).encode()


def test_every_example_event_is_usable():
    for event in example_events(30):
        assert check_event(encoded(event), NOW) == (event, None, None)


@pytest.mark.parametrize("value,reason,detail", [
    (b"{not json", "malformed_json", "not JSON"),
    (b"\xff\xfe\x00", "malformed_json", "not JSON"),
    (b"[1, 2]", "malformed_json", "a JSON list"),
    (None, "malformed_json", "tombstone"),
    # Not JSON by RFC 8259, though Python's json module reads them: the feature state could not
    # hold them, so they are refused here rather than failing a batch later.
    (encoded(CHECKPOINT).replace(b'"state_size_bytes": ', b'"state_size_bytes": NaN, "x": '), "malformed_json",
     "not JSON"),
    (encoded(CHECKPOINT).replace(b'"state_size_bytes": ', b'"state_size_bytes": 1e400, "x": '), "malformed_json",
     "not JSON"),
    (encoded({**CHECKPOINT, "job_id": "\ud800"}), "malformed_json", "not JSON"),  # a lone surrogate
    (encoded({**CHECKPOINT, "schema_version": 2}), "unknown_schema_version", "schema_version 2"),
    (encoded({**CHECKPOINT, "kind": "savepoint"}), "unknown_kind", "'savepoint'"),
    (encoded({**CHECKPOINT, "state_size_bytes": -5}), "schema_violation", "state_size_bytes"),
    (encoded({k: v for k, v in STATUS.items() if k != "job_id"}), "schema_violation", "'job_id' is a required"),
    (encoded({**CHECKPOINT, "ts": NOW + 3_600_000}), "impossible_value", "in the future"),
    (encoded({**CHECKPOINT, "ts": 1_700_000_000, "trigger_ts": 1_600_000_000}), "impossible_value", "epoch seconds"),
    (encoded({**CHECKPOINT, "trigger_ts": CHECKPOINT["ts"] + 1}), "impossible_value", "before it was triggered"),
    (encoded({**VERTEX, "subtasks": [{**VERTEX["subtasks"][0], "in_pool_usage": 7.0}]}), "impossible_value",
     "in_pool_usage = 7.0"),
    (encoded({**VERTEX, "subtasks": [{**VERTEX["subtasks"][0], "busy_time_ms_per_s": 5000}]}), "impossible_value",
     "busy_time_ms_per_s"),
])
def test_bad_records_are_named(value, reason, detail):
    event, got_reason, error = check_event(value, NOW)
    assert event is None and got_reason == reason
    assert detail in error


def test_a_jobs_records_split_into_used_events_and_dead_letters_with_their_origin():
    from feature_store.job_features import features_for_events
    from pipelines.detection.flink_job import FlinkJobState, ReadRules, Record

    good = [e for e in example_events(30) if (e["cluster"], e["job_id"]) == (CHECKPOINT["cluster"], CHECKPOINT["job_id"])]
    bad = [b"\xff\xfe garbage", encoded({**CHECKPOINT, "kind": "savepoint"}),
           encoded({**CHECKPOINT, "job_id": "f" * 32})]  # routed to this job, naming another
    values = [encoded(e) for e in good] + bad
    records = [Record(value, b"c/j", "flink.metrics", 1, offset, NOW - 5) for offset, value in enumerate(values)]
    job = FlinkJobState()
    reading = job.read(records, NOW, ReadRules(300_000, 30 * 60_000, 10_000), key=(CHECKPOINT["cluster"], CHECKPOINT["job_id"]))
    assert len(reading.rows) == len(features_for_events(good)) > 0
    letters = reading.dead_letters
    assert [(d["reason"], d["offset"], d["partition"], d["source_topic"], d["key"], d["kafka_timestamp"])
            for d in letters] == [(reason, len(good) + i, 1, "flink.metrics", "c/j", NOW - 5) for i, reason in
                                  enumerate(["malformed_json", "unknown_kind", "schema_violation"])]
    assert "differ from" in letters[2]["error"]
    assert letters[0]["value_encoding"] == "base64"
    assert base64.b64decode(letters[0]["value"]) == bad[0]  # the original bytes, exactly
    assert letters[1]["value_encoding"] == "utf-8" and letters[1]["value"] == bad[1].decode()
    for letter in letters:
        assert DEAD_LETTER.errors(letter) == []


def test_events_behind_the_watermark_are_counted_late_even_for_a_job_without_state():
    """A collector far behind the others cannot start a forgotten job afresh from old events."""
    from feature_store.job_features import features_for_events
    from pipelines.detection.flink_job import BEHIND_WATERMARK, FlinkJobState, ReadRules, Record

    good = [e for e in example_events(30) if (e["cluster"], e["job_id"]) == (CHECKPOINT["cluster"], CHECKPOINT["job_id"])]
    watermark = sorted(e["ts"] for e in good)[len(good) // 2]
    records = [Record(encoded(e), None, "flink.metrics", 0, offset) for offset, e in enumerate(good)]
    rules = ReadRules(300_000, 30 * 60_000, 10_000)
    reading = FlinkJobState().read(records, NOW, rules, watermark_ms=watermark)
    behind = [e for e in good if e["ts"] < watermark]
    assert behind and reading.late == {BEHIND_WATERMARK: len(behind)}
    assert len(reading.rows) == len(features_for_events([e for e in good if e["ts"] >= watermark]))


def _numeric_paths(node, path=()):
    if isinstance(node, dict):
        for name, value in node.items():
            yield from _numeric_paths(value, path + (name,))
    elif isinstance(node, list):
        for index, value in enumerate(node[:1]):
            yield from _numeric_paths(value, path + (index,))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path


def _set(event, path, value):
    node = event
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value


@pytest.mark.parametrize("extreme", [2**63 - 1, -(2**63), 2**63, 10**200, 1.7e308, -1.7e308, 1e-300])
def test_no_number_an_event_may_hold_fails_the_features_or_the_state(extreme):
    """Every number of every kind of event set to an extreme, one at a time: the event is refused
    as a dead letter, or the job's features and its state's JSON take it. Past a Java long the
    features' squares overflowed and the state's JSON refused the integers, failing the batch."""
    import copy

    from pipelines import simulator
    from pipelines.detection.flink_job import FlinkJobState, ReadRules, Record, feature_frame

    events = simulator.simulate_job("leak_seed000", 5, 0, 4 * 60_000).events
    key = (events[0]["cluster"], events[0]["job_id"])
    now = events[-1]["ts"] + 1_000
    rules = ReadRules(300_000, 30 * 60_000, 10_000)
    firsts = {}
    for event in events:
        firsts.setdefault(event["kind"], event)
    for kind, first in firsts.items():
        for path in _numeric_paths(first):
            if path[0] in ("schema_version", "ts"):
                continue
            changed = copy.deepcopy(events)
            for event in changed:
                if event["kind"] == kind:
                    try:
                        _set(event, path, extreme)
                    except (IndexError, KeyError, TypeError):
                        continue
            records = [Record(json.dumps(e).encode(), offset=i) for i, e in enumerate(changed)]
            job = FlinkJobState()
            reading = job.read(records, now, rules, key=key)
            feature_frame(reading.rows)
            job.to_bytes()
            if abs(extreme) >= 2**63:
                assert reading.dead_letters and reading.dead_letters[0]["reason"] == "schema_violation", (kind, path)


def _record(value, key=b"bad/record"):
    from pipelines.detection.flink_job import Record

    return Record(value, key=key, topic="metrics", partition=2, offset=41, kafka_timestamp_ms=NOW)


@pytest.mark.parametrize("value", [bytes(range(32)) * 12_500, "\u00e9".encode() * 200_000, b"x" * 1_000_000])
def test_a_dead_letter_keeps_a_bounded_prefix_with_the_size_and_hash_of_the_whole(value):
    import hashlib

    import orjson

    from pipelines.detection.validation import dead_letter

    letter = dead_letter(_record(value), "malformed_json", "not JSON " * 10_000, max_value_bytes=4096)
    assert DEAD_LETTER.errors(letter) == []
    assert len(orjson.dumps(letter)) < 12_000  # as the job sends it; the record was 400 KB to 1 MB
    assert letter["value_bytes"] == len(value) and letter["value_truncated"] is True
    assert letter["value_sha256"] == hashlib.sha256(value).hexdigest()
    kept = base64.b64decode(letter["value"]) if letter["value_encoding"] == "base64" else letter["value"].encode()
    assert value.startswith(kept) and 4092 <= len(kept) <= 4096  # a split character is left out, nothing else
    assert letter["error"].endswith("[...]") and len(letter["error"]) < 2_100


def test_a_small_record_is_kept_whole_and_a_key_that_is_not_text_in_base64():
    from pipelines.detection.validation import dead_letter

    letter = dead_letter(_record(b"{oops", key=b"\xff\xfe/job"), "malformed_json", "not JSON")
    assert (letter["value"], letter["value_encoding"], letter["value_truncated"]) == ("{oops", "utf-8", False)
    assert (letter["key"], letter["key_encoding"]) == (base64.b64encode(b"\xff\xfe/job").decode(), "base64")
    assert DEAD_LETTER.errors(letter) == []


def test_a_name_too_long_to_publish_is_cut_and_an_identity_too_long_is_refused():
    from pipelines.detection.validation import MAX_TEXT_CHARS

    event, reason, _ = check_event(encoded({**VERTEX, "vertex_name": "Calc(select=[a, EXPR$0])" * 40_000}), NOW)
    assert reason is None and len(event["vertex_name"]) < MAX_TEXT_CHARS + 30
    assert event["vertex_name"].startswith("Calc(select=[a, EXPR$0])") and event["vertex_name"].endswith("more]")
    event, reason, error = check_event(encoded({**CHECKPOINT, "cluster": "c" * 5_000}), NOW)
    assert event is None and reason == "schema_violation" and "is too long" in error
