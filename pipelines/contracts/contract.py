"""The contracts' JSON Schemas as objects: each a :class:`Contract` with its two validators and
its generated Spark schema, and the values the contracts enumerate.

Two validators check the same schema: :meth:`Contract.accepts`, compiled by ``jsonschema-rs``
(Rust), is the hot path (every input record; the fastest of those compared in BENCHMARKS.md,
"Input validation per record (`benchmarks/validation.py`)");
:meth:`Contract.errors`, ``jsonschema``'s, explains a document that is refused with every way it
breaks the contract. ``tests/pipelines/test_contracts.py`` holds them to the same verdicts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from typing import Any, Iterable

import jsonschema_rs
from jsonschema import Draft202012Validator
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from pipelines.families import FAMILIES

SCHEMA_VERSION = 1
EVENT_KINDS = ("checkpoint", "vertex_metrics", "job_status")
# Flink's job states after which a job runs no more (a ``job_status`` event's ``state``): the
# collector then leaves the job alone, and its incidents end with it.
TERMINAL_JOB_STATES = ("FINISHED", "CANCELED", "FAILED")
INCIDENT_FAMILIES = FAMILIES
INCIDENT_EVENTS = ("opened", "updated", "resolved")
SEVERITIES = ("info", "warning", "critical")

_SCALARS: dict[str, DataType] = {
    # Every JSON integer is a long: sizes and epoch-ms timestamps overflow 32 bits.
    "integer": LongType(),
    "number": DoubleType(),
    "string": StringType(),
    "boolean": BooleanType(),
}


def input_event_key(event: dict) -> bytes:
    """The input topic's record key, ``<cluster>/<job_id>``: a job's events share a partition, in order."""
    return f"{event['cluster']}/{event['job_id']}".encode()


class ContractError(ValueError):
    """A schema file that cannot be turned into a Spark schema."""


@dataclass(frozen=True)
class Contract:
    """One versioned JSON Schema, with its validator and its generated Spark schema."""

    file_name: str
    schema: dict[str, Any] = field(repr=False)

    @classmethod
    def load(cls, file_name: str) -> "Contract":
        text = resources.files(__package__).joinpath("schemas", file_name).read_text()
        return cls(file_name, json.loads(text))

    @cached_property
    def validator(self) -> Draft202012Validator:
        return Draft202012Validator(self.schema)

    @cached_property
    def _compiled(self):
        # Without the relative $id, which the validator's resolver would take for a remote document.
        return jsonschema_rs.validator_for({k: v for k, v in self.schema.items() if k != "$id"})

    def accepts(self, document: Any) -> bool:
        """Whether ``document`` keeps the contract (the fast check; :meth:`errors` says why not)."""
        return self._compiled.is_valid(document)

    def errors(self, document: Any) -> list[str]:
        """Every way ``document`` breaks the contract, as messages naming the field path."""
        found = sorted(self.validator.iter_errors(document), key=lambda e: list(e.absolute_path))
        return [
            (f"{'.'.join(str(p) for p in err.absolute_path)}: " if err.absolute_path else "") + err.message
            for err in found
        ]

    def spark_schema(self) -> StructType:
        """The Spark schema for parsing documents of this contract with ``from_json``.

        Every field is nullable (required-ness is checked by validation, not by the parser), and
        the per-kind sub-schemas reached through ``allOf``/``if``/``then`` are merged into one
        struct, since one Kafka topic carries all kinds.
        """
        return _struct_of(self.schema, self.schema)

    def field_names(self) -> list[str]:
        return [f.name for f in self.spark_schema().fields]


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    if not ref.startswith("#/"):
        raise ContractError(f"only local $ref is supported, got {ref}")
    target: Any = root
    for part in ref[2:].split("/"):
        target = target[part]
    return _resolve(target, root)


def _object_properties(node: dict[str, Any], root: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Properties of an object schema, including those of conditional (per-kind) branches."""
    node = _resolve(node, root)
    merged: dict[str, dict[str, Any]] = dict(node.get("properties", {}))
    branches: Iterable[dict[str, Any]] = [
        branch.get("then", branch) for branch in node.get("allOf", []) + node.get("oneOf", [])
    ]
    for branch in branches:
        for name, prop in _object_properties(branch, root).items():
            if name in merged and _spark_type(merged[name], root) != _spark_type(prop, root):
                raise ContractError(f"field {name!r} has different types in different branches")
            merged.setdefault(name, prop)
    return merged


def _json_types(node: dict[str, Any]) -> list[str]:
    types = node.get("type")
    if types is None and "const" in node:
        types = {bool: "boolean", int: "integer", float: "number", str: "string"}[type(node["const"])]
    if types is None:
        raise ContractError(f"a property without a type: {node}")
    types = [types] if isinstance(types, str) else list(types)
    return [t for t in types if t != "null"]


def _spark_type(node: dict[str, Any], root: dict[str, Any]) -> DataType:
    node = _resolve(node, root)
    types = _json_types(node)
    if len(types) != 1:
        raise ContractError(f"a property must have one non-null type, got {types}")
    json_type = types[0]
    if json_type in _SCALARS:
        return _SCALARS[json_type]
    if json_type == "array":
        return ArrayType(_spark_type(node["items"], root), containsNull=True)
    if json_type == "object":
        if "properties" in node or "allOf" in node:
            return _struct_of(node, root)
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            return MapType(StringType(), _spark_type(values, root), valueContainsNull=True)
        # A free-form object (incident evidence): Spark keeps its raw JSON text.
        return StringType()
    raise ContractError(f"unsupported JSON type {json_type}")


def _struct_of(node: dict[str, Any], root: dict[str, Any]) -> StructType:
    return StructType(
        [StructField(name, _spark_type(prop, root), nullable=True) for name, prop in _object_properties(node, root).items()]
    )


INPUT = Contract.load("input_event.v1.json")
INCIDENT = Contract.load("incident.v1.json")
DEAD_LETTER = Contract.load("dead_letter.v1.json")
FEEDBACK = Contract.load("feedback.v1.json")
