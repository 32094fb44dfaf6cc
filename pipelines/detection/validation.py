"""Input validation: every Kafka record is either a usable event or a dead letter with its reason.

:func:`check_event` is the one rule, a pure function over the record's bytes; the live job runs
it on every record of a micro-batch (in its stateful processor, once per record) and ``sentinel
replay`` on every line of its files, so both accept and reject exactly the same events. Beyond the input contract it rejects
values no Flink cluster can report: ratios far above 1, a checkpoint acknowledged before it was
triggered, timestamps in seconds rather than milliseconds, or further in the future than clock
skew explains.

>>> check_event(b'{"schema_version": 2}', now_ms=0)[1]
'unknown_schema_version'
>>> check_event(b'not json', now_ms=0)[1]
'malformed_json'
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import orjson

from pipelines.contracts import INPUT

KNOWN_SCHEMA_VERSIONS = (1,)
KNOWN_KINDS = ("checkpoint", "vertex_metrics", "job_status")
EARLIEST_TS = 1_000_000_000_000  # 2001-09-09: anything before is epoch seconds sent as ms
# Flink reports these per second of wall time (ms/s) or as shares; a little above the bound is
# rounding in its moving averages, far above is a unit or producer bug.
RATIO_BOUNDS = {"busy_time_ms_per_s": 1100.0, "backpressured_time_ms_per_s": 1100.0, "idle_time_ms_per_s": 1100.0,
                "in_pool_usage": 1.5, "out_pool_usage": 1.5}

def check_event(value: bytes | None, now_ms: int, max_future_ms: int = 300_000) -> tuple[dict | None, str | None, str | None]:
    """``(event, None, None)`` for a usable record, else ``(None, reason, error)``."""
    if value is None:
        return None, "malformed_json", "the record has no value (a tombstone?)"
    try:
        # The parser the feature state machine uses too, so what passes here parses there. It is
        # strict RFC 8259: NaN, Infinity, lone surrogates and numbers past a double's range are
        # refused (integers past 64 bits come back as doubles, which the state can hold).
        event = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return None, "malformed_json", f"not JSON: {exc}"
    if not isinstance(event, dict):
        return None, "malformed_json", f"a JSON {type(event).__name__}, not an object"
    version = event.get("schema_version")
    if version not in KNOWN_SCHEMA_VERSIONS:
        return None, "unknown_schema_version", f"schema_version {version!r} is not one of {list(KNOWN_SCHEMA_VERSIONS)}"
    if event.get("kind") not in KNOWN_KINDS:
        return None, "unknown_kind", f"kind {event.get('kind')!r} is not one of {list(KNOWN_KINDS)}"
    errors = [] if INPUT.accepts(event) else INPUT.errors(event)  # the precise validator has the last word
    if errors:
        return None, "schema_violation", "; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else "")
    impossible = _impossible(event, now_ms, max_future_ms)
    if impossible:
        return None, "impossible_value", impossible
    return _cut_texts(event), None, None


MAX_TEXT_CHARS = 4_096  # a display text (name, failure message) longer than this is cut, the same way each time


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else f"{text[:MAX_TEXT_CHARS]}...[{len(text) - MAX_TEXT_CHARS} more]"


def _cut_texts(event: dict) -> dict:
    """The event with its display texts cut to :data:`MAX_TEXT_CHARS`, so that no name can make an
    incident too large to publish (identities, which the contract bounds, are never cut)."""
    for name in ("job_name", "vertex_name", "failure_message"):
        text = event.get(name)
        if text is not None and len(text) > MAX_TEXT_CHARS:
            event[name] = _cut(text)
    for vertex in event.get("vertices") or ():
        text = vertex.get("vertex_name")
        if text is not None and len(text) > MAX_TEXT_CHARS:
            vertex["vertex_name"] = _cut(text)
    return event


def _impossible(event: dict, now_ms: int, max_future_ms: int) -> str | None:
    ts = event["ts"]
    if ts < EARLIEST_TS:
        return f"ts {ts} is before 2001: epoch seconds sent where epoch milliseconds belong?"
    if ts > now_ms + max_future_ms:
        return f"ts {ts} is {(ts - now_ms) / 1000:.0f}s in the future (allowed: {max_future_ms / 1000:.0f}s of clock skew)"
    if event["kind"] == "checkpoint":
        if event["trigger_ts"] > ts:
            return f"checkpoint {event['checkpoint_id']} finished (ts {ts}) before it was triggered ({event['trigger_ts']})"
        if event["num_acknowledged_subtasks"] > event["num_subtasks"]:
            return (f"checkpoint {event['checkpoint_id']}: {event['num_acknowledged_subtasks']} acknowledged of "
                    f"{event['num_subtasks']} subtasks")
    if event["kind"] == "vertex_metrics":
        for subtask in event["subtasks"]:
            for name, bound in RATIO_BOUNDS.items():
                value = subtask.get(name)
                if value is not None and not 0 <= value <= bound:
                    return f"{event['vertex_name']} subtask {subtask.get('index')}: {name} = {value} (expected 0..{bound:g})"
    if event["kind"] == "job_status":
        used, limit = event.get("jm_heap_used_bytes"), event.get("jm_heap_max_bytes")
        if used is not None and limit and used > 1.5 * limit:
            return f"JobManager heap used {used} is far above its maximum {limit}"
    return None


def record_text(raw: Any) -> tuple[str | None, str]:
    """The record's bytes as UTF-8 text, or base64 when they are not text."""
    if raw is None:
        return None, "utf-8"
    raw = bytes(raw)
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


DEFAULT_VALUE_BYTES = 32_768
KEY_BYTES = 1_024  # a Kafka key is a job's name, never long: more is kept as its hash only
ERROR_CHARS = 2_000  # a schema error quotes the offending value, which may be the whole record


def _bounded_text(raw: bytes | None, limit: int) -> tuple[str | None, str, bool]:
    """``(text, encoding, truncated)`` of at most ``limit`` of ``raw``'s bytes: UTF-8 when the kept
    bytes are text without control characters (which JSON escapes six bytes each), else base64."""
    if raw is None:
        return None, "utf-8", False
    kept, text = raw[:limit], None
    # A cut may split the last character: up to three bytes less, never a character dropped inside.
    for cut in range(len(kept), max(len(kept) - 4, -1) if len(kept) < len(raw) else len(kept) - 1, -1):
        try:
            text, kept = kept[:cut].decode("utf-8"), kept[:cut]
            break
        except UnicodeDecodeError:
            continue
    if text is not None and not any(ord(c) < 0x20 and c not in "\t\n\r" for c in text):
        return text, "utf-8", len(kept) < len(raw)
    return base64.b64encode(kept).decode("ascii"), "base64", len(kept) < len(raw)


def dead_letter(record, reason: str, error: str, max_value_bytes: int = DEFAULT_VALUE_BYTES) -> dict:
    """The dead-letter contract's document for an unusable record (a
    :class:`~pipelines.detection.flink_job.Record`): why, where it was, and its bytes: at most
    ``max_value_bytes`` of them, with the size and SHA-256 of the whole, so that a dead letter is
    never too large for the topic however large the record.

    >>> from pipelines.detection.flink_job import Record
    >>> letter = dead_letter(Record(bytes(400_000), key=b"\\xff"), "malformed_json", "not JSON", 16)
    >>> letter["value"], letter["value_encoding"], letter["value_bytes"], letter["value_truncated"]
    ('AAAAAAAAAAAAAAAAAAAAAA==', 'base64', 400000, True)
    >>> letter["key"], letter["key_encoding"]
    ('/w==', 'base64')
    """
    raw = None if record.value is None else bytes(record.value)
    value, encoding, truncated = _bounded_text(raw, max_value_bytes)
    key_raw = None if record.key is None else bytes(record.key)
    key, key_encoding, key_truncated = _bounded_text(key_raw, KEY_BYTES)
    letter = {"reason": reason, "error": error if len(error) <= ERROR_CHARS else error[:ERROR_CHARS] + " [...]",
              "source_topic": record.topic, "partition": record.partition, "offset": record.offset,
              "kafka_timestamp": record.kafka_timestamp_ms, "key": key, "key_encoding": key_encoding,
              "value": value, "value_encoding": encoding,
              "value_bytes": None if raw is None else len(raw),
              "value_sha256": None if raw is None else hashlib.sha256(raw).hexdigest(),
              "value_truncated": truncated}
    if key_truncated:
        letter["key_sha256"] = hashlib.sha256(key_raw).hexdigest()
    return letter
