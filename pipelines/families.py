"""The failure families, defined once: their names, where each is localised, and what causes what.

Everything that lists families (the incident contract, the detectors, training, the policy, the
lab's ground truth, evaluation) reads them from here; ``tests/pipelines/test_contracts.py``
holds the incident schema's ``family`` enum to :data:`FAMILIES`.

Causes and symptoms follow how Flink fails: a leak, backpressure or a hot key makes checkpoints
slow and then fail; a hot key that saturates its subtask *is* the backpressure's cause. A symptom
is folded into its cause's incident (named in its ``symptoms``), never an incident of its own
while the cause's is open.
"""

from __future__ import annotations

STATE_LEAK = "state_leak"
BACKPRESSURE = "backpressure"
SKEW = "skew"
CHECKPOINT_FAILURE = "checkpoint_failure"
ANOMALY = "anomaly"

FAMILIES = (STATE_LEAK, BACKPRESSURE, SKEW, CHECKPOINT_FAILURE, ANOMALY)
# The policy judges a moment's families causes first, so a symptom finds its cause's incident open.
EVALUATION_ORDER = (STATE_LEAK, SKEW, BACKPRESSURE, CHECKPOINT_FAILURE, ANOMALY)
SUPERVISED = (STATE_LEAK, BACKPRESSURE, SKEW, CHECKPOINT_FAILURE)  # one trained detector each
ROOT_CAUSES = SUPERVISED  # families that can explain others
LOCALISED = (STATE_LEAK, BACKPRESSURE, SKEW)  # live in a vertex; the others are the job's
# family -> the families that, open on the same job, explain it (the cause first).
EXPLAINED_BY: dict[str, tuple[str, ...]] = {
    CHECKPOINT_FAILURE: (STATE_LEAK, BACKPRESSURE, SKEW),
    BACKPRESSURE: (SKEW,),  # a hot subtask that cannot keep up, on the same vertex
    ANOMALY: ROOT_CAUSES,
}
# Symptoms that must sit on the cause's own vertex to be explained by it.
SAME_VERTEX = {(BACKPRESSURE, SKEW)}
# Families a job has one open incident of. Backpressure cascades from one bottleneck: the vertices
# around it slow down too and can read like bottlenecks of their own (measured in the lab: a
# busy, partly backpressured neighbour); they join the open incident as its symptoms.
ONE_PER_JOB = (BACKPRESSURE,)
# The Alertmanager ``alertname`` of each family's incidents (an incident's ``labels.alertname``).
ALERTNAMES = {STATE_LEAK: "FlinkStateLeak", BACKPRESSURE: "FlinkBackpressure", SKEW: "FlinkSkew",
              CHECKPOINT_FAILURE: "FlinkCheckpointFailure", ANOMALY: "FlinkAnomaly"}
