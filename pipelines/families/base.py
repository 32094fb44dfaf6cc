"""What every failure family declares: the :class:`Family` spec its module fills in.

A family is one module of this package (``state_leak.py``, ``backpressure.py``, ...) holding an
instance of :class:`Family` (or of a subclass that overrides its behaviour): its names, the
features its detector reads and their monotone signs, its post-rule's guards, its static alarm,
how its incidents word their severity, summary and runbook, and its decisive plot. The rest of
the product asks the spec (``BY_NAME[family].severity(...)``) instead of branching on a family's
name; ``tests/test_family_branching.py`` keeps it that way.

This layer is the foundation (tests/test_import_layers.py): numpy and pandas, no product imports
but each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np
import pandas as pd

MIB = 1024 * 1024
# No decision this soon after a job (re)started: Flink's rates and busy times are one-minute meters
# that still hold the start-up (Python workers starting, a backlog caught up), and a job's first
# checkpoints are not its usual behaviour.
STARTUP_S = 60.0
# A forecast of completed checkpoints' duration against their timeout: the warning that they will fail.
TIMEOUT_METRIC = "checkpoint_duration_ms"
# And of a vertex's barrier wait (start delay and alignment) against the same timeout: backpressure's.
BARRIER_METRIC = "checkpoint_barrier_wait_ms"
# Each metric forecast against the checkpoint timeout: its feature columns (ETA, band's low and
# high end, the span fitted over), declared as features in feature_store/definitions.py.
TIMEOUT_FORECASTS = {
    TIMEOUT_METRIC: ("checkpoint_timeout_eta_s", "checkpoint_timeout_eta_low_s", "checkpoint_timeout_eta_high_s",
                     "checkpoint_duration_fitted_over_s"),
    BARRIER_METRIC: ("barrier_wait_timeout_eta_s", "barrier_wait_timeout_eta_low_s", "barrier_wait_timeout_eta_high_s",
                     "barrier_wait_fitted_over_s"),
}
TIMEOUT_METRICS = tuple(TIMEOUT_FORECASTS)
# The persistence grid a post-rule is calibrated over when its family names none of its own.
CALIBRATION_PERSISTENCE = ((1, 1), (2, 3), (3, 4), (4, 6))


@dataclass(frozen=True)
class Plot:
    """A feature column plotted over time, and its axis label."""

    column: str
    label: str


def num(row: Mapping[str, Any], name: str) -> float | None:
    """``row[name]`` as a float; None where it is missing, null or NaN."""
    value = row.get(name)
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def mb(n: float | None) -> str:
    return "?" if n is None else f"{n / MIB:.1f} MB"


def human_duration(seconds: float) -> str:
    """``42s``, ``9 min``, ``2.5 h``: how an incident says how long."""
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def column(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A frame's column as floats, NaN where the frame lacks it."""
    return frame[name].to_numpy(dtype="float64") if name in frame else np.full(len(frame), np.nan)


def vertex_else_job(vertex_values, job_values) -> np.ndarray:
    """The vertex's value where known, else the job's."""
    values = np.asarray(vertex_values, dtype="float64")
    return np.where(np.isnan(values), np.asarray(job_values, dtype="float64"), values)


@dataclass(frozen=True)
class Family:
    """What the product declares about one failure family.

    ``name`` is the incident's ``family``; ``localised``: its detector judges vertex rows and its
    incidents name the vertex (else the job's rows); ``supervised``: a trained classifier of its
    own (else the novelty detector, explained by every supervised family open on the job);
    ``explained_by``: the families that, open on the same job, explain it (the cause first),
    ``same_vertex_causes`` those of them that must sit on its own vertex; ``one_per_job``: a job
    has one open incident of it, other vertices join as symptoms; ``decisive_plot``: what
    `sentinel evaluate` and the incident page plot for it; ``colour``: its incidents' marks there;
    ``runbook``: the steps every incident of it carries.

    The detector: ``features`` (the columns it reads, in order) and ``monotone`` (feature, sign)
    pairs: how its score may move as a feature grows, all else equal. The post-rule:
    ``post_rule`` (the guard and evidence fields every calibrated rule of it carries),
    ``calibration_persistence`` (the (k, n) grid), ``delay_statistic`` (``median`` or ``mean``:
    among equally good rules the soonest by this statistic of its delays), and
    ``learns_from_symptom_rows`` (False: rows of its causes' faults that show it are not its
    lesson). ``recent_column``: the raw value its incidents keep the last few of as evidence.
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
    features: tuple[str, ...] = ()
    monotone: tuple[tuple[str, int], ...] = ()
    post_rule: tuple[tuple[str, Any], ...] = ()
    calibration_persistence: tuple[tuple[int, int], ...] = CALIBRATION_PERSISTENCE
    delay_statistic: str = "median"
    learns_from_symptom_rows: bool = True
    recent_column: str | None = None
    has_static_alarm: bool = True
    is_failed_checkpoints: bool = False  # its faults are failed checkpoints: the limit forecasts warn of
    page_plot: str | None = None  # the incident page's decisive plot (pipelines/reports/incident_plots.PAGE_PLOTS)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def level(self) -> str:
        """The feature rows its detector judges: ``vertex`` or ``job``."""
        return "vertex" if self.localised else "job"

    @property
    def guards(self) -> dict[str, Any]:
        """The post-rule fields (``PostRule(**family.guards)``)."""
        return dict(self.post_rule)

    @property
    def warmup_guarded(self) -> bool:
        """Whether its post-rule holds decisions back for a job's warm-up horizon."""
        return bool(self.guards.get("warmup_guard"))

    # --- the detector's rows and labels ---------------------------------------------------------

    def positives(self, labels: pd.Series) -> np.ndarray:
        """The rows its detector should flag: its own fault's."""
        return (labels == self.name).to_numpy()

    # --- incidents ------------------------------------------------------------------------------

    def severity(self, row: Mapping[str, Any], forecast: dict | None, critical_eta_s: float) -> str:
        return "warning"

    def summary(self, where: str, row: Mapping[str, Any], forecast: dict | None, severity: str) -> str:
        raise NotImplementedError

    def runbook_for(self, row: Mapping[str, Any]) -> list[str]:
        """The runbook steps for an incident at ``row`` (the declared ones, and any the row calls for)."""
        return list(self.runbook)

    def subtask(self, row: Mapping[str, Any]) -> int | None:
        """The subtask an incident names (none unless the family lives in one)."""
        return None

    def forecast(self, row: Mapping[str, Any], configured_limit: int | None) -> dict | None:
        """The family's own forecast at ``row`` (a leak's state limit), if it makes one."""
        return None

    def forecasts(self, row: Mapping[str, Any], configured_limit: int | None, warning_horizon_s: float) -> list[dict]:
        """Every forecast an incident of it carries at ``row``, soonest first: its own, and for a
        family whose faults fail checkpoints, when their duration, and the vertex's barrier wait,
        reach the timeout (where that is within ``warning_horizon_s``: a warning, not a far trend)."""
        found = [f for f in (self.forecast(row, configured_limit),) if f]
        if self.supervised:
            found += [f for metric in TIMEOUT_FORECASTS if (f := timeout_forecast(row, warning_horizon_s, metric))]
        return sorted(found, key=lambda f: f["eta_ms"])

    def predicted_rows(self, frame: pd.DataFrame, warning_horizon_s: np.ndarray) -> np.ndarray | None:
        """Per row, whether its forecasts say the family's failure is coming within the job's
        ``warning_horizon_s`` before any has happened (an incident of it may open as *predicted*:
        the policy's ``predict_sustain_ms`` of such rows first); None: the family predicts nothing."""
        return None

    # How long rows must keep predicting before a predicted incident opens; the columns
    # :meth:`predicted_rows` reads.
    predict_sustain_ms: ClassVar[int] = 0
    prediction_columns: ClassVar[tuple[str, ...]] = ()

    def limit_eta_s(self, rows: pd.DataFrame, limits: np.ndarray) -> np.ndarray | None:
        """Per row, seconds to the operator's configured limit (NaN: none), for the guards; None:
        the family has no such limit."""
        return None

    def recent_evidence(self, record: Mapping[str, Any]) -> dict:
        """Raw values from the row its incidents carry beside the features."""
        return {}

    def guard_text(self, warmup_horizon_s: float) -> str:
        """What holds a suspected incident back, in words."""
        return "its start-up time"

    def cleared_resolution(self, record: Mapping[str, Any]) -> str | None:
        """The ``resolution`` an incident of it carries when its condition cleared (None: it
        simply cleared)."""
        return None

    # --- the static alarm operators use today ---------------------------------------------------

    def static_alarm(self, frame: pd.DataFrame, thresholds: Any) -> np.ndarray:
        """Where the static alarm fires at each row of ``frame`` (``thresholds``: a
        ``models.baseline.BaselineThresholds``); a missing value never fires."""
        raise ValueError(f"no static baseline for {self.name!r}")


def timeout_forecast(row: Mapping[str, Any], warning_horizon_s: float, metric: str = TIMEOUT_METRIC) -> dict | None:
    """When the first checkpoint fails against the timeout on the fitted trend of ``metric``
    (completed checkpoints' end-to-end duration, or a vertex's barrier wait), with its band
    (feature_store/failure_forecast.py's ``failure_eta``); None beyond ``warning_horizon_s`` or
    without a rising trend."""
    eta_column, low_column, high_column, over_column = TIMEOUT_FORECASTS[metric]
    eta, timeout = num(row, eta_column), num(row, "checkpoint_timeout_ms")
    if eta is None or timeout is None or eta > warning_horizon_s:
        return None
    low, high, over = num(row, low_column), num(row, high_column), num(row, over_column)
    return {"metric": metric, "limit": int(timeout), "limit_source": "job",
            "eta_ms": int(eta * 1000), "eta_low_ms": int((low if low is not None else eta) * 1000),
            "eta_high_ms": None if high is None else int(high * 1000),
            "fitted_over_ms": None if over is None else int(over * 1000), "method": "checkpoint_cadence"}


def timeout_warning(forecasts: list[dict]) -> str:
    """The sentence a warning adds to a summary, of the soonest forecast against the timeout:
    "checkpoints will exceed their 1 s timeout in ~4 min (3-6 min)", "checkpoint barriers will
    wait out their 20 s timeout in ~4 min (3-6 min)"; empty without one."""
    timeout = timeout_forecast_in(forecasts, TIMEOUT_METRICS)
    if timeout is None:
        return ""
    limit = human_duration(timeout["limit"] / 1000)
    if timeout["metric"] == BARRIER_METRIC:
        if timeout["eta_ms"] <= 0:
            return f"; checkpoint barriers wait out their {limit} timeout now"
        return f"; checkpoint barriers will wait out their {limit} timeout in {eta_text(timeout)}"
    if timeout["eta_ms"] <= 0:
        return f"; checkpoints take their {limit} timeout now"
    return f"; checkpoints will exceed their {limit} timeout in {eta_text(timeout)}"


def timeout_forecast_in(forecasts: list[dict] | None, metrics: tuple[str, ...] = (TIMEOUT_METRIC,)) -> dict | None:
    """The soonest forecast of ``metrics`` (by default the end-to-end duration's against the
    timeout) among an incident's ``forecasts`` (soonest first), if any."""
    return next((f for f in forecasts or [] if f.get("metric") in metrics), None)


def eta_text(forecast: Mapping[str, Any]) -> str:
    """A forecast's ETA with its band, as incidents say it: "~4 min (3 min-6 min)", "~4 min (or
    later: from 3 min)" where the band is open above, "now" once the limit is reached."""
    if forecast["eta_ms"] <= 0:
        return "now"
    return f"~{human_duration(forecast['eta_ms'] / 1000)}{band_text(forecast)}"


def band_text(forecast: Mapping[str, Any]) -> str:
    """A forecast's 95 % band as its ETA is followed by: " (3 min-6 min)", " (or later: from
    3 min)" where it is open above, empty without one."""
    low, high = forecast.get("eta_low_ms"), forecast.get("eta_high_ms")
    if low is None:
        return ""
    if high is None:
        return f" (or later: from {human_duration(low / 1000)})"
    return f" ({human_duration(low / 1000)}-{human_duration(high / 1000)})"


def limit_text(forecast: Mapping[str, Any]) -> str:
    """What a forecast runs into, in words: "the 3s checkpoint timeout", "the 5.0 MB state limit
    (config)", "the 5.0 MB state limit (job, at 80% now)"."""
    limit, source = forecast.get("limit"), forecast.get("limit_source") or "?"
    if forecast["metric"] == TIMEOUT_METRIC and limit:
        return f"the {human_duration(limit / 1000)} checkpoint timeout"
    if forecast["metric"] == BARRIER_METRIC and limit:
        return f"the {human_duration(limit / 1000)} checkpoint timeout (barrier wait)"
    ratio = forecast.get("limit_ratio")
    now = f", at {ratio:.0%} now)" if ratio is not None else ")"
    return (f"the {mb(limit)} state limit ({source}" if limit else f"the state limit ({source}") + now


def checkpoint_failed(row: Mapping[str, Any]) -> bool:
    """Whether the job's recent checkpoints include a failed one at ``row`` (job and vertex rows
    both carry the job's checkpoint history)."""
    return (num(row, "checkpoint_failed_fraction") or 0.0) > 0


def fired(condition: pd.Series) -> np.ndarray:
    """A static alarm's condition as booleans, a missing value never firing."""
    return condition.fillna(False).to_numpy(dtype=bool)


def col(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name].astype("float64")
