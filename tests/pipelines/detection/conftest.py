"""Configs for the detection job's tests: topics of their own, the session's trained champions."""

from __future__ import annotations

import gc

import pytest

from tests.helpers.detection_job import detection_config_for


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
