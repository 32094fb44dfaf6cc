"""The failure families, declared once: one :class:`Family` each in :data:`REGISTRY`.

Everything that lists families reads them from here: the incident and feedback contracts (their
``family`` enums are checked against :data:`FAMILIES` by ``tests/pipelines/test_contracts.py``),
the config's model names and mute lists, the CLI's choices, the detectors' levels, the incident
policy (causes, symptoms, alertnames, runbooks), the pages' titles and `sentinel evaluate`'s
plots. Adding a family starts here; docs/DEVELOPING.md lists the few functions that also take
one (its detector's features, its static alarm, its summary sentence).

Causes and symptoms follow how Flink fails: a leak, backpressure or a hot key makes checkpoints
slow and then fail; a hot key that saturates its subtask *is* the backpressure's cause. A symptom
is folded into its cause's incident (named in its ``symptoms``), never an incident of its own
while the cause's is open.

This module is the lowest layer (tests/test_import_layers.py): plain data, no imports of the product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Plot:
    """A feature column plotted over time, and its axis label."""

    column: str
    label: str


@dataclass(frozen=True)
class Family:
    """What the product declares about one failure family.

    ``name`` is the incident's ``family`` and the feature definitions' tag; ``localised``: its
    detector judges vertex rows and its incidents name the vertex (else the job's rows);
    ``supervised``: a trained classifier of its own (else the novelty detector, explained by every
    supervised family open on the job); ``explained_by``: the families that, open on the same job,
    explain it (the cause first), ``same_vertex_causes`` those of them that must sit on its own
    vertex; ``one_per_job``: a job has one open incident of it, other vertices join as symptoms;
    ``decisive_plot``: what `sentinel evaluate` plots for a run of it; ``colour``: its incidents'
    marks there; ``runbook``: the steps every incident of it carries.
    """

    name: str
    label: str
    alertname: str
    model_name: str
    localised: bool
    supervised: bool
    runbook: tuple[str, ...]
    colour: str
    decisive_plot: Plot | None = None
    explained_by: tuple[str, ...] = ()
    same_vertex_causes: tuple[str, ...] = ()
    one_per_job: bool = False


STATE_LEAK = "state_leak"
BACKPRESSURE = "backpressure"
SKEW = "skew"
CHECKPOINT_FAILURE = "checkpoint_failure"
ANOMALY = "anomaly"

# In the contracts' enum order. The runbook steps come from the seed reports and Flink's
# documentation on checkpointing under backpressure; each is concrete enough to act on from the
# incident alone.
REGISTRY: tuple[Family, ...] = (
    Family(
        name=STATE_LEAK, label="State leak", alertname="FlinkStateLeak", model_name="sentinel-state-leak",
        localised=True, supervised=True, colour="tab:red",
        decisive_plot=Plot("vertex_state_size_bytes", "state (bytes)"),
        runbook=(
            "Find the operator whose state grows (evidence: vertex) and the state it keeps per key.",
            "Set a state TTL (StateTtlConfig) on keyed state that outlives its use, or clear it in a timer.",
            "Check CEP patterns for a within() clause and windows for a trigger that never purges; "
            "retired keys must leave state (FLINK-19970: expired partial matches of retired keys stay).",
            "Move large state from the heap/memory backend to RocksDB (state.backend.type: rocksdb) with "
            "incremental checkpoints; the memory backend fails checkpoints above its maximum state size.",
            "Until fixed: raise the state or frame-size limit and take a savepoint before it is reached.",
        )),
    Family(
        name=BACKPRESSURE, label="Backpressure", alertname="FlinkBackpressure", model_name="sentinel-backpressure",
        localised=True, supervised=True, colour="tab:orange",
        decisive_plot=Plot("others_backpressured_max", "upstream backpressured (ratio)"),
        # A hot subtask that cannot keep up, on the same vertex.
        explained_by=(SKEW,), same_vertex_causes=(SKEW,),
        # Backpressure cascades from one bottleneck: the vertices around it slow down too and can read
        # like bottlenecks of their own (a busy, partly backpressured neighbour); they join its incident.
        one_per_job=True,
        runbook=(
            "Scale out the bottleneck vertex named in the evidence (more parallelism or resources), or "
            "speed up its external calls (async I/O).",
            "Enable buffer debloating (taskmanager.network.memory.buffer-debloat.enabled: true) to cut in-flight data.",
            "Enable unaligned checkpoints (execution.checkpointing.unaligned.enabled: true) so barriers overtake buffers.",
            "Set execution.checkpointing.aligned-checkpoint-timeout to switch to unaligned only when alignment drags.",
            "Lengthen the checkpoint interval while the backlog drains so checkpoints stop piling up.",
        )),
    Family(
        name=SKEW, label="Skew", alertname="FlinkSkew", model_name="sentinel-skew",
        localised=True, supervised=True, colour="tab:purple",
        decisive_plot=Plot("records_in_hot_excess", "hot subtask's excess share"),
        runbook=(
            "Look at the hot subtask's key distribution (evidence: subtask_index) for a dominant key.",
            "Salt the hot key (key + random suffix) and merge the partial results in a second step.",
            "Use two-phase (local then global) aggregation, e.g. table.optimizer.agg-phase-strategy: TWO_PHASE.",
            "For non-keyed stages, rebalance() the stream; for joins, broadcast the small side.",
            "Enable unaligned checkpoints so barrier alignment stops waiting on the hot subtask.",
        )),
    Family(
        name=CHECKPOINT_FAILURE, label="Checkpoint failure", alertname="FlinkCheckpointFailure",
        model_name="sentinel-checkpoint-failure", localised=False, supervised=True, colour="tab:brown",
        decisive_plot=Plot("checkpoint_failed_fraction", "failed share of recent checkpoints"),
        explained_by=(STATE_LEAK, BACKPRESSURE, SKEW),
        runbook=(
            "Read the failure messages in the evidence: timeouts, storage errors and declined checkpoints need "
            "different fixes.",
            "Check checkpoint storage latency and errors (S3/HDFS throttling, transient 5xx) and local disk "
            "throughput for RocksDB uploads.",
            "If checkpoints run out of time, raise execution.checkpointing.timeout or reduce state per checkpoint "
            "(incremental checkpoints, fewer large operators).",
            "Keep the interval above the checkpoint duration (execution.checkpointing.min-pause) so checkpoints "
            "do not pile up; each in-flight checkpoint costs JobManager memory.",
            "Watch JobManager heap; raise jobmanager.memory.process.size if it grows with in-flight checkpoints.",
            "Check operators that call external systems during snapshotState; they can stall the checkpoint.",
        )),
    Family(
        name=ANOMALY, label="Unexplained (anomaly)", alertname="FlinkAnomaly", model_name="sentinel-anomaly",
        localised=False, supervised=False, colour="tab:gray",
        runbook=(
            "Compare the evidence with the job's usual checkpoint sizes, durations and rates.",
            "Check recent deployments, config changes and restarts of this job.",
            "If it is a real problem of a known kind, label it so the next training run learns it.",
        )),
)

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
