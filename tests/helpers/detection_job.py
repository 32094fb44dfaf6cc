"""Shared steps of the detection job's end-to-end tests: a config of its own, publish, run, read back."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from pipelines import simulator
from pipelines.config import SentinelConfig, TopicsConfig
from pipelines.contracts import input_event_key
from pipelines.io import kafka_clients

MINUTE = 60_000


def detection_config_for(broker_config: SentinelConfig, trained_store: SentinelConfig, folder: Path) -> SentinelConfig:
    """Topics, checkpoints and offline store of its own on the session broker, scoring with the
    session's champions."""
    suffix = uuid.uuid4().hex[:8]
    cfg = broker_config.model_copy(deep=True)
    cfg.topics = TopicsConfig(input=f"metrics-{suffix}", incidents=f"incidents-{suffix}", dead_letter=f"dlq-{suffix}")
    cfg.state_dir = folder
    cfg.spark.checkpoint_location = folder / "checkpoints"
    cfg.features.offline_path = folder / "feature_store"
    cfg.detection.metrics_file = folder / "metrics" / "sentinel.prom"
    cfg.mlflow = trained_store.mlflow.model_copy(deep=True)
    cfg.spark.trigger_interval = "1 second"
    kafka_clients.ensure_topics(cfg.kafka.bootstrap_servers, cfg.kafka.client_kwargs(),
                                [cfg.topics.input, cfg.topics.incidents, cfg.topics.dead_letter],
                                cfg.kafka.topic_partitions)
    return cfg


def job_environment(config: SentinelConfig, **extra: str) -> dict[str, str]:
    """The environment a ``sentinel run`` process of its own needs to run with ``config``
    (its state, topics and MLflow store; a 1 s trigger; metrics on any free port)."""
    return {**os.environ, "SENTINEL_STATE_DIR": str(config.state_dir),
            "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
            "SENTINEL_TOPICS__INPUT": config.topics.input, "SENTINEL_TOPICS__INCIDENTS": config.topics.incidents,
            "SENTINEL_TOPICS__DEAD_LETTER": config.topics.dead_letter,
            "SENTINEL_MLFLOW__TRACKING_URI": config.mlflow.tracking_uri,
            "SENTINEL_MLFLOW__REGISTRY_URI": config.mlflow.registry_uri,
            "SENTINEL_SPARK__TRIGGER_INTERVAL": "1 second", "SENTINEL_DETECTION__METRICS_PORT": "0", **extra}


def fleet(names: list[str], seed: int, minutes: int) -> list[simulator.SimulatedJob]:
    return [simulator.simulate_job(name, seed, i, minutes * MINUTE, cluster="e2e") for i, name in enumerate(names)]


def fleet_events(jobs) -> list[dict]:
    """The jobs' events as one producer sends them (in event-time order)."""
    return list(simulator.merged_events(jobs))


def publish(config: SentinelConfig, events: list[dict], raw: list[bytes] = ()) -> None:
    kafka = config.kafka
    producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
    for event in events:
        producer.send(config.topics.input, key=input_event_key(event), value=json.dumps(event).encode())
    for value in raw:
        producer.send(config.topics.input, key=b"bad/record", value=value)
    producer.flush()
    producer.close()


def read_topic(config: SentinelConfig, topic: str) -> list[dict]:
    kafka = config.kafka
    consumer = kafka_clients.make_consumer(kafka.bootstrap_servers, kafka.client_kwargs())
    try:
        return [json.loads(r.value) for r in kafka_clients.read_records(consumer, topic, timeout_s=30)]
    finally:
        consumer.close()


def write_jsonl(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def opened(incidents: list[dict], cluster: str = "e2e") -> list[dict]:
    return [i for i in incidents if i["event"] == "opened" and i["cluster"] == cluster]


def key(incident: dict) -> tuple:
    return incident["incident_id"], incident["event"], incident["updated_at"], incident["severity"]
