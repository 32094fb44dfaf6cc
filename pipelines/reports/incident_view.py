"""`sentinel incidents`: the incident topic as a readable live table, one line per incident event,
and the file name of each incident's page (:func:`page_file`, which the alert relay links to).

Names are shown through :mod:`pipelines.display` (Flink's names can hold anything)."""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Callable, Iterator

from pipelines.config import SentinelConfig
from pipelines.display import fit, printable, utc_time
from pipelines.families.base import eta_text, limit_text
from pipelines.io import kafka_clients

HEADER = f"{'event time (UTC)':<19}  {'event':<8} {'severity':<8} {'family':<18} {'job / vertex':<44} summary"
MARK = {"opened": "OPEN", "updated": "UPDATE", "resolved": "RESOLVED"}


def format_incident(incident: dict) -> str:
    """One line of the table, whatever the names in it hold."""
    where = str(incident.get("job_name") or incident["job_id"])
    if incident.get("vertex_name"):
        where += f" / {incident['vertex_name']}"
    if incident.get("subtask_index") is not None:
        where += f" #{incident['subtask_index']}"
    summary = str(incident["summary"])
    forecast = soonest_forecast(incident)
    if forecast and incident["event"] != "resolved":
        summary += f"  (ETA {eta_text(forecast)} to {limit_text(forecast)})"
    return (f"{utc_time(incident.get('updated_at')):<19}  {fit(MARK.get(incident['event'], incident['event']), 8)} "
            f"{fit(incident['severity'], 8)} {fit(incident['family'], 18)} {fit(where, 44)} {printable(summary)}")


def soonest_forecast(incident: dict) -> dict | None:
    """The incident's soonest forecast (``forecasts`` are soonest first; ``forecast`` is what an
    incident published before they existed carries)."""
    forecasts = incident.get("forecasts") or []
    return forecasts[0] if forecasts else incident.get("forecast")


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


PLAIN_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,99}")
RESERVED_NAMES = frozenset({"index"})
SLUG_CHARS = 60


def page_file(incident_id: str) -> str:
    """The file name of an incident's page: the id itself when it is a plain lower-case name,
    else a slug of it and a hash of the whole id after a ``~`` (which no plain id holds), so two
    ids never share a page. Only ``[a-z0-9_~-]`` and ``.html``: safe in a folder and in a URL."""
    if PLAIN_ID.fullmatch(incident_id) and incident_id not in RESERVED_NAMES:
        return f"{incident_id}.html"
    slug = re.sub(r"[^a-z0-9]+", "-", incident_id.lower()).strip("-")[:SLUG_CHARS].rstrip("-") or "incident"
    digest = hashlib.sha256(incident_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{slug}~{digest}.html"
