"""`sentinel incidents`: the incident topic as a readable live table, one line per incident event."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Callable, Iterator

from pipelines.config import SentinelConfig
from pipelines.io import kafka_clients

HEADER = f"{'event time (UTC)':<19}  {'event':<8} {'severity':<8} {'family':<18} {'job / vertex':<44} summary"
MARK = {"opened": "OPEN", "updated": "UPDATE", "resolved": "RESOLVED"}


def utc_time(ms: int | float | None) -> str:
    """An event time (epoch ms) as UTC date and time; ``-`` for none."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def format_incident(incident: dict) -> str:
    where = incident.get("job_name") or incident["job_id"]
    if incident.get("vertex_name"):
        where += f" / {incident['vertex_name']}"
    if incident.get("subtask_index") is not None:
        where += f" #{incident['subtask_index']}"
    summary = incident["summary"]
    if incident.get("forecast") and incident["event"] != "resolved":
        summary += f"  (ETA {incident['forecast']['eta_ms'] / 60000:.0f} min)"
    return (f"{utc_time(incident.get('updated_at')):<19}  {MARK.get(incident['event'], incident['event']):<8} "
            f"{incident['severity']:<8} {incident['family']:<18} {where[:44]:<44} {summary}")


def follow(config: SentinelConfig, from_beginning: bool = False, timeout_s: float | None = None,
           max_events: int | None = None, clock: Callable[[], float] = time.monotonic) -> Iterator[dict]:
    """Incident events from the topic as they arrive; stops after ``timeout_s`` of silence or ``max_events``.

    Connects before it returns, so a broker that cannot be reached (or refuses the client) stops
    the caller before it prints anything."""
    kafka = config.kafka
    kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)
    consumer = kafka_clients.make_consumer(kafka.bootstrap_servers, kafka.client_kwargs())
    try:
        topic = config.topics.incidents
        numbers = kafka_clients.partitions_of(consumer, topic, kafka.connect_timeout_s)
        starts = (kafka_clients.earliest_offsets(consumer, topic, numbers) if from_beginning
                  else kafka_clients.latest_offsets(consumer, topic, numbers))
        kafka_clients.assign_from(consumer, topic, starts)
    except BaseException:
        consumer.close()
        raise
    return _incidents(consumer, timeout_s, max_events, clock)


def _incidents(consumer, timeout_s: float | None, max_events: int | None,
               clock: Callable[[], float]) -> Iterator[dict]:
    try:
        seen, last = 0, clock()
        while True:
            batch = consumer.poll(timeout_ms=500)
            records = sorted((r for rs in batch.values() for r in rs), key=lambda r: (r.timestamp, r.partition, r.offset))
            for record in records:
                try:
                    yield json.loads(record.value)
                except ValueError:
                    continue  # not ours to judge; the table shows incidents only
                seen += 1
                last = clock()
                if max_events is not None and seen >= max_events:
                    return
            if timeout_s is not None and clock() - last >= timeout_s:
                return
    finally:
        consumer.close()
