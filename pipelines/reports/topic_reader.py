"""What ``sentinel report`` reads from the topics: the incidents of a recent stretch of time, and
the input events of their jobs from a while before each opened, never a topic from its start.

Each read seeks with the broker's time index (``offsets_for_times``) to the first record at or
after the time it needs (record timestamps: when a record was published), and stops at the end
offsets it found when it began. A report run every minute from cron on a topic that keeps days
of a fleet's metrics thus reads about the last hour's records, whatever the topic holds.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from pipelines.config import SentinelConfig
from pipelines.datasets import read_jsonl
from pipelines.reports.incident_page import usable_incidents

log = logging.getLogger(__name__)

# How far before an incident's first event a page's plots reach back (the decisive series before
# the opening), and the slack for a collector that publishes a job's events late.
PAGE_LOOKBACK_MS = 30 * 60_000


@dataclass
class ReportInputs:
    incidents: list[dict]
    refused: list[str]
    events: Iterable[dict]
    read: list[str] = field(default_factory=list)  # one note per topic read: records, from when

    @property
    def read_note(self) -> str:
        return "".join(f"; {note}" for note in self.read)


def read_since(bootstrap_servers: str, client_options: dict, topic: str, start_ms: int, timeout_s: float,
               keep: Callable[[Any], bool] | None = None) -> list:
    """The records of ``topic`` published at ``start_ms`` or later, up to the end offsets when the
    read began (only those ``keep`` accepts). Raises ``TimeoutError`` naming the topic if they do
    not arrive within ``timeout_s``."""
    from kafka import TopicPartition

    from pipelines.io import kafka_clients

    consumer = kafka_clients.make_consumer(bootstrap_servers, client_options)
    probe = kafka_clients.metadata_consumer(bootstrap_servers, client_options)
    try:
        partitions = kafka_clients.partitions_of(consumer, topic)
        end = kafka_clients.latest_offsets(consumer, topic, partitions)
        tps = [TopicPartition(topic, p) for p in partitions]
        begin = consumer.beginning_offsets(tps)
        found = consumer.offsets_for_times({tp: max(0, int(start_ms)) for tp in tps})
        starts = {}
        for tp in tps:
            # None: nothing published since start_ms in this partition.
            answer = found.get(tp)
            at = min(answer.offset, end[tp.partition]) if answer is not None else end[tp.partition]
            starts[tp] = _checked_start(probe, tp, start_ms, begin[tp], at, end[tp.partition])
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, starts[tp])
        records: list = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp.partition] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} up to its end took longer than {timeout_s:g}s (--read-timeout)")
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(r for r in batch if r.offset < end[r.partition] and (keep is None or keep(r)))
        return records
    finally:
        probe.close()
        consumer.close()


def _checked_start(probe, tp, start_ms: int, begin: int, answer: int, end: int) -> int:
    """The broker's answer to "the first offset at ``start_ms``", checked against the records on
    either side of it, and found by bisection on record timestamps where it is wrong: a broker
    without a time index (the embedded broker's memory storage answers its first offset for any
    time) then still costs a few dozen one-record fetches, not a read of the whole partition."""
    if answer >= end:
        return end
    at = _record_at(probe, tp, answer)
    if at is not None and at[1] < start_ms:
        return _bisect(probe, tp, start_ms, at[0] + 1, end)
    if answer > begin and (before := _record_at(probe, tp, answer - 1)) is not None and before[1] >= start_ms:
        return _bisect(probe, tp, start_ms, begin, answer)
    return answer


def _bisect(probe, tp, start_ms: int, low: int, high: int) -> int:
    """The first offset in [low, high) whose record is at ``start_ms`` or later (``high`` if none),
    record timestamps taken as rising with the offset (as a producer's clock makes them)."""
    while low < high:
        mid = (low + high) // 2
        at = _record_at(probe, tp, mid)
        if at is None or at[0] >= high:
            high = mid
        elif at[1] < start_ms:
            low = at[0] + 1
        else:
            high = mid
    return low


def _record_at(probe, tp, offset: int, timeout_s: float = 10.0) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at ``offset`` or after it (below the end offsets, so
    there is one unless retention deleted it meanwhile), or None."""
    if probe.assignment() != {tp}:
        probe.assign([tp])
    probe.seek(tp, offset)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for record in probe.poll(timeout_ms=200, max_records=1).get(tp, []):
            return record.offset, record.timestamp
    return None


def _values(records: Sequence, topic: str) -> list[tuple[int, dict]]:
    """(record timestamp, JSON value) in publication order; a value that is not JSON is skipped."""
    values = []
    for record in sorted(records, key=lambda r: (r.timestamp, r.partition, r.offset)):
        try:
            values.append((record.timestamp, json.loads(record.value)))
        except ValueError:
            log.warning("%s partition %d offset %d is not JSON; skipped", topic, record.partition, record.offset)
    return values


def _since(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def report_inputs(config: SentinelConfig, incident_files: Sequence[str] | None, event_files: Sequence[str] | None,
                  read_timeout_s: float, since_s: float, now_ms: int | None = None) -> ReportInputs:
    """The incident events (from files, else the incident topic's last ``since_s``) and the input
    events of their jobs (from files, else the input topic from ``PAGE_LOOKBACK_MS`` before the
    first incident event read)."""
    kafka = config.kafka
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    notes = []
    if incident_files:
        incidents, refused = usable_incidents([i for path in incident_files for i in read_jsonl(Path(path))])
        first_ms = None
    else:
        start = now_ms - int(since_s * 1000)
        records = read_since(kafka.bootstrap_servers, kafka.client_kwargs(), config.topics.incidents, start,
                             read_timeout_s)
        values = _values(records, config.topics.incidents)
        incidents, refused = usable_incidents([value for _, value in values])
        usable = {id(incident) for incident in incidents}
        stamps = [ts for ts, value in values if id(value) in usable]
        first_ms = min(stamps) if stamps else None
        notes.append(f"{len(records)} records of {config.topics.incidents} since {_since(start)}")
    if event_files or not incidents:
        events: Iterable[dict] = (e for path in event_files or () for e in read_jsonl(Path(path)))
        return ReportInputs(incidents, refused, events, notes)
    # As the collector keys them; a name no UTF-8 key can hold (a lone surrogate) matches none.
    keys = {f"{i['cluster']}/{i['job_id']}".encode("utf-8", "surrogatepass") for i in incidents}
    if first_ms is None:  # incidents from a file: their jobs' events from as long ago as they opened
        first_ms = min(int(i["opened_at"]) for i in incidents)
    start = first_ms - PAGE_LOOKBACK_MS - int(config.features.max_source_delay_s * 1000)
    records = read_since(kafka.bootstrap_servers, kafka.client_kwargs(), config.topics.input, start, read_timeout_s,
                         keep=lambda r: r.key in keys)
    notes.append(f"{len(records)} records of their jobs on {config.topics.input} since {_since(start)}")
    return ReportInputs(incidents, refused, [value for _, value in _values(records, config.topics.input)], notes)
