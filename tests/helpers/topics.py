"""Topics of the session's broker filled as the job and the collector fill them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from pipelines.config import KafkaConfig
from pipelines.contracts import input_event_key
from pipelines.datasets import read_jsonl
from pipelines.io import kafka_clients


def publish_incidents(kafka: KafkaConfig, topic: str, incidents: Iterable[dict | bytes]) -> None:
    """Incident events as the job publishes them (JSON, keyed by incident id); bytes are sent as
    they are, without a key (anyone may write to the incident topic)."""
    producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
    try:
        for incident in incidents:
            if isinstance(incident, bytes):
                producer.send(topic, value=incident)
            else:
                producer.send(topic, key=incident["incident_id"].encode(), value=json.dumps(incident).encode())
        producer.flush()
    finally:
        producer.close()


def publish_event_files(kafka: KafkaConfig, topic: str, event_files: Iterable[Path]) -> None:
    """The events of JSON-lines files as the collector publishes them (keyed by cluster and job)."""
    producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
    try:
        for path in event_files:
            for event in read_jsonl(path):
                producer.send(topic, key=input_event_key(event), value=json.dumps(event).encode())
        producer.flush()
    finally:
        producer.close()


def report_topics(kafka: KafkaConfig, new_topic: Callable[[], str], incidents: Iterable[dict | bytes],
                  event_files: Iterable[Path]) -> dict[str, str]:
    """A fresh incident topic and input topic holding ``incidents`` and the jobs' events (what
    `sentinel report` reads without files); returns the settings that point the command at them."""
    incident_topic, input_topic = new_topic(), new_topic()
    publish_incidents(kafka, incident_topic, incidents)
    publish_event_files(kafka, input_topic, event_files)
    return {"SENTINEL_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "SENTINEL_TOPICS__INCIDENTS": incident_topic, "SENTINEL_TOPICS__INPUT": input_topic}
