"""How long before a run's first failed checkpoint the incidents said it would come.

The promise is *before*: per run whose ground truth has a checkpoint failure, the first failed
checkpoint (the ``checkpoint_failure`` fault's onset, which the lab labels at the first failure
after the fault began), the **first warning** (the first incident event on the job, of an
incident not resolved before that failure, that carries a forecast of a checkpoint limit within the
job's warning horizon, or that opens a ``checkpoint_failure`` incident, predicted or not), the
**lead time** from the warning to the failure (negative: the first word came after it: a failure
told as it came, or joining a cause's incident as its symptom),
and the warning's ETA against the real time to the failure: its error and whether its band held
it. The **build-up** is the time from the earliest other fault's onset (the cause: a leak,
backpressure, a hot key) to the failure; a failure with no cause in the ground truth (a storage
outage, a timeout too tight from the start) has none, and no forecast can see it coming.

A warning can also not come true: per run whose checkpoints never fail, the first forecast
within the horizon is a **warning without a failure** (:func:`warnings_without_failure`); on a
healthy run it is a false warning, on a faulty one (backpressure in episodes that drain) a
cause's forecast that its fault did not keep. It is **overdue** where one of the run's warnings
saw its band's late end pass while the run went on; a band that reaches past the run's end
could not yet be wrong.

``with_forecasts=False`` judges incidents as the static alarms are used today: only an opened
``checkpoint_failure`` incident warns, so its lead time is at best zero.

Pure: ground-truth lines and incident events in, one :class:`LeadTime` per run out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Callable, Iterable, Sequence

from pipelines.families.registry import CHECKPOINT_FAILURES

# The bar: a build-up of at least this long is warned of at least WARNED_AHEAD_MS ahead
# (a shorter one: at least half of it ahead).
LONG_BUILD_UP_MS = 240_000
WARNED_AHEAD_MS = 120_000


@dataclass(frozen=True)
class LeadTime:
    run: str
    job_id: str
    cause: str  # the family whose fault built up to the failure, else checkpoint_failure
    first_failure_ts: int
    build_up_ms: int | None  # from the cause's onset to the failure; None: no cause
    warning_ts: int | None
    warning_family: str | None
    eta_ms: int | None  # the warning's soonest forecast, at the warning
    eta_low_ms: int | None
    eta_high_ms: int | None  # None: unbounded above
    metric: str | None

    @property
    def lead_ms(self) -> int | None:
        """From the first warning to the failure; negative where the first word came after it."""
        return None if self.warning_ts is None else self.first_failure_ts - self.warning_ts

    @property
    def warned(self) -> bool:
        """Whether a warning came before the failure."""
        return self.lead_ms is not None and self.lead_ms > 0

    @property
    def eta_error(self) -> float | None:
        """(ETA - real time to the failure) / real time, at a warning that came first."""
        lead = self.lead_ms
        if self.eta_ms is None or not self.warned:
            return None
        return (self.eta_ms - lead) / lead

    @property
    def band_held(self) -> bool | None:
        lead = self.lead_ms
        if self.eta_ms is None or not self.warned:
            return None
        high = math.inf if self.eta_high_ms is None else self.eta_high_ms
        return (self.eta_low_ms if self.eta_low_ms is not None else self.eta_ms) <= lead <= high

    @property
    def warned_in_time(self) -> bool | None:
        """Whether the warning met the bar for its build-up (None: no build-up to judge)."""
        if self.build_up_ms is None or self.build_up_ms <= 0:
            return None
        needed = WARNED_AHEAD_MS if self.build_up_ms >= LONG_BUILD_UP_MS else self.build_up_ms / 2
        return self.warned and self.lead_ms >= needed


def lead_times(truths: Iterable[dict], incidents: Sequence[dict], warning_horizon_ms: Callable[[str], float],
               with_forecasts: bool = True) -> list[LeadTime]:
    """One :class:`LeadTime` per run with a checkpoint failure; ``warning_horizon_ms(job_name)``:
    how far ahead a forecast warns for that job (``detection.warning_horizon_s``)."""
    by_job = _by_job(incidents)
    out = []
    for truth in truths:
        faults = truth.get("faults") or []
        failures = [f["onset_ts"] for f in faults if f["family"] in CHECKPOINT_FAILURES]
        if not failures:
            continue
        failure = min(failures)
        causes = sorted((f["onset_ts"], f["family"]) for f in faults
                        if f["family"] not in CHECKPOINT_FAILURES and f["onset_ts"] <= failure)
        horizon = warning_horizon_ms(truth.get("job_name") or "")
        events = sorted(by_job.get((truth["cluster"], truth["job_id"]), []), key=lambda e: e["updated_at"])
        # A warning is of this failure only if its incident was still open when the failure came.
        ended = {e["incident_id"] for e in events if e["event"] == "resolved" and e["updated_at"] < failure}
        warnings = [w for e in events if e["incident_id"] not in ended
                    and (w := _warning(e, horizon, with_forecasts)) is not None]
        at, event, forecast = min(warnings, key=lambda w: w[0]) if warnings else (None, None, None)
        out.append(LeadTime(
            truth.get("run_id") or truth["job_name"], truth["job_id"], causes[0][1] if causes else CHECKPOINT_FAILURES[0],
            failure, failure - causes[0][0] if causes else None,
            at, event["family"] if event else None,
            forecast and forecast["eta_ms"], forecast and forecast.get("eta_low_ms", forecast["eta_ms"]),
            forecast.get("eta_high_ms") if forecast else None, forecast and forecast["metric"]))
    return out


def fails(truth: dict) -> bool:
    """Whether the run's ground truth has a failed checkpoint."""
    return any(f["family"] in CHECKPOINT_FAILURES for f in truth.get("faults") or [])


@dataclass(frozen=True)
class WarningWithoutFailure:
    run: str
    job_id: str
    healthy: bool  # the run has no fault at all
    warning_ts: int  # the first forecast within the horizon
    family: str  # of the incident that carried it
    eta_ms: int
    metric: str
    overdue: bool  # a warning's band passed while the run went on, and no failure came


def warnings_without_failure(truths: Iterable[dict], incidents: Sequence[dict],
                             warning_horizon_ms: Callable[[str], float]) -> list[WarningWithoutFailure]:
    """One :class:`WarningWithoutFailure` per run without a checkpoint failure whose incidents
    carried a forecast of a checkpoint limit within the job's warning horizon."""
    by_job = _by_job(incidents)
    out = []
    for truth in truths:
        if fails(truth):
            continue
        horizon, end = warning_horizon_ms(truth.get("job_name") or ""), truth.get("end_ts")
        warnings = sorted((w for e in by_job.get((truth["cluster"], truth["job_id"]), [])
                           if (w := _warning(e, horizon, True)) is not None and w[2] is not None), key=lambda w: w[0])
        if not warnings:
            continue
        at, event, forecast = warnings[0]
        overdue = end is not None and any(f.get("eta_high_ms") is not None and t + f["eta_high_ms"] < end
                                          for t, _, f in warnings)
        out.append(WarningWithoutFailure(truth.get("run_id") or truth["job_name"], truth["job_id"],
                                         not truth.get("faults"), at, event["family"], forecast["eta_ms"],
                                         forecast["metric"], overdue))
    return out


def _by_job(incidents: Sequence[dict]) -> dict[tuple[str, str], list[dict]]:
    by_job: dict[tuple[str, str], list[dict]] = {}
    for incident in incidents:
        by_job.setdefault((incident["cluster"], incident["job_id"]), []).append(incident)
    return by_job


def _warning(event: dict, horizon_ms: float, with_forecasts: bool) -> tuple[int, dict, dict | None] | None:
    """``(when, event, its soonest forecast within the horizon)`` if the event says checkpoints
    will fail or are failing: a forecast, a ``checkpoint_failure`` incident opening, or a
    checkpoint failure joining it as a symptom (when it first showed)."""
    if event["event"] == "resolved":
        return None
    if with_forecasts:
        within = [f for f in event.get("forecasts") or [] if f.get("eta_ms") is not None and f["eta_ms"] <= horizon_ms]
        if within:
            return event["updated_at"], event, min(within, key=lambda f: f["eta_ms"])
    if event["family"] in CHECKPOINT_FAILURES and event["event"] == "opened":
        return event["updated_at"], event, None
    symptom = next((s for s in event.get("symptoms") or [] if s["family"] in CHECKPOINT_FAILURES), None)
    return (symptom["first_at"], event, None) if symptom else None


def summary(runs: Sequence[LeadTime], cause: str | None = None) -> dict[str, float]:
    """Over the runs (of one cause, or all): how many, how many were warned before the failure,
    the median lead time (of the runs with any word, negative where it came after the failure) and
    the median absolute ETA error, the share whose band held the real time, and the build-ups
    warned of in time."""
    chosen = [r for r in runs if cause in (None, r.cause)]
    leads = [r.lead_ms / 1000 for r in chosen if r.lead_ms is not None]
    errors = [abs(r.eta_error) for r in chosen if r.eta_error is not None]
    bands = [r.band_held for r in chosen if r.band_held is not None]
    judged = [r.warned_in_time for r in chosen if r.warned_in_time is not None]
    nan = float("nan")
    return {"runs": float(len(chosen)), "warned": float(sum(r.warned for r in chosen)),
            "lead_s_median": median(leads) if leads else nan,
            "eta_error_median": median(errors) if errors else nan,
            "band_held": sum(bands) / len(bands) if bands else nan,
            "build_ups": float(len(judged)), "warned_in_time": float(sum(judged))}
