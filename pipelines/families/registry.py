"""The failure families, collected: :data:`REGISTRY` holds each family module's spec, in the
contracts' enum order, and the tables the rest of the product reads are derived from it.

Everything that lists families reads them from here: the incident and feedback contracts (their
``family`` enums are checked against :data:`FAMILIES` by ``tests/pipelines/test_contracts.py``),
the config's model names and mute lists, the CLI's choices, the detectors, the post-rules, the
incident policy (causes, symptoms, alertnames, runbooks, severities, summaries), the static
alarms, the pages and `sentinel evaluate`'s plots. Adding a family is adding a module beside this
one and its spec here (docs/DEVELOPING.md).

Causes and symptoms follow how Flink fails: a leak, backpressure or a hot key makes checkpoints
slow and then fail; a hot key that saturates its subtask *is* the backpressure's cause. A symptom
is folded into its cause's incident (named in its ``symptoms``), never an incident of its own
while the cause's is open.
"""

from __future__ import annotations

from typing import Literal

from pipelines.families import anomaly, backpressure, checkpoint_failure, skew, state_leak
from pipelines.families.base import Family, Plot

STATE_LEAK = state_leak.NAME
BACKPRESSURE = backpressure.NAME
SKEW = skew.NAME
CHECKPOINT_FAILURE = checkpoint_failure.NAME
ANOMALY = anomaly.NAME

# In the contracts' enum order.
REGISTRY: tuple[Family, ...] = (state_leak.FAMILY, backpressure.FAMILY, skew.FAMILY, checkpoint_failure.FAMILY,
                                anomaly.FAMILY)

# --- derived: what the rest of the product reads -------------------------------------------------

BY_NAME: dict[str, Family] = {f.name: f for f in REGISTRY}
FAMILIES: tuple[str, ...] = tuple(BY_NAME)
# A config value, CLI argument or contract field that names a family (pydantic checks the Literal).
FamilyName = Literal[FAMILIES]  # type: ignore[valid-type]
SUPERVISED = tuple(f.name for f in REGISTRY if f.supervised)  # one trained detector each
ROOT_CAUSES = SUPERVISED  # families that can explain others
LOCALISED = tuple(f.name for f in REGISTRY if f.localised)  # live in a vertex; the others are the job's
# family -> the families that, open on the same job, explain it (the cause first); the novelty
# detector's alarm is explained by any root cause.
EXPLAINED_BY: dict[str, tuple[str, ...]] = {
    f.name: f.explained_by if f.supervised else ROOT_CAUSES for f in REGISTRY if f.explained_by or not f.supervised}
# (symptom, cause) pairs that must sit on the same vertex to be explained.
SAME_VERTEX = {(f.name, cause) for f in REGISTRY for cause in f.same_vertex_causes}
# Families a job has one open incident of.
ONE_PER_JOB = tuple(f.name for f in REGISTRY if f.one_per_job)
# The Alertmanager ``alertname`` of each family's incidents (an incident's ``labels.alertname``).
ALERTNAMES = {f.name: f.alertname for f in REGISTRY}
LABELS = {f.name: f.label for f in REGISTRY}
# Families whose faults are failed checkpoints: what every limit forecast warns of.
CHECKPOINT_FAILURES = tuple(f.name for f in REGISTRY if f.is_failed_checkpoints)
# The raw value each family's incidents keep the last few of as evidence.
RECENT_COLUMNS = {f.name: f.recent_column for f in REGISTRY if f.recent_column}


def _causes_first() -> tuple[str, ...]:
    """The families in :data:`REGISTRY` order, each moved after the families that explain it."""
    order: list[str] = []
    waiting = list(FAMILIES)
    while waiting:
        ready = next((name for name in waiting if set(EXPLAINED_BY.get(name, ())) <= set(order)), None)
        if ready is None:
            raise ValueError(f"the families {waiting} explain each other in a circle")
        order.append(ready)
        waiting.remove(ready)
    return tuple(order)


# The policy judges a moment's families causes first, so a symptom finds its cause's incident open.
EVALUATION_ORDER = _causes_first()
