"""The champion cache against a real MLflow store: start-up without models, alias moves, outages."""

from __future__ import annotations

import logging

import mlflow
import numpy as np
import pandas as pd
import pytest

from models import registry
from models.detectors import DetectorConfig, FamilyDetector
from models.post_rule import PostRule
from pipelines.detection.champions import ChampionCache, worker_champions
from pipelines.incidents.scoring import score_rows
from tests.conftest import config_for


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _register_skew(threshold: float, seed: int) -> str:
    rng = np.random.default_rng(seed)
    features = DetectorConfig("skew").features
    frame = pd.DataFrame(rng.normal(size=(200, len(features))), columns=list(features))
    detector = FamilyDetector(DetectorConfig("skew", seed=seed)).fit(frame, frame["records_in_max_over_mean"] > 0)
    with mlflow.start_run():
        return registry.log_detector(detector, PostRule(threshold, 1, 1), frame, "sentinel-skew")


@pytest.fixture
def store(tmp_path):
    config = config_for(tmp_path, detection__model_refresh_s="30")
    registry.ensure_experiment(config)
    yield config
    mlflow.set_tracking_uri(None)


def test_no_model_at_all_stops_start_up_with_what_to_run(store):
    with pytest.raises(registry.ModelUnavailable, match="sentinel train"):
        ChampionCache(store).require()


def test_an_alias_move_is_picked_up_after_the_refresh_interval_without_a_restart(store):
    first = _register_skew(0.5, seed=1)
    registry.set_alias("sentinel-skew", "champion", first)
    clock = Clock()
    cache = ChampionCache(store, clock=clock)
    assert cache.require()["skew"].version == first
    second = _register_skew(0.7, seed=2)
    registry.set_alias("sentinel-skew", "champion", second)
    clock.now = 29.0
    assert cache.current()["skew"].version == first  # not re-read before the interval is up
    clock.now = 31.0
    moved = cache.current()["skew"]
    assert (moved.version, moved.post_rule.threshold) == (second, 0.7)

    rows = pd.DataFrame({"vertex_id": ["v1", None], **{f: [1.0, 1.0] for f in DetectorConfig("skew").features}})
    scored = score_rows(rows, cache.models)
    assert scored[["row", "family", "model_version"]].values.tolist() == [[0, "skew", second]]  # vertex rows only
    assert 0.0 <= scored["score"].iloc[0] <= 1.0


def test_an_unreachable_registry_keeps_the_models_and_says_so(store, caplog, monkeypatch):
    version = _register_skew(0.5, seed=1)
    registry.set_alias("sentinel-skew", "champion", version)
    clock = Clock()
    cache = ChampionCache(store, clock=clock)
    cache.require()
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    store.mlflow.registry_uri = "http://127.0.0.1:9"  # nothing listens on the discard port
    clock.now = 100.0
    with caplog.at_level(logging.ERROR, logger="pipelines.detection.champions"):
        models = cache.current()
    assert models["skew"].version == version
    assert cache.registry_error is not None
    assert "model registry unreachable" in caplog.text and "scoring continues" in caplog.text

    # With nothing loaded yet, start-up fails and names the registry.
    with pytest.raises(registry.ModelUnavailable, match="cannot be reached"):
        ChampionCache(store).require()


def test_the_driver_checks_the_models_requirements_and_the_python_workers_do_not(store, caplog):
    """MLflow's check of the installed packages against a model's costs a Python worker about
    1.5 s of CPU; the driver's cache keeps it (its warning is in the job's log), a worker's skips it."""
    registry.set_alias("sentinel-skew", "champion", _register_skew(0.5, seed=1))
    [requirements] = list(store.state_dir.rglob("requirements.txt"))  # the one model logged
    requirements.write_text(requirements.read_text().rstrip("\n") + "\nscikit-learn==0.0.1\n")  # what no environment has
    with caplog.at_level(logging.WARNING, logger="mlflow"):
        ChampionCache(store).require()
    assert "scikit-learn (current:" in caplog.text and "required: scikit-learn==0.0.1" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mlflow"):
        worker = worker_champions(store)
        assert worker.check_environment is False and worker.require()["skew"].post_rule.threshold == 0.5
    assert "scikit-learn" not in caplog.text
