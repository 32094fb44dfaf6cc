"""Detectors in MLflow: logged with everything needed to score *and decide*, loaded by alias.

A registered version is a pyfunc model whose Python object carries the fitted detector, its
post-rule, the feature list and feature-set version it expects, and the fingerprint of the data
it was trained on. ``predict`` returns the score; the job applies the post-rule it loads with
it. Aliases (``champion``, ``challenger``), never stages, say which version serves.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import pickle
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import mlflow
import pandas as pd
from mlflow import MlflowClient
from mlflow.models import infer_signature
from mlflow.pyfunc import PythonModel

from models.detectors import DetectorConfig, FamilyDetector, NoveltyDetector
from models.post_rule import PostRule
from pipelines.config import SentinelConfig
from pipelines.errors import SetupError
from pipelines.io.reachability import cap_mlflow_retries
from pipelines.io.storage import Location

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

CHAMPION, CHALLENGER = "champion", "challenger"


class ModelUnavailable(SetupError, RuntimeError):
    """No model under that name and alias, or the registry cannot be reached."""


# Stores MLflow opens in-process through SQLAlchemy: only the full ``mlflow`` distribution has it.
DATABASE_STORES = ("sqlite", "postgresql", "mysql", "mssql")
STACK_EXTRA = "pip install 'checkpoint-sentinel[stack]'"


def full_mlflow_installed() -> bool:
    """True with the ``mlflow`` distribution (server, UI, database stores); False with only
    ``mlflow-skinny``, the client the job's lean runtime needs."""
    try:
        importlib.metadata.distribution("mlflow")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _check_store_support(uri: str | None) -> None:
    scheme = (uri or "").split(":", 1)[0].split("+", 1)[0].lower()
    if scheme in DATABASE_STORES and not full_mlflow_installed():
        raise ModelUnavailable(
            f"the MLflow store {uri} is a database, which only full MLflow opens in-process; this install "
            f"has the MLflow client alone (mlflow-skinny). Point mlflow.tracking_uri at a tracking server "
            f"(SENTINEL_MLFLOW__TRACKING_URI=http://mlflow.internal:5000), or install the stack extra: {STACK_EXTRA}")


class SentinelDetectorModel(PythonModel):
    """The pyfunc face of a detector: ``predict`` scores feature rows."""

    def __init__(self, detector: FamilyDetector | NoveltyDetector, post_rule: PostRule | None, metadata: dict[str, Any]):
        self.detector = detector
        self.post_rule = post_rule
        self.metadata = metadata

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.Series:
        return pd.Series(self.detector.score(model_input), index=model_input.index, name="score")


@dataclass(frozen=True)
class LoadedDetector:
    name: str
    version: str
    alias: str
    detector: FamilyDetector | NoveltyDetector
    post_rule: PostRule | None
    metadata: dict[str, Any]

    @property
    def config(self) -> DetectorConfig:
        return self.detector.config


def use_config(config: SentinelConfig) -> None:
    """Point MLflow at the configured tracking and registry stores, its HTTP retries capped."""
    cap_mlflow_retries()
    _check_store_support(config.mlflow.tracking_uri)
    _check_store_support(config.mlflow.registry_uri)
    mlflow.set_tracking_uri(config.mlflow.tracking_uri)
    mlflow.set_registry_uri(config.mlflow.registry_uri)


def ensure_experiment(config: SentinelConfig) -> str:
    """Make ``mlflow.experiment`` the active experiment, created with ``mlflow.artifact_root`` as
    its artifact location when it does not exist yet (MLflow's own default for a database store
    is ./mlruns of the current folder). Returns where its artifacts go."""
    use_config(config)
    name, root = config.mlflow.experiment, config.mlflow.artifact_root
    experiment = MlflowClient().get_experiment_by_name(name)
    if experiment is None:
        location = f"{root.rstrip('/')}/{name}" if root else None
        MlflowClient().create_experiment(name, artifact_location=location)
    experiment = mlflow.set_experiment(name)
    return experiment.artifact_location


def pip_requirements() -> list[str]:
    """What a logged detector needs to load: this project at the same major version (the
    detector's classes live in it; any release of that major reads its models), the libraries
    of the pickled objects at the versions that wrote them (to the minor for scikit-learn, whose
    pickles are only promised to load in the release that wrote them)."""
    import cloudpickle
    import numpy
    import sklearn
    from importlib.metadata import version

    def minor(v: str) -> str:
        return ".".join(v.split(".")[:2])

    major = version("checkpoint-sentinel").split(".")[0]
    return [f"checkpoint-sentinel=={major}.*", f"mlflow=={mlflow.__version__.split('.')[0]}.*",
            f"scikit-learn=={minor(sklearn.__version__)}.*", f"numpy=={numpy.__version__.split('.')[0]}.*",
            f"pandas=={pd.__version__.split('.')[0]}.*", f"cloudpickle=={cloudpickle.__version__.split('.')[0]}.*"]


def data_fingerprint(frame: pd.DataFrame) -> str:
    """A stable hash of the training rows (order-independent), logged with the model."""
    hashed = pd.util.hash_pandas_object(frame.sort_index(axis=1), index=False)
    return hashlib.sha256(hashed.sort_values().to_numpy().tobytes()).hexdigest()[:16]


def log_detector(detector: FamilyDetector | NoveltyDetector, post_rule: PostRule | None, training_rows: pd.DataFrame,
                 registered_name: str, extra_metadata: dict[str, Any] | None = None) -> str:
    """Log and register the detector in the active run; returns the new version."""
    features = list(detector.config.features)
    example = training_rows.loc[:, features].head(5).astype("float64")
    metadata = {
        "family": detector.config.family,
        "features": features,
        "feature_set_version": detector.config.feature_set_version,
        "detector_config": detector.config.to_dict(),
        "post_rule": post_rule.to_dict() if post_rule else None,
        "training_data_fingerprint": data_fingerprint(training_rows.loc[:, features]),
        **(extra_metadata or {}),
    }
    model = SentinelDetectorModel(detector, post_rule, metadata)
    signature = infer_signature(example, model.predict(None, example))
    info = mlflow.pyfunc.log_model(name=detector.config.family, python_model=model, signature=signature,
                                   input_example=example, registered_model_name=registered_name,
                                   pip_requirements=pip_requirements(),
                                   metadata={k: v for k, v in metadata.items() if k != "detector_config"})
    mlflow.log_dict(metadata, f"{detector.config.family}/sentinel_metadata.json")
    return str(info.registered_model_version)


def set_alias(registered_name: str, alias: str, version: str) -> None:
    MlflowClient().set_registered_model_alias(registered_name, alias, version)


MISSING_ERROR_CODES = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def alias_version(registered_name: str, alias: str, raise_on_unreachable: bool = False) -> str | None:
    """The version an alias points at, or None when the model or the alias does not exist.

    Any other registry error (unreachable, server error) also gives None, unless
    ``raise_on_unreachable``, when it raises :class:`ModelUnavailable`: a caller that holds
    models must not mistake an outage for "no champion".
    """
    try:
        return str(MlflowClient().get_model_version_by_alias(registered_name, alias).version)
    except mlflow.exceptions.MlflowException as exc:
        if exc.error_code in MISSING_ERROR_CODES or not raise_on_unreachable:
            return None
        raise ModelUnavailable(f"model registry {mlflow.get_registry_uri()}: {exc}") from exc


def load_detector(registered_name: str, alias: str, check_environment: bool = True) -> LoadedDetector:
    """``models:/<name>@<alias>``: the detector, its post-rule and its metadata.

    ``check_environment``: MLflow warns when the installed packages or Python differ from the
    model's; the check scans every installed distribution (about 1.5 s of CPU in a fresh
    process). A process whose environment the caller has checked already can skip it."""
    version = alias_version(registered_name, alias)
    if version is None:
        raise ModelUnavailable(f"no model {registered_name!r} with alias {alias!r} in {mlflow.get_registry_uri()}; "
                               "train one with `sentinel train`")
    loaded = mlflow.pyfunc.load_model(f"models:/{registered_name}@{alias}",
                                      suppress_warnings=not check_environment).unwrap_python_model()
    return LoadedDetector(registered_name, version, alias, loaded.detector, loaded.post_rule, loaded.metadata)


class HeldCopies:
    """The job's own copies of the champions it scored with, on the storage of its checkpoints
    (which every executor reaches): ``<name>/<version>.pickle`` for each version loaded, and
    ``<name>@<alias>.json`` naming the version the alias pointed at when one was last loaded.
    A Python worker started while the registry cannot be reached scores with these instead of
    stopping the job. Written by the job's own processes from what they loaded from the
    registry, read only by them: the same packages on both sides."""

    def __init__(self, folder: Location):
        self.folder = folder

    def _copy(self, name: str, version: str) -> Location:
        return self.folder / quote(name, safe="") / f"{quote(str(version), safe='')}.pickle"

    def _pointer(self, name: str, alias: str) -> Location:
        return self.folder / f"{quote(name, safe='')}@{quote(alias, safe='')}.json"

    def keep(self, model: LoadedDetector) -> None:
        """Write ``model``'s copy (once per version) and point its alias at it."""
        copy = self._copy(model.name, model.version)
        if not copy.exists():
            _write_whole(copy, pickle.dumps({"name": model.name, "version": model.version, "detector": model.detector,
                                             "post_rule": model.post_rule, "metadata": model.metadata},
                                            protocol=pickle.HIGHEST_PROTOCOL))
        _write_whole(self._pointer(model.name, model.alias), json.dumps({"version": model.version}).encode())

    def copy_of(self, name: str, version: str, alias: str) -> LoadedDetector | None:
        """The job's copy of ``name`` at ``version``, or None when it has none."""
        copy = self._copy(name, version)
        if not copy.exists():
            return None
        held = pickle.loads(copy.read_bytes())
        return LoadedDetector(name, str(version), alias, held["detector"], held["post_rule"], held["metadata"])

    def last(self, name: str, alias: str) -> LoadedDetector | None:
        """The version ``alias`` named when the job last loaded ``name``, or None."""
        pointer = self._pointer(name, alias)
        if not pointer.exists():
            return None
        return self.copy_of(name, json.loads(pointer.read_text())["version"], alias)


def _write_whole(location: Location, data: bytes) -> None:
    """Replace the file whole, also when several processes write it at once (every Python worker
    keeps the champions it loads): on local disk through a temporary file of this process's own
    (``Location.write_bytes`` shares one per file), on an object store by one PUT."""
    if not location.is_local:
        location.write_bytes(data)
        return
    import tempfile

    path = location.local_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
