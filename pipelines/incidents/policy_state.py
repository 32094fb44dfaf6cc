"""What the incident policy keeps of one job between batches, typed, and its stored form.

Per job, one :class:`EntityState` per (family, vertex) the policy has scored: its last scores
and evidence values, its :class:`OpenIncident` (with the :class:`Symptom` s that joined it), the
:class:`Suspicion` a guard holds back, since when its forecast predicts a failure, and since when
its state grows enough for the leak rule's growth to stand in for the score's persistence.

Callers of :func:`~pipelines.incidents.policy.step` hold each job's entry in its stored form,
JSON, as the detection job keeps it in Spark's state store beside the job's features
(:mod:`pipelines.detection.job_state`); this module is the one place that reads and writes that
form (:meth:`JobPolicyState.from_stored`, :meth:`JobPolicyState.to_stored`). It is the form the
policy kept before its state was typed, so a checkpoint written before resumes::

    {"_last_ts": ms, "<family>/<vertex id>": {"scores": [...], "recent": [...], "open": {...} | null,
                                              "held": {"event", "guard"}, "predicting_since": ms,
                                              "growing_since": ms}}

An open incident and a symptom are stored under their fields' names. An optional field is
written only when set, and read as unset when absent (a state written before it existed) or null.
A job-level key that is no entity (``_holding``, written by versions before suspicions) is dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator

LAST_TS = "_last_ts"  # the job's latest event time, beside its entities


def job_key(cluster: str, job_id: str) -> str:
    """How the policy's state names a job (:func:`~pipelines.incidents.batch.scored_rows` names
    a batch's jobs so too, all at once)."""
    return f"{cluster}/{job_id}"


@dataclass
class Symptom:
    """A family whose decision joined a cause's open incident instead of opening its own."""

    family: str
    first_at: int
    evidence: dict  # the contract's evidence object, as its events publish it
    severity: str
    last_at: int
    detail: str | None = None  # the latest word on it, for the incident's summary

    @classmethod
    def from_stored(cls, stored: dict) -> "Symptom":
        return cls(stored["family"], stored["first_at"], stored["evidence"], stored["severity"], stored["last_at"],
                   stored.get("detail"))

    def to_stored(self) -> dict:
        stored = {"family": self.family, "first_at": self.first_at, "evidence": self.evidence,
                  "severity": self.severity, "last_at": self.last_at}
        if self.detail is not None:
            stored["detail"] = self.detail
        return stored


@dataclass
class OpenIncident:
    """An entity's open incident: what its next event says and when it publishes one."""

    id: str
    opened_at: int
    severity: str
    eta_ms: float | None  # the last published forecast's ETA, at ``eta_at``
    eta_at: int
    vertex_id: str | None
    vertex_name: str | None
    subtask_index: int | None
    clear_since: int | None = None  # since when its rule has not held
    lower_since: int | None = None  # since when a lower severity has held
    model: dict = field(default_factory=dict)  # the model field of its events (name, version, alias)
    summary_base: str | None = None  # its cause's latest sentence, without severity and symptoms
    symptoms: list[Symptom] = field(default_factory=list)
    last_event: dict | None = None  # the last opened or updated event published
    predicted: bool = False  # opened on a forecast
    warned_at: int | None = None  # its first warning that checkpoints would fail
    first_failure_at: int | None = None  # the first failed checkpoint while it was open
    failure_told: bool = False  # whether an event has said so

    OPTIONAL = ("lower_since", "summary_base", "warned_at", "first_failure_at")

    @classmethod
    def from_stored(cls, stored: dict) -> "OpenIncident":
        incident = cls(stored["id"], stored["opened_at"], stored["severity"], stored["eta_ms"], stored["eta_at"],
                       stored.get("vertex_id"), stored.get("vertex_name"), stored.get("subtask_index"),
                       stored["clear_since"], model=stored.get("model") or {},
                       symptoms=[Symptom.from_stored(s) for s in stored.get("symptoms", ())],
                       last_event=stored.get("last_event"), predicted=bool(stored.get("predicted")),
                       failure_told=bool(stored.get("failure_told")))
        for name in cls.OPTIONAL:
            setattr(incident, name, stored.get(name))
        return incident

    def to_stored(self) -> dict:
        stored: dict[str, Any] = {"id": self.id, "opened_at": self.opened_at, "severity": self.severity,
                                  "eta_ms": self.eta_ms, "eta_at": self.eta_at, "clear_since": self.clear_since,
                                  "vertex_id": self.vertex_id, "vertex_name": self.vertex_name,
                                  "subtask_index": self.subtask_index}
        if self.model:
            stored["model"] = self.model
        if self.last_event is not None:
            stored["last_event"] = self.last_event
        if self.symptoms:
            stored["symptoms"] = [s.to_stored() for s in self.symptoms]
        if self.predicted:
            stored["predicted"] = True
        for name in self.OPTIONAL:
            if getattr(self, name) is not None:
                stored[name] = getattr(self, name)
        if self.first_failure_at is not None:
            stored["failure_told"] = self.failure_told
        return stored


@dataclass
class Suspicion:
    """A decision a guard still holds back: the ``info`` incident's opening published if the job
    ends or goes away first, and the guard's words."""

    event: dict
    guard: str

    @classmethod
    def from_stored(cls, stored: dict) -> "Suspicion":
        return cls(stored["event"], stored["guard"])

    def to_stored(self) -> dict:
        return {"event": self.event, "guard": self.guard}


@dataclass
class EntityState:
    """One (job, family, vertex): its last ``n`` scores, its last evidence values, and what is
    open, held or predicted of it."""

    scores: list[float] = field(default_factory=list)
    recent: list[float] = field(default_factory=list)
    open: OpenIncident | None = None
    held: Suspicion | None = None
    predicting_since: int | None = None
    growing_since: int | None = None  # growth that stands in for the score's persistence held since (ms)

    @classmethod
    def from_stored(cls, stored: dict) -> "EntityState":
        open_, held = stored.get("open"), stored.get("held")
        return cls(stored["scores"], stored["recent"], OpenIncident.from_stored(open_) if open_ else None,
                   Suspicion.from_stored(held) if held else None, stored.get("predicting_since"),
                   stored.get("growing_since"))

    def to_stored(self) -> dict:
        stored: dict[str, Any] = {"scores": self.scores, "recent": self.recent,
                                  "open": self.open.to_stored() if self.open else None}
        if self.held is not None:
            stored["held"] = self.held.to_stored()
        if self.predicting_since is not None:
            stored["predicting_since"] = self.predicting_since
        if self.growing_since is not None:
            stored["growing_since"] = self.growing_since
        return stored

    def set_growing_since(self, ms: float) -> None:
        """From a batch's float column, where NaN is unset."""
        self.growing_since = None if math.isnan(ms) else int(ms)


@dataclass
class JobPolicyState:
    """One job's entities by key (``<family>/<vertex id>``, as
    :func:`~pipelines.incidents.batch.scored_rows` names them), and its latest event time."""

    entities: dict[str, EntityState] = field(default_factory=dict)
    last_ts: int | None = None

    @classmethod
    def from_stored(cls, stored: dict) -> "JobPolicyState":
        entities = {key: EntityState.from_stored(value) for key, value in stored.items()
                    if isinstance(value, dict) and "scores" in value}
        return cls(entities, stored.get(LAST_TS))

    def to_stored(self) -> dict:
        stored: dict[str, Any] = {} if self.last_ts is None else {LAST_TS: self.last_ts}
        stored.update((key, entity.to_stored()) for key, entity in self.entities.items())
        return stored

    def entity(self, key: str) -> EntityState:
        """The entity ``key``, new if the job has none yet."""
        found = self.entities.get(key)
        if found is None:
            found = self.entities[key] = EntityState()
        return found

    def in_order(self) -> Iterator[tuple[str, str | None, EntityState]]:
        """(family, vertex id, entity) of every entity, in the order of their keys: the order the
        policy looks for causes and resolves what is open."""
        for key, entity in sorted(self.entities.items(), key=lambda item: item[0]):
            family, _, vertex = key.partition("/")
            yield family, vertex or None, entity

    def any_open(self) -> bool:
        """Whether an incident is open, or a suspicion held."""
        return any(entity.open is not None or entity.held is not None for entity in self.entities.values())


class PolicyStates:
    """The typed state of the jobs one step reads, taken from the callers' stored entries as the
    step first asks for each, and written back to them by :meth:`store`."""

    def __init__(self, stored: dict):
        self._stored = stored
        self._jobs: dict[str, JobPolicyState | None] = {}  # None: forgotten

    def get(self, key: str) -> JobPolicyState | None:
        if key not in self._jobs:
            found = self._stored.get(key)
            self._jobs[key] = None if found is None else JobPolicyState.from_stored(found)
        return self._jobs[key]

    def job(self, key: str) -> JobPolicyState:
        """The job ``key``, new if the state has none."""
        found = self.get(key)
        if found is None:
            found = self._jobs[key] = JobPolicyState()
        return found

    def known_entity(self, job: str, entity: str) -> EntityState | None:
        """The state of an entity of job ``job``, if the job has one."""
        found = self.get(job)
        return None if found is None else found.entities.get(entity)

    def forget(self, key: str) -> None:
        self._jobs[key] = None

    def store(self) -> None:
        for key, job in self._jobs.items():
            if job is not None:
                self._stored[key] = job.to_stored()
            else:
                self._stored.pop(key, None)
