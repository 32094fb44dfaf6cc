"""Scoring with the MLflow champions: load by alias once, follow alias moves, survive outages.

:class:`ChampionCache` holds one loaded detector per family. It re-reads the aliases at most
every ``model_refresh_s`` and loads only a version it has not got, so a promotion reaches the
running job within that bound without a restart. If the registry cannot be reached it keeps
scoring with the models it has and says so once per outage. At start-up with no model at all
:meth:`ChampionCache.require` stops the job with a message that says what to run.

:func:`score_rows` is pure: feature rows and detectors in, one score row per (feature row,
family) out, each naming the model version that produced it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import pandas as pd

from models import registry
from models.detectors import FAMILY_LEVEL, rows_for
from models.registry import LoadedDetector, ModelUnavailable
from pipelines.config import SentinelConfig
from pipelines.families import FAMILIES

log = logging.getLogger(__name__)

SCORE_COLUMNS = ["row", "family", "score", "model_name", "model_version", "model_alias"]


@dataclass
class ChampionCache:
    config: SentinelConfig
    clock: Callable[[], float] = time.monotonic
    models: dict[str, LoadedDetector] = field(default_factory=dict)
    checked_at: float | None = None
    registry_error: str | None = None  # set while the registry is unreachable
    # MLflow's check of the installed packages against each model's (see registry.load_detector).
    check_environment: bool = True

    def require(self) -> dict[str, LoadedDetector]:
        """Load every champion now; raise :class:`ModelUnavailable` when there is none at all."""
        self.refresh(force=True)
        if self.registry_error and not self.models:
            raise ModelUnavailable(f"the model registry at {self.config.mlflow.registry_uri} cannot be reached "
                                   f"({self.registry_error}); check mlflow.registry_uri")
        if not self.models:
            names = ", ".join(getattr(self.config.mlflow.models, f) for f in FAMILIES)
            raise ModelUnavailable(
                f"no model has the alias {self.config.mlflow.alias!r} in {self.config.mlflow.registry_uri} "
                f"({names}); train the initial models with `sentinel train` (or `make run`)")
        missing = [f for f in FAMILIES if f not in self.models]
        if missing:
            log.warning("no %s model for %s: those families are not scored", self.config.mlflow.alias, ", ".join(missing))
        return self.models

    def ready(self) -> dict[str, LoadedDetector]:
        """The models to score with now (as :meth:`current`); loaded first, or
        :class:`ModelUnavailable` raised, while none is held yet."""
        return self.current() if self.models else self.require()

    def current(self) -> dict[str, LoadedDetector]:
        """The models to score with now, re-reading the aliases when the refresh interval is up."""
        self.refresh()
        return self.models

    def refresh(self, force: bool = False) -> None:
        now = self.clock()
        if not force and self.checked_at is not None and now - self.checked_at < self.config.detection.model_refresh_s:
            return
        self.checked_at = now
        registry.use_config(self.config)
        alias = self.config.mlflow.alias
        try:
            for family in FAMILIES:
                name = getattr(self.config.mlflow.models, family)
                version = registry.alias_version(name, alias, raise_on_unreachable=True)
                held = self.models.get(family)
                if version is None or (held is not None and held.version == version):
                    continue
                self.models[family] = registry.load_detector(name, alias, self.check_environment)
                log.log(logging.WARNING if held else logging.INFO, "scoring %s with %s version %s (%s)", family, name,
                        self.models[family].version, f"the alias moved from {held.version}" if held else "loaded")
        except Exception as exc:  # the registry's client raises many kinds; none may stop the job
            if self.registry_error is None:
                log.error("model registry unreachable (%s); scoring continues with the models already loaded: %s",
                          exc, self.versions() or "none")
            self.registry_error = str(exc).splitlines()[0][:300]
            return
        if self.registry_error is not None:
            log.warning("model registry reachable again")
        self.registry_error = None

    def versions(self) -> dict[str, str]:
        return {family: m.version for family, m in self.models.items()}


# One cache per Python worker process and model registry: Spark reuses its Python workers across
# tasks and micro-batches, so each loads the champions once and then only follows their aliases.
_WORKER_CACHES: dict[str, ChampionCache] = {}


def worker_champions(config: SentinelConfig) -> ChampionCache:
    """This process's cache of ``config``'s champions (for the stateful processor's scoring)."""
    key = config.mlflow.model_dump_json()
    cache = _WORKER_CACHES.get(key)
    if cache is None:
        # The driver's cache checks the environment against the models (its warnings are in the
        # job's log) and the workers run the deployment's packages too: skipping the check there
        # saves each Python worker about 1.5 s of CPU when it first loads the champions.
        cache = _WORKER_CACHES[key] = ChampionCache(config, check_environment=False)
    return cache


def score_rows(rows: pd.DataFrame, models: Mapping[str, LoadedDetector]) -> pd.DataFrame:
    """One row per (feature row, family of its level): ``row`` is the feature row's index."""
    parts = []
    levels: dict[str, pd.DataFrame] = {}  # each level's rows taken once, not once per family
    for family, model in models.items():
        level = FAMILY_LEVEL[family]
        judged = levels.get(level)
        if judged is None:
            judged = levels[level] = rows_for(rows, level)
        if judged.empty:
            continue
        parts.append(pd.DataFrame({
            "row": judged.index, "family": family, "score": model.detector.score(judged),
            "model_name": model.name, "model_version": model.version, "model_alias": model.alias,
        }))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=SCORE_COLUMNS)
