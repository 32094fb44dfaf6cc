"""The failure families: one module each (``state_leak``, ``backpressure``, ``skew``,
``checkpoint_failure``, ``anomaly``) holding its :class:`~pipelines.families.base.Family` spec,
collected in :mod:`pipelines.families.registry`.

The foundation layer (tests/test_import_layers.py): plain data and pure functions over feature
rows, importing numpy and pandas and nothing of the product but each other.
"""

from pipelines.families.base import Family, Plot
from pipelines.families.registry import (ALERTNAMES, ANOMALY, BACKPRESSURE, BY_NAME, CHECKPOINT_FAILURE,
                                         EVALUATION_ORDER, EXPLAINED_BY, FAMILIES, LABELS, LOCALISED, ONE_PER_JOB,
                                         REGISTRY, ROOT_CAUSES, SAME_VERTEX, SKEW, STATE_LEAK, SUPERVISED,
                                         FamilyName)

__all__ = ["ALERTNAMES", "ANOMALY", "BACKPRESSURE", "BY_NAME", "CHECKPOINT_FAILURE", "EVALUATION_ORDER", "EXPLAINED_BY",
           "FAMILIES", "LABELS", "LOCALISED", "ONE_PER_JOB", "REGISTRY", "ROOT_CAUSES", "SAME_VERTEX", "SKEW",
           "STATE_LEAK", "SUPERVISED", "Family", "FamilyName", "Plot"]
