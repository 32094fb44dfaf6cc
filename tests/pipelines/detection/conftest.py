"""Configs for the detection job's tests: topics of their own, the session's trained champions."""

from __future__ import annotations

import gc
import uuid
from pathlib import Path

import pytest

from pipelines.config import TopicsConfig
from pipelines.io import kafka_clients


def detection_config_for(broker_config, trained_store, folder: Path):
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


@pytest.fixture
def detection_config(broker_config, trained_store, tmp_path):
    return detection_config_for(broker_config, trained_store, tmp_path)


@pytest.fixture
def collector():
    """A Python worker's collector; afterwards this interpreter's collector as it was before."""
    from pipelines.detection.worker_gc import CollectorBetweenTasks

    made = CollectorBetweenTasks()
    yield made
    if made.after_collection in gc.callbacks:
        gc.callbacks.remove(made.after_collection)
    gc.unfreeze()
    gc.enable()
