"""The resolved config as a reader sees it (``sentinel config show``): every key, secrets masked,
and where the values came from (``sentinel config validate``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

from pipelines.config.base import _secret_key
from pipelines.config.loading import DEFAULT_CONFIG_FILE, ENV_PREFIX, ENV_RESERVED, SentinelConfig

MASK = "**********"
# user:password@ in a URI (a tracking server's, a database store's): the password is a secret too.
_URI_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/:@\s]+):[^/@\s]+@", re.IGNORECASE)


def masked(config: SentinelConfig) -> dict[str, Any]:
    """Every key with its resolved value; secret types, secret-looking keys and passwords in URIs masked."""
    return _mask(config.model_dump(mode="json"))


def _mask(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, key) for v in value]
    if isinstance(value, str):
        if _secret_key(key) and not key.endswith("_file") and value:
            return MASK
        return _URI_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", value)
    return value


def lookup(data: Mapping[str, Any], dotted: str) -> Any:
    """``kafka.bootstrap_servers`` in the masked dump; KeyError names the first unknown part."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(part)
        node = node[part]
    return node


def sources(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Where the values came from, strongest first: the SENTINEL_ variables, the file, the defaults."""
    environ = os.environ if environ is None else environ
    names = sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in ENV_RESERVED)
    lines = [f"environment: {', '.join(names)}"] if names else []
    explicit = path or environ.get("SENTINEL_CONFIG")
    file_path = Path(explicit) if explicit else (Path(DEFAULT_CONFIG_FILE) if Path(DEFAULT_CONFIG_FILE).is_file()
                                                 else None)
    if file_path is not None:
        lines.append(f"file: {file_path.resolve()}")
    lines.append("defaults: the rest (docs/CONFIGURATION.md)")
    return lines
