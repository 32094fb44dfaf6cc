"""What every config section is built from: the strict base model, the path types, URL and secret checks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from pipelines.errors import UsageError
from pipelines.io.storage import is_uri, local_only, normalize


class ConfigError(UsageError):
    """A configuration that cannot be used; the message names the key and what is wrong."""


class _Strict(BaseModel):
    # Numbers are accepted for string keys because environment values are parsed as YAML.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, coerce_numbers_to_str=True)


def _local_path(value: Any) -> Any:
    return local_only(value, "this key") if isinstance(value, str) else value


def _storage_location(value: Any) -> Any:
    # A URI is checked here, so its error names the key; a relative path is made absolute by resolved().
    if isinstance(value, Path):
        return str(value)
    return normalize(value, Path.cwd()) if isinstance(value, str) and is_uri(value) else value


# A path on this host (a file:// URI is one too): PID files, logs, a Prometheus text file, certificates.
LocalPath = Annotated[Path, BeforeValidator(_local_path)]
# A folder on local disk or on shared storage (s3://, gs://, hdfs://, abfs(s)://), for Spark and the
# job's own files alike (pipelines/io/storage.py).
StorageLocation = Annotated[str, BeforeValidator(_storage_location)]


_SECRET_WORDS = ("password", "secret", "jaas", "token")


def _secret_key(key: str) -> bool:
    return any(word in key.lower() for word in _SECRET_WORDS)


def _http_url(value: str) -> str:
    """A base URL of an HTTP API, without its trailing slash."""
    if not re.fullmatch(r"https?://[^/\s]+(/.*)?", value):
        raise ValueError(f"'{value}' is not an http(s):// URL")
    return value.rstrip("/")
