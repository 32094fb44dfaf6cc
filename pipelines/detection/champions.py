"""The live job's champions from MLflow: load by alias once, follow alias moves, survive outages.

:class:`ChampionCache` holds one loaded detector per family. It re-reads the aliases at most
every ``model_refresh_s`` and loads only a version it has not got, so a promotion reaches the
running job within that bound without a restart. If the registry cannot be reached it keeps
scoring with the models it has and says so once per outage. At start-up with no model at all
:meth:`ChampionCache.require` stops the job with a message that says what to run.

A family's champion that cannot be loaded (its artifact gone, a pickle that no longer reads) is
that family's trouble alone: it is logged by name and counted, the other families are loaded
and score, and the family keeps an earlier version it holds. The job's Python workers also keep
a copy of every champion they load beside the job's checkpoints (:class:`~models.registry.HeldCopies`):
a worker started while the registry cannot be reached (after a worker crash, or Spark's stop of an
idle one) scores with the champions the job last held instead of failing the micro-batch.

The scoring itself is :func:`pipelines.incidents.scoring.score_rows`; what it could not score is
counted in the champions' health and reported per family (:func:`models_payload`,
:func:`record_scoring`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import orjson

from models import registry
from models.registry import HeldCopies, LoadedDetector, ModelUnavailable
from pipelines.config import SentinelConfig
from pipelines.families import FAMILIES
from pipelines.incidents.scoring import Champions, ScoringHealth

log = logging.getLogger(__name__)

# Where the job's copies of its champions live, beside its queries' checkpoints.
HELD_CHAMPIONS = "champions"


@dataclass
class ChampionCache:
    config: SentinelConfig
    clock: Callable[[], float] = time.monotonic
    models: Champions = field(default_factory=Champions)
    checked_at: float | None = None
    registry_error: str | None = None  # set while the registry is unreachable
    # MLflow's check of the installed packages against each model's (see registry.load_detector).
    check_environment: bool = True
    # The job's copies of the champions: each one loaded is kept there, and a cache with none
    # loaded scores with them while the registry cannot be reached (or a family's load fails).
    held: HeldCopies | None = None
    sources: dict[str, str] = field(default_factory=dict)  # family -> "registry" or "held copy"

    def __post_init__(self) -> None:
        if not isinstance(self.models, Champions):
            self.models = Champions(self.models)

    @property
    def health(self) -> ScoringHealth:
        return self.models.health

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
        names = {family: getattr(self.config.mlflow.models, family) for family in FAMILIES}
        try:
            versions = {family: registry.alias_version(name, alias, raise_on_unreachable=True)
                        for family, name in names.items()}
        except Exception as exc:  # the registry's client raises many kinds; none may stop the job
            if self.registry_error is None:
                log.error("model registry unreachable (%s); scoring continues with the models already loaded: %s",
                          exc, self.versions() or "none")
            self.registry_error = str(exc).splitlines()[0][:300]
            for family, name in names.items():
                if family not in self.models:
                    self._take_held(family, name, None, "the registry cannot be reached")
            return
        if self.registry_error is not None:
            log.warning("model registry reachable again")
        self.registry_error = None
        for family, version in versions.items():
            held = self.models.get(family)
            if version is None or (held is not None and held.version == version):
                continue
            try:
                loaded = registry.load_detector(names[family], alias, self.check_environment)
            except Exception as exc:  # one family's broken model must not blind the others
                self._load_failed(family, names[family], version, held, exc)
                continue
            self.models[family] = loaded
            self.sources[family] = "registry"
            self.health.errors.pop(family, None)
            log.log(logging.WARNING if held else logging.INFO, "scoring %s with %s version %s (%s)", family,
                    loaded.name, loaded.version, f"the alias moved from {held.version}" if held else "loaded")
            self._keep(loaded)

    def _load_failed(self, family: str, name: str, version: str, held: LoadedDetector | None,
                     exc: Exception) -> None:
        reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        self.health.count(self.health.load_failures, family, 1)
        self.health.errors[family] = f"{name} version {version} failed to load: {reason}"
        if held is not None:
            self.health.log_once(logging.ERROR, (family, version, "load"),
                                 "the %s champion %s version %s failed to load (%s); %s goes on scoring with version %s",
                                 family, name, version, reason, family, held.version)
            return
        if not self._take_held(family, name, version, f"version {version} failed to load from the registry"):
            self.health.log_once(logging.ERROR, (family, version, "load"),
                                 "the %s champion %s version %s failed to load (%s): %s is NOT scored until it loads",
                                 family, name, version, reason, family)

    def _take_held(self, family: str, name: str, version: str | None, why: str) -> bool:
        """Score ``family`` with the job's copy of ``name`` (that ``version``, or the last one the
        alias named); False when the job holds none."""
        if self.held is None:
            return False
        alias = self.config.mlflow.alias
        try:
            copy = self.held.last(name, alias) if version is None else self.held.copy_of(name, version, alias)
        except Exception as exc:  # a copy that cannot be read is no copy
            log.error("the job's copy of the %s champion %s in %s cannot be read: %s", family, name, self.held.folder,
                      exc)
            return False
        if copy is None:
            return False
        self.models[family] = copy
        self.sources[family] = "held copy"
        log.warning("scoring %s with the job's own copy of %s version %s (%s)", family, name, copy.version, why)
        return True

    def _keep(self, model: LoadedDetector) -> None:
        if self.held is None:
            return
        try:
            self.held.keep(model)
        except Exception as exc:  # scoring goes on; only a later outage would miss the copy
            log.warning("could not keep a copy of %s version %s in %s: %s", model.name, model.version,
                        self.held.folder, exc)

    def versions(self) -> dict[str, str]:
        return {family: m.version for family, m in self.models.items()}


# One cache per Python worker process and model registry: Spark reuses its Python workers across
# tasks and micro-batches, so each loads the champions once and then only follows their aliases.
_WORKER_CACHES: dict[str, ChampionCache] = {}


def held_champions(config: SentinelConfig) -> HeldCopies:
    """Where the detection job keeps its copies of the champions: beside its checkpoints."""
    return HeldCopies(config.checkpoint_dir(HELD_CHAMPIONS))


def worker_champions(config: SentinelConfig) -> ChampionCache:
    """This process's cache of ``config``'s champions (for the stateful processor's scoring)."""
    key = config.mlflow.model_dump_json() + str(config.spark.checkpoint_location)
    cache = _WORKER_CACHES.get(key)
    if cache is None:
        # The driver's cache checks the environment against the models (its warnings are in the
        # job's log) and the workers run the deployment's packages too: skipping the check there
        # spares each Python worker's first load (see BENCHMARKS.md, "The Python workers at the
        # job's start (`benchmarks/worker_start.py`)").
        cache = _WORKER_CACHES[key] = ChampionCache(config, check_environment=False, held=held_champions(config))
    return cache


# --- what the workers report to the driver -------------------------------------------------------


def models_payload(cache: ChampionCache) -> bytes:
    """The payload of the stateful stage's ``models`` output row: per family the model it scores
    with (``[name, version]``, null while it has none) and where from, and what scoring met since
    the last report (load failures, feature rows judged and left unscored, the latest error)."""
    load_failures, judged, unscored = cache.health.drain()
    families = {}
    for family in FAMILIES:
        model = cache.models.get(family)
        families[family] = {"model": None if model is None else [model.name, model.version],
                            "source": cache.sources.get(family) if model is not None else None,
                            "load_failures": load_failures.get(family, 0), "judged": judged.get(family, 0),
                            "unscored": unscored.get(family, 0), "error": cache.health.errors.get(family)}
    return orjson.dumps({"families": families, "registry_error": cache.registry_error})


def scoring_versions(payload: bytes) -> dict[str, list[str]]:
    """family -> ``[name, version]`` of a :func:`models_payload` (the families with a model)."""
    return {family: report["model"] for family, report in orjson.loads(payload)["families"].items()
            if report["model"] is not None}


def record_scoring(metrics, payload: bytes) -> None:
    """A :func:`models_payload` into the job's metrics (a ``pipelines.telemetry.DetectionMetrics``):
    the load failures and unscored rows counted, and each family's ``model_scoring`` 1 while its
    champion gives scores, 0 while it has none or scored none of the last rows it judged. The driver's
    log names a family when it goes blind, scores again, or first fails to load or score."""
    for family, report in orjson.loads(payload)["families"].items():
        was_scoring = _sample(metrics.model_scoring, family)
        failures_before = _sample(metrics.model_load_failures, family) or 0
        unscored_before = _sample(metrics.model_nan_scores, family) or 0
        if report["load_failures"]:
            metrics.model_load_failures.labels(family).inc(report["load_failures"])
        if report["unscored"]:
            metrics.model_nan_scores.labels(family).inc(report["unscored"])
        # A report whose worker judged no row of the family's level says nothing new: the family
        # keeps the state the last rows it judged gave (another worker's, in the same batch).
        blind = report["model"] is None or report["unscored"] >= report["judged"] > 0 or \
            (report["judged"] == 0 and was_scoring == 0)
        metrics.model_scoring.labels(family).set(0 if blind else 1)
        cause = f" ({report['error']})" if report["error"] else ""
        if blind and was_scoring != 0:
            log.error("%s is NOT scored: %s%s", family, "no champion loaded" if report["model"] is None else
                      f"its champion {report['model'][0]} version {report['model'][1]} gave no score", cause)
        elif not blind and was_scoring == 0:
            log.warning("%s is scored again, by %s version %s", family, *report["model"])
        if report["load_failures"] and not failures_before:
            log.error("the %s champion failed to load%s", family, cause)
        if report["unscored"] and not unscored_before:
            log.error("the %s champion gave no score for %d of %d feature rows%s", family, report["unscored"],
                      report["judged"], cause)


def _sample(metric, family: str) -> float | None:
    """The value of ``metric``'s sample for ``family`` (a counter's total), None before it has one."""
    for sample in metric.collect()[0].samples:
        if sample.labels.get("family") == family and not sample.name.endswith("_created"):
            return sample.value
    return None
