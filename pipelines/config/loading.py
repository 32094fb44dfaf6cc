"""The whole config and how it is loaded: the file, the environment, validation, resolved paths.

Every path, topic, URI, trigger and threshold lives here, not in code. Values come from, in order
of precedence: ``SENTINEL_...`` environment variables, a YAML file (``--config``, ``$SENTINEL_CONFIG``
or ``./sentinel.yaml`` when present), then the defaults below, which point at the embedded stack.

Environment overrides name a key path with double underscores: ``SENTINEL_KAFKA__BOOTSTRAP_SERVERS``
sets ``kafka.bootstrap_servers``; values are parsed as YAML scalars or flow collections, so
``SENTINEL_KAFKA__CLIENT_OPTIONS='{security_protocol: SASL_SSL}'`` works (a mapping merges into the
file's mapping key by key). Unknown keys, in the file
or in the environment, are errors that name the key.
"""


from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import Field, ValidationError

from pipelines.config.base import ConfigError, LocalPath, _secret_key, _Strict
from pipelines.config.detection import DetectionConfig, FeaturesConfig, MlflowConfig, SparkConfig
from pipelines.config.kafka import KafkaConfig, TopicsConfig
from pipelines.config.services import AlertConfig, CollectorConfig, LabConfig, StackConfig, StorageConfig
from pipelines.io.storage import Location, is_uri, normalize

ENV_PREFIX = "SENTINEL_"
# Variables with the prefix that are not key paths.
ENV_RESERVED = {"SENTINEL_CONFIG"}
DEFAULT_CONFIG_FILE = "sentinel.yaml"
# The checkout the package runs from (an editable install): where the committed corpus lives.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class SentinelConfig(_Strict):
    state_dir: LocalPath = Field(Path(".sentinel"), description="Project-local state: logs, PIDs, stores.")
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    topics: TopicsConfig = Field(default_factory=TopicsConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    features: FeaturesConfig = Field(default_factory=FeaturesConfig)
    detection: DetectionConfig = Field(default_factory=DetectionConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    stack: StackConfig = Field(default_factory=StackConfig)
    collector: CollectorConfig = Field(default_factory=CollectorConfig)
    alert: AlertConfig = Field(default_factory=AlertConfig)
    lab: LabConfig = Field(default_factory=LabConfig)

    def resolved(self, base_dir: Path) -> "SentinelConfig":
        """Make relative paths absolute against ``base_dir`` and fill the derived defaults."""
        cfg = self.model_copy(deep=True)
        cfg.state_dir = _absolute(cfg.state_dir, base_dir)
        cfg.spark.checkpoint_location = normalize(cfg.spark.checkpoint_location or cfg.state_dir / "checkpoints",
                                                  base_dir)
        cfg.features.offline_path = normalize(cfg.features.offline_path or cfg.state_dir / "feature_store", base_dir)
        cfg.detection.dead_letter_spool = _absolute(cfg.detection.dead_letter_spool or cfg.state_dir /
                                                    "dead_letter_spool", base_dir)
        cfg.detection.metrics_file = _absolute(cfg.detection.metrics_file or cfg.state_dir / "metrics" / "sentinel.prom",
                                               base_dir)
        cfg.collector.state_dir = normalize(cfg.collector.state_dir or cfg.state_dir / "collector", base_dir)
        for security in (cfg.kafka.security, cfg.collector.security, cfg.alert.security):
            for key in security.FILE_KEYS:
                if getattr(security, key) is not None:
                    setattr(security, key, _absolute(getattr(security, key), base_dir))
        cfg.lab.flink_venv = _absolute(cfg.lab.flink_venv or LabConfig.default_venv(cfg.lab.flink_version), base_dir)
        cfg.lab.datasets_dir = _absolute(cfg.lab.datasets_dir or cfg.state_dir / "lab", base_dir)
        cfg.lab.corpus_dir = _absolute(cfg.lab.corpus_dir or PROJECT_ROOT / "data" / "lab", base_dir)
        mlflow_dir = cfg.state_dir / "mlflow"
        if cfg.mlflow.tracking_uri is None:
            cfg.mlflow.tracking_uri = f"sqlite:///{mlflow_dir / 'mlflow.db'}"
        if cfg.mlflow.artifact_root is None and not cfg.mlflow.tracking_server:
            # Without this, MLflow puts a database store's artifacts in ./mlruns of whatever
            # folder the command ran in.
            cfg.mlflow.artifact_root = str(mlflow_dir / "artifacts")
        if cfg.mlflow.artifact_root is not None and not is_uri(cfg.mlflow.artifact_root):
            cfg.mlflow.artifact_root = _absolute(Path(cfg.mlflow.artifact_root), base_dir).as_uri()
        if cfg.mlflow.registry_uri is None:
            cfg.mlflow.registry_uri = cfg.mlflow.tracking_uri
        return cfg

    def location(self, value: str | Path) -> Location:
        """A configured folder as a :class:`~pipelines.io.storage.Location`, reached with ``storage``."""
        return Location.of(value, self.storage)

    def checkpoint_dir(self, query_name: str) -> Location:
        """Each streaming query gets its own checkpoint folder: sharing one corrupts both."""
        return self.location(self.spark.checkpoint_location) / query_name

    @property
    def offline_store(self) -> Location:
        return self.location(self.features.offline_path)


def _absolute(path: Path, base_dir: Path) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() else (base_dir / path).resolve()


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Turn ``SENTINEL_A__B=value`` variables into a nested dict ``{"a": {"b": value}}``."""
    overrides: dict[str, Any] = {}
    names: list[str] = []
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in ENV_RESERVED:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX):].split("__")]
        if not all(path):
            raise ConfigError(f"{name}: an empty key in the path (use single names joined by '__')")
        try:
            # A secret is taken as it is: as YAML, "no" would become False and "0x1F" a number.
            value = raw if _secret_key(path[-1]) and not path[-1].endswith("_file") else (
                yaml.safe_load(raw) if raw.strip() else None)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{name}: not a valid YAML value ({exc})") from exc
        node = overrides
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: conflicts with another SENTINEL_ variable")
        node[path[-1]] = value
        names.append(name)
    return overrides, names


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _format_validation_error(exc: ValidationError, origin: str) -> str:
    lines = [f"invalid configuration ({origin}):"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "<root>"
        if error["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; docs/CONFIGURATION.md lists the keys)"
        else:
            message = error["msg"]
            if "input" in error and not isinstance(error["input"], dict) and not _secret_key(key):
                message += f" (got {error['input']!r})"
        lines.append(f"  {key}: {message}")
    return "\n".join(lines)


def load_config(
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> SentinelConfig:
    """Load the YAML file (if any), apply environment overrides, validate and resolve paths.

    ``path`` None means ``$SENTINEL_CONFIG``, else ``./sentinel.yaml`` if it exists, else defaults only.
    Relative paths in the config are resolved against the config file's folder (or the current
    folder when there is no file). Raises :class:`ConfigError` with every offending key.
    """
    environ = os.environ if environ is None else environ
    explicit = path or environ.get("SENTINEL_CONFIG")
    file_path: Path | None = None
    if explicit:
        file_path = Path(explicit).expanduser()
        if not file_path.is_file():
            raise ConfigError(f"config file {file_path} does not exist")
    elif Path(DEFAULT_CONFIG_FILE).is_file():
        file_path = Path(DEFAULT_CONFIG_FILE)

    data: dict[str, Any] = {}
    origins = []
    if file_path is not None:
        try:
            loaded = yaml.safe_load(file_path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {file_path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {file_path} must hold a mapping of keys, not {type(loaded).__name__}")
        data = loaded
        origins.append(str(file_path))
    overrides, env_names = _env_overrides(environ)
    if env_names:
        origins.append("environment: " + ", ".join(env_names))
    data = _deep_merge(data, overrides)
    origin = "; ".join(origins) or "defaults"
    try:
        config = SentinelConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, origin)) from None
    if base_dir is None:
        base_dir = file_path.resolve().parent if file_path is not None else Path.cwd()
    resolved = config.resolved(base_dir)
    if missing := resolved.kafka.security.missing_files() + resolved.collector.security.missing_files("collector") \
            + resolved.alert.security.missing_files("alert"):
        raise ConfigError(f"invalid configuration ({origin}):\n  " + "\n  ".join(missing))
    return resolved
