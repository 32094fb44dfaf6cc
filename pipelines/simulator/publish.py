"""Publish simulated events to the input topic, paced on event time or as fast as possible."""

from __future__ import annotations

import json
import time
from typing import Callable, Iterable

from pipelines.config import SentinelConfig
from pipelines.contracts import input_event_key
from pipelines.io import kafka_clients


def publish_to_kafka(events: Iterable[dict], config: SentinelConfig, speed: float | None = None,
                     progress: Callable[[int, int], None] | None = None, progress_every_s: float = 5.0) -> int:
    """Send ``events`` (in ts order) to ``topics.input``; returns how many were acknowledged.

    ``speed`` is event-time seconds per wall second (60: an hour in a minute); None sends at once.
    """
    if speed is not None and speed <= 0:
        raise ValueError("speed must be positive")
    kafka = config.kafka
    kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)
    producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
    sent, first_ts, wall_start, last_report = 0, None, time.monotonic(), time.monotonic()
    try:
        for event in events:
            if speed is not None:
                first_ts = event["ts"] if first_ts is None else first_ts
                wait = wall_start + (event["ts"] - first_ts) / 1000.0 / speed - time.monotonic()
                if wait > 0:
                    producer.flush()  # make what is due visible before sleeping
                    time.sleep(wait)
            producer.send(config.topics.input, key=input_event_key(event),
                          value=json.dumps(event, separators=(",", ":")).encode())
            sent += 1
            if progress and time.monotonic() - last_report >= progress_every_s:
                progress(sent, event["ts"])
                last_report = time.monotonic()
        producer.flush()
    finally:
        producer.close()
    return sent
