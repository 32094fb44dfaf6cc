"""The incident policy: scores and post-rules in, incident events out; deterministic and pure.

One open incident per (job, family, vertex). Per entity, in event-time order:

* ``opened`` when the family's post-rule holds (K of the last N scores over its threshold, and
  its guards, with the job's warm-up horizon and state limit from the operator's settings);
* ``updated`` when, while open, the severity rises (or has stayed lower for ``resolve_after_s``),
  the forecast ETA moves by more than ``eta_change_ratio`` and ``eta_change_min_s`` (at most once
  every ``min_update_interval_s``), or a symptom joins it;
* ``resolved`` once the rule has not held for ``resolve_after_s`` of event time, or at once when
  the job reaches a terminal state (finished, cancelled, failed). An open leak holds while its
  state still grows (:meth:`PostRule.sustains`), whatever its score, and resolves with
  ``resolution: levelled_off`` once it has not grown for ``resolve_after_s``; growth that resumes
  opens a new incident.

A family that predicts (:meth:`Family.predicted_rows`: a checkpoint failure's credible timeout
forecast) opens a ``predicted`` incident once its rows have predicted for the family's
``predict_sustain_ms`` with no cause's incident open; it holds while they do, records the first
failed checkpoint and the lead time when it comes, and resolves with ``resolution:
forecast_receded`` if the forecast recedes first. Any open incident records the first failed
checkpoint seen while it is open (``first_failure_at``, ``lead_time_ms`` from its first warning).

A decision a guard still holds back (a warm-up horizon, a start-up time) is a *suspicion*, kept
in the entity's state and published only if the job ends or goes away first: an ``info``
incident opened where it was first held and resolved at once, ``resolution: unconfirmed``.

An incident's times are ordered: ``opened_at <= updated_at`` of each of its events, ``resolved_at
= updated_at``, and ``updated_at`` never goes back; a row that arrives behind the incident's last
event (within the allowed lateness) is stamped with that event's time.

Causes and symptoms (``pipelines/families/``): failing checkpoints behind a leak, backpressure
or a hot key, and backpressure behind a hot key on the same vertex, are the cause's *symptoms*.
While the cause's incident is open, a symptom's decision is not an incident of its own: it joins
the cause's incident (``symptoms: [{family, first_at, evidence}]``, an ``updated`` event) and the
incident's severity follows the worst of them. A symptom incident opened before its cause was
recognised is resolved into the cause's incident when that opens. Anomalies are what no family
explains: they open only while no cause has an incident open on the job.

Operator knowledge (``detection.job_overrides``, first glob match on the job name wins) sets a
job's warm-up horizon and state limit, and mutes families; it overrides what a post-rule learned.

The incident id hashes the entity and the event time it opened, so re-running a micro-batch from
the same state re-sends the same ids, and a replay of the same events gives the same incidents as
the live job. The callers hold the state, one stored (JSON) entry per job; :func:`step` returns
the events and moves on the entries of the batch's jobs. Jobs never see each other's entries, so
the live job can step each partition's jobs on its own and keep each job's entry with the job's
other state.

Its parts: :mod:`pipelines.incidents.settings` (the settings and what the operator knows per job),
:mod:`pipelines.incidents.batch` (a batch's rows in walking order), :mod:`pipelines.incidents.events`
(the events themselves), :mod:`pipelines.incidents.policy_state` (a job's state, typed, and its
stored form); this module decides.

Most rows change nothing: an entity that is not open and whose post-rule holds nowhere in the
batch only extends its score history, which is done for all of them at once; only the rows of
entities that can open, update or resolve are walked one by one in event-time order.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from models.post_rule import GROWTH_COLUMNS, PostRule
from pipelines.contracts import TERMINAL_JOB_STATES as TERMINAL_STATES
from pipelines.families import BY_NAME, EXPLAINED_BY, LOCALISED, ONE_PER_JOB, SAME_VERTEX
from pipelines.families.base import checkpoint_failed
from pipelines.families.registry import RECENT_COLUMNS
from pipelines.incidents import evidence as ev
from pipelines.incidents.batch import BatchNames, RowRecords, scored_rows
from pipelines.incidents.events import (FORECAST_RECEDED, SEVERITY_RANK, UNCONFIRMED, cause_sentence, clean_value,
                                        incident_event, incident_id, incident_labels, incident_time, opened_incident,
                                        prediction_fields, public_symptoms, rank, recent_failure, summary_base,
                                        summary_with_symptoms, suspicion, unconfirmed, with_symptoms)
from pipelines.incidents.policy_state import (EntityState, JobPolicyState, OpenIncident, PolicyStates, Symptom,
                                              job_key)
from pipelines.incidents.settings import JobOverride, JobSettings, PolicySettings

# What the rest of the product imports from here, wherever it is defined.
__all__ = ["FORECAST_RECEDED", "JOB_GONE", "SEVERITY_RANK", "TERMINAL_STATES", "UNCONFIRMED",
           "JobOverride", "JobSettings", "PolicySettings", "any_open", "incident_id", "incident_labels", "resolve_gone",
           "step"]

RECENT_VALUES = 6  # raw values kept per entity for the evidence


def step(state: dict, rows: pd.DataFrame, scores: pd.DataFrame, rules: Mapping[str, PostRule],
         settings: PolicySettings) -> list[dict]:
    """Advance the policy over one batch of scored feature rows; return the incident events.

    ``rows`` are feature rows (late markers excluded), ``scores`` come from
    :func:`pipelines.incidents.scoring.score_rows` over them; ``rules`` hold each family's post-rule.
    Jobs are independent: a batch of many jobs gives each job the events a batch of its rows alone
    would, so the live job may step any subset of jobs at once. ``state`` holds each job's entry
    in its stored form (:mod:`pipelines.incidents.policy_state`) by :func:`job_key`; the entries of
    the batch's jobs move on.
    """
    jobs = PolicyStates(state)
    if scores.empty:
        events = _terminal(jobs, rows)
    else:
        scored, names = scored_rows(rows, scores, rules)
        _forget_returning_jobs(jobs, scored, names, settings.forget_after_ms)
        decided, held, predicted = _decisions(jobs, scored, names, rules, settings)
        active = _active(jobs, scored, names, decided | held | predicted)
        events = _transitions(jobs, rows, scored[active].reset_index(drop=True), names, decided[active], rules,
                              settings, held[active], predicted[active])
        _remember(jobs, scored[~active], names, rules)
        events += _terminal(jobs, rows)
    jobs.store()
    return events


def _forget_returning_jobs(jobs: PolicyStates, scored: pd.DataFrame, names: BatchNames, forget_after_ms: int) -> None:
    """A job back after ``forget_after_ms`` of silence with nothing open starts afresh, as its
    feature state does after the idle timeout: its old scores say nothing about its new run.
    Judged on the job's own event time only, so it does not matter which other jobs share the
    batch (the live job steps whatever jobs a micro-batch partition holds)."""
    for code, ts in scored.groupby("_job", sort=False)["ts"].min().items():
        job = jobs.get(names.jobs[code])
        if job is not None and ts - (ts if job.last_ts is None else job.last_ts) > forget_after_ms \
                and not job.any_open():
            jobs.forget(names.jobs[code])


def any_open(job: dict) -> bool:
    """Whether a job's stored policy entry has an incident open, or a suspicion held (see
    :func:`suspicion`)."""
    return JobPolicyState.from_stored(job).any_open()


def _active(jobs: PolicyStates, scored: pd.DataFrame, names: BatchNames, decided: np.ndarray) -> np.ndarray:
    """Rows of the entities this batch can change: open before it, or decided at some row of it.
    The others only extend their score history, which needs no walk in event-time order."""
    changing = np.zeros(len(names.entities), dtype=bool)
    entity = scored["_entity"].to_numpy()
    changing[entity[decided]] = True
    first = np.unique(entity, return_index=True)[1]
    for code, job_code in zip(entity[first].tolist(), scored["_job"].to_numpy()[first].tolist()):
        if not changing[code]:
            known = jobs.known_entity(names.jobs[job_code], names.entities[code])
            changing[code] = known is not None and (known.open is not None or known.held is not None
                                                    or known.predicting_since is not None)
    return changing[entity]


def _transitions(jobs: PolicyStates, rows: pd.DataFrame, scored: pd.DataFrame, names: BatchNames, decided: np.ndarray,
                 rules: Mapping[str, PostRule], settings: PolicySettings, held: np.ndarray | None = None,
                 predicted: np.ndarray | None = None) -> list[dict]:
    """The rows of changing entities, one at a time in event-time order (causes before symptoms)."""
    columns = {name: scored[name].tolist() for name in scored.columns}
    full_record = RowRecords(rows, columns["_row"])
    events: list[dict] = []
    for i in range(len(scored)):
        family, ts = columns["family"][i], int(columns["ts"][i])
        job = jobs.job(names.jobs[columns["_job"][i]])
        job.last_ts = max(job.last_ts or 0, ts)
        entity = job.entity(names.entities[columns["_entity"][i]])
        entity.scores = (entity.scores + [float(columns["score"][i])])[-rules[family].n:]
        entity.set_growing_since(columns["_growing_since"][i])
        recent = columns.get(RECENT_COLUMNS.get(family))
        if recent is not None and clean_value(recent[i]) is not None:
            entity.recent = (entity.recent + [recent[i]])[-RECENT_VALUES:]
        job_settings = settings.for_job(columns["job_name"][i])
        holds = bool(decided[i]) and family not in job_settings.mute and columns["job_state"][i] not in TERMINAL_STATES
        if not holds and entity.open is not None and family not in job_settings.mute \
                and columns["job_state"][i] not in TERMINAL_STATES \
                and rules[family].sustains({name: columns[name][i] for name in GROWTH_COLUMNS if name in columns}):
            holds = True  # e.g. a leak whose score dipped while its state still grows
        suspected = (held is not None and bool(held[i]) and family not in job_settings.mute
                     and columns["job_state"][i] not in TERMINAL_STATES)
        if not suspected and columns["job_state"][i] not in TERMINAL_STATES:
            entity.held = None  # the guard lifted, or the score no longer says so: judged as usual
        predicting = (predicted is not None and bool(predicted[i]) and family not in job_settings.mute
                      and columns["job_state"][i] not in TERMINAL_STATES)
        if not predicting:
            entity.predicting_since = None
        elif not holds and _predicted_only(entity.open):
            holds = True  # a predicted incident holds while its forecast does
        if not holds and entity.open is None and (not suspected or entity.held is not None) and not predicting:
            continue  # nothing can change: the full record is not needed
        record = {**full_record(columns["_row"][i]), "row": columns["_row"][i], "family": family,
                  "score": columns["score"][i], "model_name": columns["model_name"][i],
                  "model_version": columns["model_version"][i], "model_alias": columns["model_alias"][i]}
        record["forecasts"] = ev.forecasts(family, record, job_settings)
        forecast = record["forecasts"][0] if record["forecasts"] else None  # the soonest
        if suspected and not holds and entity.open is None:
            if _open_cause(job, family, record.get("vertex_id")) is None:  # an open cause explains it otherwise
                entity.held = suspicion(entity.recent, record, forecast, job_settings)
            continue
        if predicting and not holds and entity.open is None:
            if entity.predicting_since is None:
                entity.predicting_since = ts
            since = entity.predicting_since
            # An open cause's incident carries the forecast already (its summary says it).
            if ts - since < BY_NAME[family].predict_sustain_ms or _open_cause(job, family, record.get("vertex_id")):
                continue
            holds, record["predicted"] = True, True
        if holds and (family in EXPLAINED_BY or family in ONE_PER_JOB):
            cause = _open_cause(job, family, record.get("vertex_id"))
            if cause is not None:
                holds = False
                if BY_NAME[family].supervised:  # an anomaly an open cause explains is no symptom of it
                    events.extend(_add_symptom(cause, family, record, ts, settings))
        changes = _transition(entity, holds, record, forecast, settings)
        events.extend(changes)
        if entity.open is not None and any(e["event"] == "opened" for e in changes):
            events.extend(_supersede(job, family, entity.open, record, settings))
    return events


def _remember(jobs: PolicyStates, scored: pd.DataFrame, names: BatchNames, rules: Mapping[str, PostRule]) -> None:
    """Extend the score and evidence history of entities nothing happened to (their last ``n``
    scores, their last recent values, since when they grow), and each job's latest event time."""
    if scored.empty:
        return
    for code, ts in scored.groupby("_job", sort=False)["ts"].max().items():
        job = jobs.job(names.jobs[code])
        job.last_ts = max(job.last_ts or 0, int(ts))
    entity = scored["_entity"].to_numpy()
    order = np.argsort(entity, kind="stable")  # each entity's rows together, in event-time order
    bounds = np.flatnonzero(np.r_[True, entity[order][1:] != entity[order][:-1], True]).tolist()
    families, job_codes = scored["family"].to_numpy()[order], scored["_job"].to_numpy()[order]
    scores = scored["score"].to_numpy(dtype="float64")[order].tolist()
    growing_since = scored["_growing_since"].to_numpy(dtype="float64")[order]
    recent_values = {column: scored[column].to_numpy(dtype="float64")[order] for column in set(RECENT_COLUMNS.values())
                     if column in scored}
    for start, end in zip(bounds[:-1], bounds[1:]):
        family = families[start]
        known = jobs.job(names.jobs[job_codes[start]]).entity(names.entities[entity[order[start]]])
        n = rules[family].n
        known.scores = (known.scores + scores[max(start, end - n):end])[-n:]
        known.set_growing_since(growing_since[end - 1])
        column = recent_values.get(RECENT_COLUMNS.get(family))
        if column is not None:
            values = column[start:end]
            fresh = values[~np.isnan(values)].tolist()
            if fresh:
                known.recent = (known.recent + fresh)[-RECENT_VALUES:]


def _decisions(jobs: PolicyStates, scored: pd.DataFrame, names: BatchNames, rules: Mapping[str, PostRule],
               settings: PolicySettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's post-rule decision, whether a guard holds it back (see
    :meth:`PostRule.decide_and_hold_rows`), and whether its family's forecast predicts a failure
    (:meth:`Family.predicted_rows`), one vectorised call per family: every entity continues the
    persistence count from the scores the state kept of it; each job gets its own warm-up and
    warning horizons, and a configured state limit shortens the leak's ETA to its limit. Column
    ``_growing_since``: since when each row's entity grows as :meth:`PostRule.growth_confirms` asks."""
    decided, held, predicted = (np.zeros(len(scored), dtype=bool) for _ in range(3))
    growing_since = np.full(len(scored), np.nan)
    job_settings = {name: settings.for_job(name) for name in scored["job_name"].unique()}
    for family, part in scored.groupby("family", sort=False):
        rule = rules[family]
        entity = part["_entity"].to_numpy()
        past_group, past_scores, known_since = [], [], {}
        first = np.unique(entity, return_index=True)[1]
        for code, job_code in zip(entity[first].tolist(), part["_job"].to_numpy()[first].tolist()):
            known = jobs.known_entity(names.jobs[job_code], names.entities[code])
            kept = [] if known is None else known.scores[-rule.n:]
            past_group += [code] * len(kept)
            past_scores += kept
            if known is not None and known.growing_since is not None:
                known_since[code] = known.growing_since
        # Looked up once per job name, not per row: training replays whole runs as one batch.
        name_code, named = pd.factorize(part["job_name"], use_na_sentinel=False)
        horizon = np.array([job_settings[name].warmup_horizon_s for name in named], dtype="float64")[name_code]
        columns = {name: (part[name].to_numpy(dtype="float64") if name in part else np.full(len(part), np.nan))
                   for name in rule.guard_columns()}
        if "limit_eta_s" in columns:
            limits = np.array([job_settings[name].state_limit_bytes for name in named], dtype="float64")[name_code]
            configured = BY_NAME[family].limit_eta_s(part, limits)
            if configured is not None:
                columns["limit_eta_s"] = np.fmin(columns["limit_eta_s"], configured)
        decided[part.index], held[part.index], growing_since[part.index] = rule.decide_and_hold_rows(
            entity, part["score"].to_numpy(dtype="float64"), part["ts"].to_numpy(dtype="float64"), columns, horizon,
            np.asarray(past_group, dtype=np.int64), np.asarray(past_scores, dtype="float64"), known_since)
        if settings.predict_failures and BY_NAME[family].prediction_columns:
            warning = np.array([job_settings[name].warning_horizon_s for name in named], dtype="float64")[name_code]
            predicted[part.index] = BY_NAME[family].predicted_rows(part, warning)
    scored["_growing_since"] = growing_since
    return decided, held, predicted


def _open_cause(job: JobPolicyState, family: str, vertex_id: str | None) -> OpenIncident | None:
    """The open incident ``family`` on this vertex joins, if any: a cause that explains it (the
    first in ``EXPLAINED_BY`` order; some pairs only on the same vertex), else, for a family a job
    has one incident of, that family's incident on another vertex."""
    for cause in EXPLAINED_BY.get(family, ()):
        for cause_family, cause_vertex, entity in job.in_order():
            if cause_family == cause and entity.open is not None and (
                    (family, cause) not in SAME_VERTEX or cause_vertex == vertex_id):
                return entity.open
    if family in ONE_PER_JOB:
        for other_family, other_vertex, entity in job.in_order():
            if other_family == family and other_vertex != vertex_id and entity.open is not None:
                return entity.open
    return None


def _supersede(job: JobPolicyState, cause: str, cause_incident: OpenIncident, record: dict,
               settings: PolicySettings) -> list[dict]:
    """A cause opening resolves the symptom incidents it explains that opened before it, and
    takes them in as its symptoms."""
    events = []
    for family, vertex, entity in job.in_order():
        if entity.open is None or cause not in EXPLAINED_BY.get(family, ()):
            continue
        if (family, cause) in SAME_VERTEX and vertex != record.get("vertex_id"):
            continue
        opened_at, last = entity.open.opened_at, entity.open.last_event or {}
        event = _resolve_now(entity, family, record)
        event["summary"] = f"[resolved] {family.replace('_', ' ')} in {event['job_name']}: explained by the " \
                           f"{cause.replace('_', ' ')} incident {cause_incident.id}"
        event["evidence"]["explained_by"] = cause_incident.id
        events.append(event)
        if BY_NAME[family].supervised:
            symptom_row = {**record, **(last.get("evidence") or {}).get("features", {}), "family": family}
            events.extend(_add_symptom(cause_incident, family, symptom_row, opened_at, settings,
                                       severity=last.get("severity")))
    return events


def _add_symptom(open_: OpenIncident, family: str, record: dict, first_at: int, settings: PolicySettings,
                 severity: str | None = None) -> list[dict]:
    """Name ``family`` a symptom of the cause's open incident; an ``updated`` event when it is new
    or raises the incident's severity."""
    ts = incident_time(open_, int(record["ts"]))
    severity = severity or ev.severity(family, record, None, settings.critical_eta_s)
    known = next((s for s in open_.symptoms if s.family == family), None)
    if known is None:
        evidence = ev.evidence(family, record, recent_failure(family, record))
        if family in LOCALISED:  # where it shows, which need not be the cause's vertex
            evidence.update(vertex_id=record.get("vertex_id"), vertex_name=record.get("vertex_name"))
        symptom = Symptom(family, first_at, evidence, severity, ts)
        open_.symptoms.append(symptom)
    else:
        symptom = known
        known.last_at, known.severity = ts, max(known.severity, severity, key=SEVERITY_RANK.get)
    raised = rank(with_symptoms(open_, open_.severity, ts, settings)) > rank(open_.severity)
    if known is not None and not raised:
        return []
    last = dict(open_.last_event or {})
    new_severity = with_symptoms(open_, open_.severity, ts, settings)
    open_.severity = new_severity
    if family == last["family"]:  # the same family elsewhere in the job: where else it shows
        detail = f"{record.get('vertex_name') or record.get('vertex_id')} slowed too"
    else:
        detail = ev.summary(family, record, None, new_severity).split("] ", 1)[-1].split(";")[0]
    symptom.detail = detail  # the latest word on it
    event = {**last, "event": "updated", "severity": new_severity, "updated_at": ts, "resolved_at": None,
             "summary": summary_with_symptoms(open_, new_severity, open_.summary_base or summary_base(last["summary"])),
             "symptoms": public_symptoms(open_),
             "labels": {**last["labels"], "severity": new_severity, "event": "updated"}, **prediction_fields(open_)}
    open_.last_event = event
    return [event]


def _resolve_now(entity: EntityState, family: str, record: dict) -> dict:
    open_ = entity.open
    assert open_ is not None
    row = {**{k: clean_value(v) for k, v in record.items()}, "family": family, "score": entity.scores[-1],
           "vertex_id": open_.vertex_id, "model_name": None, "model_version": None, "model_alias": None}
    event = incident_event("resolved", open_, entity.recent, row, None, open_.severity)
    entity.open = None
    return event


def _predicted_only(open_: OpenIncident | None) -> bool:
    """Whether an open incident opened on a forecast and no checkpoint has failed since."""
    return open_ is not None and open_.predicted and open_.first_failure_at is None


def _transition(entity: EntityState, holds: bool, record: dict, forecast: dict | None,
                settings: PolicySettings) -> list[dict]:
    family, ts, open_ = record["family"], int(record["ts"]), entity.open
    terminal = record.get("job_state") in TERMINAL_STATES
    # The first failed checkpoint while an incident is open: when, and how long after its warning.
    if open_ is not None and open_.first_failure_at is None and checkpoint_failed(record):
        open_.first_failure_at, open_.failure_told = incident_time(open_, ts), False
    if holds:
        severity = ev.severity(family, record, forecast, settings.critical_eta_s)
        if open_ is None:
            open_ = entity.open = opened_incident(record, severity, forecast["eta_ms"] if forecast else None)
            if record.get("predicted"):
                open_.predicted, open_.warned_at = True, ts
            return [incident_event("opened", open_, entity.recent, record, forecast, severity)]
        open_.clear_since = None
        severity = with_symptoms(open_, _settled_severity(open_, severity, ts, settings), ts, settings)
        # A predicted failure that came is news to on-call whatever else changed.
        failure_untold = open_.first_failure_at is not None and not open_.failure_told
        if (severity != open_.severity or _eta_moved(open_, forecast, ts, settings)
                or (open_.predicted and failure_untold)):
            open_.severity, open_.eta_ms, open_.eta_at = severity, forecast["eta_ms"] if forecast else None, ts
            return [incident_event("updated", open_, entity.recent, record, forecast, severity)]
        # What a symptom's update says of the cause follows its latest row, not the last published one.
        open_.summary_base = summary_base(cause_sentence(family, record, forecast, open_.severity))
        return []
    if open_ is None:
        return []
    if open_.clear_since is None:
        open_.clear_since = ts
    if terminal or ts - open_.clear_since >= settings.resolve_after_ms:
        receded = _predicted_only(open_)
        event = incident_event("resolved", open_, entity.recent, record, None, open_.severity)
        resolution = None if terminal else FORECAST_RECEDED if receded else BY_NAME[family].cleared_resolution(record)
        if resolution:
            event["resolution"] = resolution  # e.g. a leak whose state levelled off
        entity.open = None
        return [event]
    return []


def _settled_severity(open_: OpenIncident, severity: str, ts: int, settings: PolicySettings) -> str:
    """Escalate at once; step down only after the lower severity held for ``resolve_after``
    (a failure rate hovering at a boundary must not page, un-page and page again)."""
    if SEVERITY_RANK[severity] >= SEVERITY_RANK[open_.severity]:
        open_.lower_since = None
        return severity
    if open_.lower_since is None:
        open_.lower_since = ts
        return open_.severity
    if ts - open_.lower_since >= settings.resolve_after_ms:
        open_.lower_since = None
        return severity
    return open_.severity


def _eta_moved(open_: OpenIncident, forecast: dict | None, ts: int, settings: PolicySettings) -> bool:
    """Whether a forecast moved enough to publish: by more than ``eta_change_ratio`` of what the
    last published one says now *and* by ``eta_change_min_s``, at most once every
    ``min_update_interval_s`` (a forecast appearing or vanishing at once). Severity changes are
    published whatever this says."""
    old, new = open_.eta_ms, forecast["eta_ms"] if forecast else None
    if old is None or new is None:
        return (old is None) != (new is None)
    if ts - open_.eta_at < settings.min_update_interval_ms:
        return False
    # Compare with what the old forecast says now: a steady leak's ETA shrinks by the time passed,
    # to 0 at its limit and no lower (a limit reached stays reached).
    expected = max(old - (ts - open_.eta_at), 0)
    return abs(new - expected) > max(settings.eta_change_min_ms, settings.eta_change_ratio * expected)


def _terminal(jobs: PolicyStates, rows: pd.DataFrame) -> list[dict]:
    """Jobs whose rows report a terminal state resolve everything still open (e.g. with no scores)."""
    if rows.empty or "job_state" not in rows:
        return []
    events = []
    ended = rows[rows["job_state"].isin(TERMINAL_STATES)].sort_values("ts", kind="stable")
    for record in ended.to_dict("records"):
        job = jobs.get(job_key(record["cluster"], record["job_id"]))
        if job is None:
            continue
        events.extend(_suspicions(job, int(record["ts"]), "the job ended"))
        for family, _, entity in job.in_order():
            if entity.open is not None:
                events.append(_resolve_now(entity, family, record))
    return events


def _suspicions(job: JobPolicyState, at_ms: int, why: str) -> list[dict]:
    """The suspicions a job still holds as it ends or goes away (see :func:`unconfirmed`), but
    those an open cause explains (a symptom of it, as it would have been once confirmed)."""
    events = []
    for family, vertex_id, entity in job.in_order():
        if entity.held is not None:
            if _open_cause(job, family, vertex_id) is None:
                events.extend(unconfirmed(entity.held, at_ms, why))
            entity.held = None
    return events


JOB_GONE = "job_gone"


def resolve_gone(job: dict, at_ms: int, silent_ms: int) -> list[dict]:
    """Resolve every incident still open on a job silent for ``silent_ms`` (the idle timeout), at
    ``at_ms``: a job cancelled without a last status, or whose cluster went away, must not keep its
    alert firing forever. Each event repeats the incident's last one, marked ``resolution: job_gone``.
    ``job`` is the job's stored policy entry, moved on (nothing left open)."""
    state = JobPolicyState.from_stored(job)
    events = _suspicions(state, at_ms, f"nothing was heard of the job for {silent_ms // 60_000} min")
    for family, _, entity in state.in_order():
        open_ = entity.open
        if open_ is None or open_.last_event is None:
            continue
        last = open_.last_event
        ts = max(at_ms, last["updated_at"])
        where = f" / {last['vertex_name']}" if last.get("vertex_name") else ""
        events.append({**last, "event": "resolved", "updated_at": ts, "resolved_at": ts, "forecast": None, "forecasts": [],
                       "summary": f"[resolved] {family.replace('_', ' ')} in {last['job_name']}{where}: the job is "
                                  f"gone (nothing heard of it for {silent_ms // 60_000} min)",
                       "labels": {**last["labels"], "event": "resolved"}, "resolution": JOB_GONE})
        entity.open = None
    job.clear()
    job.update(state.to_stored())
    return events
