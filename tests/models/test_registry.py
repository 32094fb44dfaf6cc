"""Detectors round-trip through a real MLflow store (sqlite in a temp folder), by alias."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from models import registry
from models.detectors import DetectorConfig, FamilyDetector
from models.post_rule import PostRule
from tests.conftest import config_for


@pytest.fixture
def mlflow_store(tmp_path):
    config = config_for(tmp_path)
    registry.ensure_experiment(config)
    yield config
    mlflow.set_tracking_uri(None)


def _rows(n=300, seed=0):
    rng = np.random.default_rng(seed)
    features = DetectorConfig("skew").features
    frame = pd.DataFrame(rng.normal(size=(n, len(features))), columns=list(features))
    frame.loc[::7, "busy_max"] = np.nan  # missing values are part of real rows
    return frame, (frame["records_in_max_over_mean"] > 0.5).to_numpy()


def test_loading_by_alias_returns_detector_post_rule_and_metadata(mlflow_store):
    frame, target = _rows()
    detector = FamilyDetector(DetectorConfig("skew", seed=1)).fit(frame, target)
    rule = PostRule(0.7, 2, 3)
    with mlflow.start_run():
        version = registry.log_detector(detector, rule, frame, "sentinel-skew")
    assert registry.alias_version("sentinel-skew", registry.CHALLENGER) is None
    registry.set_alias("sentinel-skew", registry.CHALLENGER, version)

    loaded = registry.load_detector("sentinel-skew", registry.CHALLENGER)
    assert (loaded.version, loaded.alias) == (version, "challenger")
    assert loaded.post_rule == rule
    assert loaded.config == detector.config
    assert loaded.metadata["features"] == list(detector.config.features)
    assert loaded.metadata["training_data_fingerprint"] == registry.data_fingerprint(frame.loc[:, list(detector.config.features)])
    assert np.array_equal(loaded.detector.score(frame), detector.score(frame))
    # The generic pyfunc path scores too, with the logged signature.
    pyfunc = mlflow.pyfunc.load_model("models:/sentinel-skew@challenger")
    assert np.allclose(pyfunc.predict(frame.loc[:, list(detector.config.features)]).to_numpy(), detector.score(frame))


def test_a_missing_alias_says_what_to_do(mlflow_store):
    with pytest.raises(registry.ModelUnavailable, match="train one with `sentinel train`"):
        registry.load_detector("sentinel-state-leak", registry.CHAMPION)


def test_fingerprint_ignores_row_order_but_not_values():
    frame, _ = _rows(50)
    assert registry.data_fingerprint(frame) == registry.data_fingerprint(frame.sample(frac=1, random_state=3))
    changed = frame.copy()
    changed.iloc[0, 0] += 1
    assert registry.data_fingerprint(changed) != registry.data_fingerprint(frame)


def test_models_go_to_the_configured_artifact_root_and_pin_only_the_major(mlflow_store, tmp_path, monkeypatch):
    """A database store's artifacts go where the config says (MLflow's default is ./mlruns of the
    current folder), and a model asks for this project at its major version, not the exact build."""
    monkeypatch.chdir(tmp_path)  # where ./mlruns would appear
    frame, target = _rows()
    detector = FamilyDetector(DetectorConfig("skew", seed=1)).fit(frame, target)
    with mlflow.start_run():
        version = registry.log_detector(detector, PostRule(0.7, 2, 3), frame, "sentinel-skew")
    artifacts = Path(mlflow_store.state_dir) / "mlflow" / "artifacts" / mlflow_store.mlflow.experiment
    requirements = list(artifacts.rglob("requirements.txt"))
    assert len(requirements) == 1 and not (tmp_path / "mlruns").exists()
    pins = requirements[0].read_text().split()
    assert "checkpoint-sentinel==0.*" in pins
    assert not [p for p in pins if p.startswith("checkpoint-sentinel==0.1")]
    source = mlflow.MlflowClient().get_model_version("sentinel-skew", version).source
    assert source.startswith("models:/") or source.startswith(artifacts.as_uri())
