"""A Flink job's state as the detection job stores it in Spark's state store: its layout by
version, and the migrations that bring a state stored by an earlier version to the current one.

A stored state is JSON. Its versions:

1. ``{"machine": {...}, "policy": {...}}`` (before states had a version).
2. ``{"version": 2, "machine": {...}, "policy": {...}}``: the same, with its version.
3. ``{"version": 3, ...}``: the same keys; the machine has the growth test's buffers (the growth
   window, the trajectory, the checkpoint durations), rebuilt on migration from the checkpoint
   buffers an earlier version stored.

``machine`` holds :class:`~feature_store.job_features.JobFeatureState`'s fields: a field the
stored state lacks takes the field's default (a field added since, with a default that suits a
state written before it); a field the class does not know is an error, as is a version newer
than :data:`STATE_VERSION`, never a silent start afresh. ``policy`` is the job's entry of the
incident policy's state in its stored form (:mod:`pipelines.incidents.policy_state`, which alone
reads and writes it; unchanged by these versions).

A change that a default cannot carry (a field renamed, a value read differently) is a new version
and a migration from the one before: :data:`MIGRATIONS`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, TypedDict

import orjson

from feature_store.job_features import JobFeatureState

STATE_VERSION = 3


class StoredJobStateV1(TypedDict):
    machine: dict[str, Any]
    policy: dict[str, Any]


class StoredJobState(TypedDict):
    """The layout of versions 2 and 3 (the current one)."""

    version: int
    machine: dict[str, Any]
    policy: dict[str, Any]


class StoredStateError(ValueError):
    """A stored job state this code cannot read (a newer version, a field it does not know)."""


def _v1_to_v2(stored: StoredJobStateV1) -> StoredJobState:
    return {"version": 2, "machine": stored["machine"], "policy": stored["policy"]}


GROWTH_BUFFERS = ("growth_window", "trajectory", "trajectory_spacing_ms", "trajectory_fits", "durations")


def _v2_to_v3(stored: StoredJobState) -> StoredJobState:
    machine = stored["machine"]
    if not any(name in machine for name in GROWTH_BUFFERS):
        state = machine_from(machine)
        state.rebuild_growth_history()
        machine = orjson.loads(orjson.dumps(state.orjson_fields(), option=orjson.OPT_SERIALIZE_NUMPY))
    return {"version": 3, "machine": machine, "policy": stored["policy"]}


# Version n's migration to n + 1, and each version's keys.
MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _v1_to_v2, 2: _v2_to_v3}
LAYOUT_KEYS = {1: frozenset(StoredJobStateV1.__annotations__), 2: frozenset(StoredJobState.__annotations__),
               3: frozenset(StoredJobState.__annotations__)}
MACHINE_FIELDS = frozenset(f.name for f in dataclasses.fields(JobFeatureState))


def stored_version(stored: dict) -> int:
    """A stored state's version: version 1 had none."""
    return stored.get("version", 1)


def migrate(stored: dict) -> StoredJobState:
    """``stored`` (a parsed state of any version this code knows) in the current layout."""
    version = stored_version(stored)
    if type(version) is not int or version < 1:
        raise StoredStateError(f"a stored job state has version {version!r}: not a version of this job's state")
    if version > STATE_VERSION:
        raise StoredStateError(
            f"a stored job state is version {version}, newer than this code's {STATE_VERSION}: a newer "
            "checkpoint-sentinel wrote this checkpoint. Run that version, or move the checkpoint aside to start "
            "afresh (every job's features and open incidents are then forgotten)")
    while True:
        if stored.keys() != LAYOUT_KEYS[version]:
            raise StoredStateError(f"a stored job state of version {version} has the keys {sorted(stored)}, "
                                   f"not {sorted(LAYOUT_KEYS[version])}")
        if version == STATE_VERSION:
            return stored  # type: ignore[return-value]
        stored = MIGRATIONS[version](stored)
        version += 1


def machine_from(fields: dict[str, Any]) -> JobFeatureState:
    """The feature state machine of a stored state's ``machine``: a field it lacks takes its default."""
    unknown = fields.keys() - MACHINE_FIELDS
    if unknown:
        raise StoredStateError(f"a stored job state has fields the feature state does not know: "
                               f"{', '.join(sorted(unknown))} (written by a newer checkpoint-sentinel?)")
    return JobFeatureState(**fields)


def decode(data: bytes) -> tuple[JobFeatureState, dict]:
    """(feature state machine, policy entry) of a state stored by this or an earlier version."""
    stored = orjson.loads(data)
    if type(stored) is not dict:
        raise StoredStateError(f"a stored job state is a JSON {type(stored).__name__}, not an object")
    current = migrate(stored)
    return machine_from(current["machine"]), current["policy"]


def encode(machine: JobFeatureState, policy: dict) -> bytes:
    """The stored state (:data:`STATE_VERSION`) of a job's feature state machine and policy entry."""
    return orjson.dumps({"version": STATE_VERSION, "machine": machine.orjson_fields(), "policy": policy},
                        option=orjson.OPT_SERIALIZE_NUMPY)
