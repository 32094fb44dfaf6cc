"""The configuration reference (docs/CONFIGURATION.md), generated from the config models.

Every key of :class:`~pipelines.config.SentinelConfig` with its type, default and description, one
table per section, so that the reference cannot drift from the code (a test compares the committed
page with this output). Usage: ``python -m pipelines.config_reference > docs/CONFIGURATION.md``.
"""

from __future__ import annotations

import inspect
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel, BeforeValidator, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from pipelines.config import base as config_base
from pipelines.config import SentinelConfig

HEADER = """\
# Configuration reference

Generated from the config models in `pipelines/config/` by
`python -m pipelines.config_reference > docs/CONFIGURATION.md`; a test keeps it current.

One typed config (pydantic, unknown keys rejected). Sources, strongest first:

1. environment variables `SENTINEL_<SECTION>__<KEY>`, e.g. `SENTINEL_KAFKA__BOOTSTRAP_SERVERS=kafka:9092`
   (values are YAML: `SENTINEL_KAFKA__CLIENT_OPTIONS='{client_id: sentinel-eu1}'`, a mapping merging into
   the file's key by key; secrets are taken as they are);
2. a YAML file: `--config`, `$SENTINEL_CONFIG`, or `./sentinel.yaml` when present;
3. the defaults below, which point at the embedded stack.

A bad config exits with code 2 and names every offending key. Relative paths are made absolute
against the config file's folder (the current folder when there is no file); paths left unset
default to folders under `state_dir`. A *local path* is read on the host itself (a `file://` URI
is accepted, another scheme is an error); a *path or URI* may also be `s3://` (or `s3a://`),
`gs://`, `hdfs://`, `abfs(s)://` (see [DEPLOYMENT.md](DEPLOYMENT.md#shared-storage-checkpoints-and-state-on-s3-gcs-hdfs)).
[`infra/sentinel.example.yaml`](../infra/sentinel.example.yaml) lists every key with its default
(a test keeps its keys equal to the models').
"""


_BOUND_ATTRIBUTES = {Ge: "ge", Gt: "gt", Le: "le", Lt: "lt"}


def _constraints(metadata: list[Any]) -> list[str]:
    bounds = []
    for item in metadata:
        for kind, symbol in ((Ge, ">="), (Gt, ">"), (Le, "<="), (Lt, "<")):
            if isinstance(item, kind):
                bounds.append(f"{symbol} {getattr(item, _BOUND_ATTRIBUTES[kind])}")
        if isinstance(item, MinLen):
            bounds.append(f"at least {item.min_length} long")
        if isinstance(item, MaxLen):
            bounds.append(f"at most {item.max_length} long")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            bounds.append(f"matches `{pattern}`")
    return bounds


def type_name(annotation: Any) -> str:
    """A reader's name for a field's type: ``int``, ``local path | null``, ``"a" | "b"``, ``list of ...``."""
    if annotation is type(None):
        return "null"
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *metadata = get_args(annotation)
        for item in metadata:
            if isinstance(item, BeforeValidator):
                if item.func is config_base._local_path:
                    return "local path"
                if item.func is config_base._storage_location:
                    return "path or URI"
        return type_name(base)
    if origin is Literal:
        return " | ".join(f'"{value}"' for value in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in get_args(annotation))
    if origin is list:
        (item,) = get_args(annotation)
        return f"list of {type_name(item)}"
    if origin is dict:
        key, value = get_args(annotation)
        return f"mapping {type_name(key)} -> {type_name(value)}"
    if annotation is Any:
        return "any"
    if annotation is SecretStr:
        return "secret"
    if annotation is Path:
        return "path"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation.__name__
    return getattr(annotation, "__name__", str(annotation))


def field_type(field: FieldInfo) -> str:
    """The type of a field; pydantic moves a plain ``Annotated`` type's metadata into the field."""
    return type_name(Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation)


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)) and not value:
        return "[]" if isinstance(value, list) else "{}"
    if isinstance(value, Path):
        return str(value)
    return str(value)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined:
        return "required"
    return f"`{_yaml_scalar(value)}`"


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    return annotation if inspect.isclass(annotation) and issubclass(annotation, BaseModel) else None


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        return _nested_model(item)
    return None


def _cell(text: str | None) -> str:
    """One table cell: one line, pipes escaped, and ``<`` outside code spans escaped so that a
    placeholder such as <state_dir> is shown, not taken for an HTML tag."""
    spans = " ".join((text or "").split()).replace("|", "\\|").split("`")
    return "`".join(span if index % 2 else span.replace("<", "&lt;") for index, span in enumerate(spans))


def _docstring(model: type[BaseModel]) -> str | None:
    doc = model.__dict__.get("__doc__")
    return inspect.cleandoc(doc) if doc else None


def sections(model: type[BaseModel] = SentinelConfig, prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """Every (key path, model) to document, the root first, depth first in the models' order."""
    found = [(prefix, model)]
    for name, field in model.model_fields.items():
        nested = _nested_model(field.annotation)
        if nested is not None:
            found += sections(nested, f"{prefix}{name}.")
            continue
        item = _list_item_model(field.annotation)
        if item is not None:
            found += sections(item, f"{prefix}{name}[].")
    return found


def documented_keys(model: type[BaseModel] = SentinelConfig) -> set[str]:
    """Every key path the reference lists (``detection.job_overrides[].job_name`` for a list's items)."""
    keys = set()
    for prefix, section in sections(model):
        for name, field in section.model_fields.items():
            keys.add(prefix + name)
    return keys


def markdown(model: type[BaseModel] = SentinelConfig) -> str:
    """The whole reference page."""
    parts = [HEADER]
    for prefix, section in sections(model):
        title = prefix.rstrip(".") or "top level"
        parts.append(f"\n## `{title}`\n" if prefix else f"\n## {title}\n")
        if (doc := _docstring(section)) is not None:
            parts.append("\n" + doc + "\n")
        parts.append("\n| key | type | default | description |\n|---|---|---|---|\n")
        for name, field in section.model_fields.items():
            nested = _nested_model(field.annotation) or _list_item_model(field.annotation)
            description = _cell(field.description)
            if nested is not None:
                link = f"{prefix}{name}" + ("[]" if _list_item_model(field.annotation) else "")
                see = f"see [`{link}`](#{_anchor(link)})"
                description = f"{description} ({see})" if description else "S" + see[1:]
            kind = field_type(field)
            bounds = _constraints(field.metadata)
            if bounds:
                kind += " (" + ", ".join(bounds) + ")"
            default = "(section)" if _nested_model(field.annotation) else default_text(field)
            parts.append(f"| `{prefix}{name}` | {_cell(kind)} | {_cell(default)} | {description} |\n")
    return "".join(parts)


def _anchor(key: str) -> str:
    """GitHub's anchor of the heading ``## `key` ``: lower case, punctuation but - and _ dropped."""
    return "".join(ch for ch in key.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


if __name__ == "__main__":
    print(markdown(), end="")
