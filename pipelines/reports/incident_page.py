"""``sentinel report``: one self-contained HTML page per incident, and an index of the open ones.

The page is what on-call opens from an alert (the ``incident_url`` annotation). It draws the
incident's decisive series from the job's raw metrics (the input topic, or recorded event files),
the way each family is judged (:mod:`~pipelines.reports.incident_plots`), then the evidence the
detector read, the symptoms folded into the incident, the forecast, the runbook, the model that
scored it and the incident's events. Plots are inline SVG and the styles inline: the file opens
from a disk, an artifact store or a mail without any other file or network.

Its parts: :mod:`~pipelines.reports.page_inputs` (the incident's events and the job's metrics),
:mod:`~pipelines.reports.incident_plots` (the plots) and this module (the HTML, from the Jinja2
templates in ``pipelines/reports/templates/``, and the files written).

Every name, id, summary and evidence string is data from a Flink job or the incident topic: the
plots draw it as plain text (no mathtext, no LaTeX), the HTML comes from autoescaping Jinja2
templates, and a page's file name comes from :func:`page_file`, written only inside ``--out``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import jinja2
from markupsafe import Markup, escape

from pipelines.display import printable, utc_time
from pipelines.families import LABELS
from pipelines.errors import SetupError
from pipelines.incidents.evidence import human_duration
from pipelines.reports.incident_plots import HEADING_CHARS, cut_name, plots_for
from pipelines.reports.incident_view import page_file
from pipelines.reports.page_inputs import (MIB, JobMetrics, incident_histories, is_open, job_key, last_open_event,
                                           usable_incidents, window_of)

# What `sentinel report` and the tests use; the parts are importable from their own modules too.
__all__ = ["JobMetrics", "UnknownIncident", "render_index", "render_page", "usable_incidents", "write_pages"]

SEVERITY_COLOURS = {"critical": "#b00020", "warning": "#c77700", "info": "#1f5fa8"}
log = logging.getLogger(__name__)


class UnknownIncident(SetupError, LookupError):
    """An incident id asked for is not among the incident events read."""


# ---------------------------------------------------------------------------------------------
# HTML (Jinja2, every value escaped; control characters shown escaped, see ``printable``)
# ---------------------------------------------------------------------------------------------

def _shown(value):
    """Every value a template writes: markup made here passes, anything else becomes printable
    text (and is then escaped by the environment)."""
    return value if isinstance(value, Markup) else printable("" if value is None else value)


# The templates are files of this package (package data, so an installed wheel has them); the
# HTML ones are autoescaped, the style sheet they include is not (it is ours, not data).
TEMPLATE_ENVIRONMENT = jinja2.Environment(loader=jinja2.PackageLoader("pipelines.reports", "templates"),
                                          autoescape=jinja2.select_autoescape(("html",)),
                                          undefined=jinja2.StrictUndefined, finalize=_shown, keep_trailing_newline=True)
TEMPLATE_ENVIRONMENT.globals.update(colours=SEVERITY_COLOURS)


def _when(ms: int | float | None) -> str:
    return "-" if ms is None else f"{utc_time(ms)} UTC"


def _value(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}"
    return str(value)


def _preformatted(value, sort_keys: bool = False) -> Markup:
    """JSON laid out over lines, made printable and escaped here: its newlines are its layout (a
    newline inside a string is JSON's own ``\\n``)."""
    text = json.dumps(value, indent=1, sort_keys=sort_keys, ensure_ascii=False, default=str)
    return Markup(escape("\n".join(printable(line) for line in text.split("\n"))))


# An id the detector makes (``<family>-<hex>``) is its own file name, so ``alert.incident_url``
# can link to ``{incident_id}.html``; "index" is the index's.
def _where(incident: Mapping) -> str:
    where = str(incident.get("job_name") or incident["job_id"])
    if incident.get("vertex_name"):
        where += f" / {incident['vertex_name']}"
    return where


def render_page(history: Sequence[dict], metrics: JobMetrics) -> str:
    """One incident's page (``history``: its events in order)."""
    last = history[-1]
    latest = last_open_event(history)
    name = _where(last)
    subtask = f" / subtask #{last['subtask_index']}" if last.get("subtask_index") is not None else ""
    forecast = latest.get("forecast")
    forecast_box = None
    if forecast and not last.get("resolved_at"):
        limit = forecast.get("limit")
        forecast_box = {"metric": str(forecast.get("metric")),
                        "limit": f"{limit / MIB:.1f} MiB" if limit else f"its limit ({forecast.get('limit_source')})",
                        "eta": human_duration(forecast["eta_ms"] / 1000),
                        "at": _when(latest["updated_at"] + forecast["eta_ms"])}
    evidence = latest.get("evidence") or {}
    symptoms = [{"family": str(s["family"]).replace("_", " "), "first_seen": _when(s["first_at"]),
                 "evidence": ", ".join(f"{k} {_value(v)}"
                                       for k, v in ((s.get("evidence") or {}).get("features") or {}).items()
                                       if v not in (0, 0.0))}
                for s in latest.get("symptoms") or []]
    raw = {k: v for k, v in evidence.items() if k not in ("features", "ts")}
    model = last.get("model") or {}
    state = (f"resolved {_when(last['resolved_at'])}" if last.get("resolved_at")
             else f"open since {_when(last['opened_at'])}, last update {_when(last['updated_at'])}")
    return TEMPLATE_ENVIRONMENT.get_template("page.html").render(
        title=LABELS.get(last["family"], last["family"]), where=printable(name) + subtask,
        heading=cut_name(name, HEADING_CHARS) + subtask, incident_id=last["incident_id"],
        severity=latest["severity"], state=state, cluster=last["cluster"], job_id=last["job_id"],
        summary=latest["summary"], forecast=forecast_box,
        plots=[Markup(svg) for svg in plots_for(history, metrics)] if not metrics.empty else [],
        symptoms=symptoms, runbook=latest.get("runbook") or [], family=last["family"],
        evidence_at=_when(evidence.get("ts")), score=f"{latest['score']:.3f}",
        features=[(k, _value(v)) for k, v in (evidence.get("features") or {}).items()],
        raw=_preformatted(raw) if raw else None,
        model={k: str(model.get(k)) for k in ("name", "version", "alias")},
        events=[{"event": e["event"], "time": _when(e["updated_at"]), "severity": e["severity"],
                 "summary": e["summary"]} for e in history],
        labels=_preformatted(last.get("labels") or {}, sort_keys=True))


def render_index(histories: Mapping[str, Sequence[dict]], generated_at_ms: int,
                 without_page: frozenset[str] = frozenset()) -> str:
    """The open incidents, worst first, then the resolved ones (latest first); those in
    ``without_page`` are listed without a link."""
    rank = {"critical": 0, "warning": 1, "info": 2}
    open_ = sorted((h for h in histories.values() if is_open(h)),
                   key=lambda h: (rank.get(h[-1]["severity"], 3), -(h[-1]["opened_at"] or 0)))
    resolved = sorted((h for h in histories.values() if not is_open(h)), key=lambda h: -(h[-1]["resolved_at"] or 0))

    def rows(items: list[Sequence[dict]], resolved_: bool) -> list[dict]:
        return [{"severity": last_open_event(h)["severity"], "family": h[-1]["family"],
                 "href": None if h[-1]["incident_id"] in without_page else page_file(h[-1]["incident_id"]),
                 "where": printable(_where(h[-1])),
                 "heading": cut_name(_where(h[-1]), HEADING_CHARS), "opened": _when(h[-1]["opened_at"]),
                 "until": _when(h[-1]["resolved_at"] if resolved_ else h[-1]["updated_at"]),
                 "summary": last_open_event(h)["summary"]} for h in items]

    return TEMPLATE_ENVIRONMENT.get_template("index.html").render(open=rows(open_, False), resolved=rows(resolved, True),
                                                             generated=_when(generated_at_ms))


def _write_inside(root: Path, name: str, text: str) -> Path:
    """Write ``root/name`` whole (a reader of the folder never sees half a page) and never
    elsewhere: ``name`` must be a plain file name, and a link already there is replaced, not
    followed."""
    path = root / name
    if path.parent != root or name in ("", ".", ".."):
        raise ValueError(f"refusing to write {name!r} outside {root}")
    handle, temporary = tempfile.mkstemp(dir=root, prefix=".writing-", suffix=".html")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", errors="backslashreplace") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def write_pages(incident_events: Sequence[dict], job_events: Iterable[Mapping], directory: Path,
                only: Sequence[str] = ()) -> list[Path]:
    """Every incident's page (or ``only`` those ids) and ``index.html`` into ``directory``.

    ``job_events``: input events of (at least) the incidents' jobs; others are skipped. An
    incident whose page cannot be drawn (values the contract leaves free) is logged and listed in
    the index without a link. Returns the pages written, the index first; all inside ``directory``.
    """
    histories = incident_histories(incident_events)
    missing = [i for i in only if i not in histories]
    if missing:
        raise UnknownIncident(f"no incident {', '.join(printable(i) for i in missing)} among the "
                              f"{len(histories)} incidents read")
    wanted = {job_key(h[-1]) for h in histories.values()}
    per_job: dict[tuple[str, str], list[Mapping]] = {}
    for event in job_events:
        key = (event.get("cluster"), event.get("job_id"))
        if key in wanted:
            per_job.setdefault(key, []).append(event)
    empty = JobMetrics.from_events([])
    metrics = {}
    for key, events in per_job.items():
        try:
            metrics[key] = JobMetrics.from_events(events)
        except Exception as exc:  # one job's odd events cost its plots, not the report
            log.warning("the metrics of job %s on cluster %s could not be read (%s: %s); its pages have no plots",
                        printable(key[1]), printable(key[0]), type(exc).__name__, printable(exc))
            metrics[key] = empty
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    root = directory.resolve()
    written, without_page = [], set()
    for incident_id, history in histories.items():
        if only and incident_id not in only:
            continue
        try:
            page = render_page(history, metrics.get(job_key(history[-1]), empty).between(*window_of(history)))
        except Exception as exc:  # an incident's odd values (the forecast is free form) cost its page only
            log.warning("no page for incident %s: %s: %s", printable(incident_id), type(exc).__name__,
                        printable(exc))
            without_page.add(incident_id)
            continue
        written.append(_write_inside(root, page_file(incident_id), page))
    # The index last: it knows which incidents got no page.
    latest_ms = max((e["updated_at"] or 0 for e in incident_events), default=0)
    index = _write_inside(root, "index.html", render_index(histories, latest_ms, frozenset(without_page)))
    return [directory / p.name for p in [index, *written]]
