"""``sentinel report``: one self-contained HTML page per incident, and an index of the open ones.

The page is what on-call opens from an alert (the ``incident_url`` annotation). It draws the
incident's decisive series from the job's raw metrics (the input topic, or recorded event files),
the way each family is judged:

* **state leak**: the state of the incident's vertex (its largest subtask's when the forecast is
  against the job's own per-subtask limit), the trend the detector fitted (its relative slope at
  the decision), and the forecast running into the limit;
* **skew**: per-subtask bars of records in and state, the hot subtask marked;
* **backpressure**: busy and backpressured time per vertex over time, the bottleneck in bold;
* **checkpoint failure** (and every other page, below its own plot): checkpoint durations against
  the interval and the timeout, failed checkpoints marked, restarts shown.

Then the evidence the detector read, the symptoms folded into the incident, the forecast, the
runbook, the model that scored it and the incident's events. Plots are inline SVG and the styles
inline: the file opens from a disk, an artifact store or a mail without any other file or network.

Every name, id, summary and evidence string is data from a Flink job or the incident topic: the
plots draw it as plain text (no mathtext, no LaTeX), the HTML comes from autoescaping Jinja2
templates, and a page's file name comes from :func:`page_file`, written only inside ``--out``.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import jinja2
import pandas as pd
from markupsafe import Markup, escape

from feature_store.definitions import SHORT_WINDOW_CHECKPOINTS
from pipelines.display import printable, utc_time
from pipelines.families import BACKPRESSURE, LABELS, SKEW, STATE_LEAK
from pipelines.errors import SetupError
from pipelines.incidents.evidence import human_duration
from pipelines.reports.incident_view import page_file

# Before the incident opened, how much history the plots show (enough for a leak's warm-up and
# the slope window; a longer one makes the decisive minutes unreadable).
LOOKBACK_MS = 30 * 60_000
# After the incident's last event (for an open one: what has come in since).
LOOKAHEAD_MS = 5 * 60_000
SEVERITY_COLOURS = {"critical": "#b00020", "warning": "#c77700", "info": "#1f5fa8"}
MIB = 1024 * 1024
log = logging.getLogger(__name__)


class UnknownIncident(SetupError, LookupError):
    """An incident id asked for is not among the incident events read."""


# ---------------------------------------------------------------------------------------------
# Inputs: the incident's events and the job's metrics
# ---------------------------------------------------------------------------------------------

def usable_incidents(records: Iterable) -> tuple[list[dict], list[str]]:
    """The records that are incident events (they keep the incident contract), and for each
    other one why not: a record anyone wrote to the topic must not stop the pages of the rest."""
    from pipelines.contracts import INCIDENT

    usable, refused = [], []
    for record in records:
        if INCIDENT.accepts(record):
            usable.append(record)
        else:
            refused.append("; ".join(INCIDENT.errors(record)[:3]))
    return usable, refused


def incident_histories(events: Iterable[dict]) -> dict[str, list[dict]]:
    """Incident id -> its events in the order they were published (the last is its state)."""
    histories: dict[str, list[dict]] = {}
    for event in events:
        histories.setdefault(event["incident_id"], []).append(event)
    return histories


def is_open(history: Sequence[dict]) -> bool:
    return history[-1]["event"] != "resolved"


def last_open_event(history: Sequence[dict]) -> dict:
    """The incident's last event before any resolution: its summary, severity, evidence and
    forecast as they stood while it was open (a resolution carries none of them)."""
    return next((e for e in reversed(history) if e["event"] != "resolved"), history[-1])


@dataclass
class JobMetrics:
    """One Flink job's raw metrics as frames (event time ``ts``, epoch ms)."""

    checkpoints: pd.DataFrame  # ts, trigger_ts, checkpoint_id, status, duration_ms, state_size_bytes, failure_message
    vertex_state: pd.DataFrame  # ts, vertex_id, vertex_name, state_size_bytes, largest_subtask_bytes (completed ones)
    subtask_state: pd.DataFrame  # ts, vertex_id, index, state_size_bytes (completed checkpoints)
    samples: pd.DataFrame  # ts, vertex_id, vertex_name, index, busy, backpressured, records_in_per_s
    status: pd.DataFrame  # ts, state, num_restarts, interval_ms, timeout_ms, max_state_size_bytes

    @classmethod
    def from_events(cls, events: Iterable[Mapping]) -> "JobMetrics":
        checkpoints, vertex_state, subtask_state, samples, status = [], [], [], [], []
        for e in events:
            kind, ts = e.get("kind"), e.get("ts")
            if kind == "checkpoint" and not e.get("is_savepoint"):
                checkpoints.append({"ts": ts, "trigger_ts": e.get("trigger_ts") or ts, "checkpoint_id": e["checkpoint_id"],
                                    "status": e["status"], "duration_ms": e.get("end_to_end_duration_ms"),
                                    "state_size_bytes": e.get("state_size_bytes"),
                                    "failure_message": e.get("failure_message")})
                if e["status"] != "COMPLETED":
                    continue
                for v in e.get("vertices") or []:
                    sizes = [s.get("state_size_bytes") or 0 for s in v.get("subtasks") or []]
                    vertex_state.append({"ts": ts, "vertex_id": v["vertex_id"], "vertex_name": v["vertex_name"],
                                         "state_size_bytes": v.get("state_size_bytes"),
                                         "largest_subtask_bytes": max(sizes) if sizes else None})
                    subtask_state.extend({"ts": ts, "vertex_id": v["vertex_id"], "index": s["index"],
                                          "state_size_bytes": s.get("state_size_bytes")} for s in v.get("subtasks") or [])
            elif kind == "vertex_metrics":
                samples.extend({"ts": ts, "vertex_id": e["vertex_id"], "vertex_name": e["vertex_name"],
                                "index": s["index"], "busy": s.get("busy_time_ms_per_s"),
                                "backpressured": s.get("backpressured_time_ms_per_s"),
                                "records_in_per_s": s.get("records_in_per_s")} for s in e.get("subtasks") or [])
            elif kind == "job_status":
                status.append({"ts": ts, "state": e.get("state"), "num_restarts": e.get("num_restarts"),
                               "interval_ms": e.get("checkpoint_interval_ms"),
                               "timeout_ms": e.get("checkpoint_timeout_ms"),
                               "max_state_size_bytes": e.get("max_state_size_bytes")})

        def frame(rows: list[dict], columns: Sequence[str]) -> pd.DataFrame:
            return pd.DataFrame(rows, columns=list(columns)).sort_values("ts", kind="stable").reset_index(drop=True)

        return cls(frame(checkpoints, ("ts", "trigger_ts", "checkpoint_id", "status", "duration_ms",
                                       "state_size_bytes", "failure_message")),
                   frame(vertex_state, ("ts", "vertex_id", "vertex_name", "state_size_bytes", "largest_subtask_bytes")),
                   frame(subtask_state, ("ts", "vertex_id", "index", "state_size_bytes")),
                   frame(samples, ("ts", "vertex_id", "vertex_name", "index", "busy", "backpressured",
                                   "records_in_per_s")),
                   frame(status, ("ts", "state", "num_restarts", "interval_ms", "timeout_ms", "max_state_size_bytes")))

    def between(self, start_ms: int, end_ms: int) -> "JobMetrics":
        def cut(df: pd.DataFrame) -> pd.DataFrame:
            return df[(df["ts"] >= start_ms) & (df["ts"] <= end_ms)].reset_index(drop=True)
        return JobMetrics(cut(self.checkpoints), cut(self.vertex_state), cut(self.subtask_state), cut(self.samples),
                          cut(self.status))

    @property
    def empty(self) -> bool:
        return self.checkpoints.empty and self.samples.empty and self.status.empty

    def latest_status(self, column: str) -> float | None:
        values = self.status[column].dropna() if column in self.status else pd.Series(dtype="float64")
        return float(values.iloc[-1]) if len(values) else None


def job_key(event: Mapping) -> tuple[str, str]:
    return event["cluster"], event["job_id"]


def window_of(history: Sequence[dict]) -> tuple[int, int]:
    """The event time a page's plots cover."""
    first, last = history[0], history[-1]
    end = last.get("resolved_at") or last["updated_at"]
    return int(first["opened_at"]) - LOOKBACK_MS, int(end) + LOOKAHEAD_MS


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib to inline SVG)
# ---------------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False})
    return plt


# Names are text, never markup: Flink SQL names operators like ``Calc(select=[a, EXPR$0])``, and
# mathtext would typeset (or fail on) anything between two dollars, LaTeX on any special character.
PLAIN_TEXT = {"text.parse_math": False, "text.usetex": False}


def _plain_text(plot):
    """Run a plot with every text artist it makes (titles, labels, legends, ticks) taken as written."""
    @functools.wraps(plot)
    def plain(*args, **kwargs):
        import matplotlib

        with matplotlib.rc_context(PLAIN_TEXT):
            return plot(*args, **kwargs)
    return plain


# Flink SQL names a chain of operators after all of them: a name thousands of characters long
# would shrink a plot to a sliver (a legend entry as wide) and push a page's heading off the screen.
# Plots and headings cut names to these many characters; the page shows the whole name below.
PLOT_NAME_CHARS = 60
HEADING_CHARS = 160


def _cut(name, chars: int) -> str:
    """``name`` printable, its middle cut out for an ellipsis when longer than ``chars`` (the two
    ends tell operator chains apart: where they start, and the operator they end at)."""
    text = printable(name)
    if len(text) <= chars:
        return text
    head = (chars - 1) // 2
    return text[:head] + "…" + text[len(text) - (chars - 1 - head):]


def _plot_name(name) -> str:
    return _cut(name, PLOT_NAME_CHARS)


def _svg(fig) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    _pyplot().close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # the XML prologue and doctype are not allowed inside HTML


def _times(ms: pd.Series | Sequence[float]):
    return pd.to_datetime(pd.Series(ms, dtype="float64"), unit="ms", utc=True).dt.tz_localize(None)


def _time(ms: float):
    return pd.Timestamp(ms, unit="ms")


def _time_axis(ax) -> None:
    import matplotlib.dates as mdates

    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    ax.set_xlabel("event time (UTC)")
    ax.grid(alpha=0.25)


def _marks(ax, history: Sequence[dict], restarts: Sequence[float] = ()) -> None:
    """The incident's opening, its symptoms' first moments, its resolution, and restarts."""
    first, last = history[0], history[-1]
    ax.axvline(_time(first["opened_at"]), color="#b00020", linewidth=1.4, label="incident opened")
    for symptom in last.get("symptoms") or []:
        ax.axvline(_time(symptom["first_at"]), color="#6b4f9c", linewidth=1, linestyle="--",
                   label=f"symptom: {_plot_name(symptom['family']).replace('_', ' ')}")
    if last.get("resolved_at"):
        ax.axvline(_time(last["resolved_at"]), color="#2e7d32", linewidth=1.2, label="resolved")
    for i, ts in enumerate(restarts):
        ax.axvline(_time(ts), color="#555555", linewidth=0.8, linestyle=":", label="job restarted" if i == 0 else None)


def _legend(ax) -> None:
    # Beside the plot, not on it: the curves run everywhere a legend could sit.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)


def restart_times(metrics: JobMetrics) -> list[float]:
    restarts = metrics.status["num_restarts"].astype("float64")
    return metrics.status.loc[restarts.diff() > 0, "ts"].astype("float64").tolist()


@_plain_text
def leak_plot(history: Sequence[dict], metrics: JobMetrics) -> str | None:
    """State over time, the detector's trend at the decision, and the forecast to the limit."""
    incident = last_open_event(history)
    forecast = incident.get("forecast") or {}
    per_subtask = forecast.get("metric") == "largest_subtask_state_bytes"
    if incident.get("vertex_id") and not metrics.vertex_state.empty:
        series = metrics.vertex_state[metrics.vertex_state["vertex_id"] == incident["vertex_id"]]
        column = "largest_subtask_bytes" if per_subtask else "state_size_bytes"
        label = f"{_plot_name(incident.get('vertex_name'))}: " + ("largest subtask's state" if per_subtask else "state")
    else:
        series, column = metrics.checkpoints[metrics.checkpoints["status"] == "COMPLETED"], "state_size_bytes"
        label = "job state"
    series = series.dropna(subset=[column])
    if series.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot(_times(series["ts"]), series[column] / MIB, color="black", linewidth=1.3, marker=".", markersize=3,
            label=label)
    limit = forecast.get("limit") or (metrics.latest_status("max_state_size_bytes") if forecast.get("limit_source") == "job"
                                      else None)
    features = (incident.get("evidence") or {}).get("features") or {}
    slope = features.get("vertex_state_rel_slope_per_h", features.get("state_rel_slope_per_h"))
    decided_at = (incident.get("evidence") or {}).get("ts") or incident["updated_at"]
    at = series[series["ts"] <= decided_at]
    if slope and not at.empty:
        size, interval = float(at[column].iloc[-1]), metrics.latest_status("interval_ms") or 60_000.0
        per_ms = slope * size / 3_600_000.0
        start = max(float(series["ts"].iloc[0]), decided_at - SHORT_WINDOW_CHECKPOINTS * interval)
        ax.plot([_time(start), _time(decided_at)], [(size - per_ms * (decided_at - start)) / MIB, size / MIB],
                color="#1f5fa8", linewidth=2.2, alpha=0.8, label=f"trend the detector fitted ({slope * 100:.0f}%/h)")
        eta = forecast.get("eta_ms")
        if eta is not None and limit:
            reach = size + per_ms * eta
            ax.plot([_time(decided_at), _time(decided_at + eta)], [size / MIB, reach / MIB], color="#1f5fa8",
                    linewidth=1.6, linestyle="--", label=f"forecast: limit in {human_duration(eta / 1000)}")
    if limit:
        ax.axhline(limit / MIB, color="#b00020", linewidth=1.2, linestyle="-.", label=f"limit {limit / MIB:.1f} MiB")
    ax.set_ylabel("MiB")
    ax.set_title("State size" + (" against its limit" if limit else " (no known limit)"), loc="left")
    _marks(ax, history, restart_times(metrics))
    _time_axis(ax)
    _legend(ax)
    return _svg(fig)


@_plain_text
def backpressure_plot(history: Sequence[dict], metrics: JobMetrics) -> str | None:
    """Busy and backpressured time per vertex (the worst subtask), the incident's vertex in bold."""
    if metrics.samples.empty:
        return None
    incident = history[-1]
    worst = (metrics.samples.groupby(["ts", "vertex_id", "vertex_name"], as_index=False)[["busy", "backpressured"]]
             .max())
    plt = _pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, ((vertex_id, name), rows) in enumerate(worst.groupby(["vertex_id", "vertex_name"], sort=False)):
        ours = vertex_id == incident.get("vertex_id")
        style = {"color": colours[n % len(colours)], "linewidth": 2.4 if ours else 1.0,
                 "label": _plot_name(name) + (" (the bottleneck)" if ours else "")}
        axes[0].plot(_times(rows["ts"]), rows["busy"], **style)
        axes[1].plot(_times(rows["ts"]), rows["backpressured"], **style)
    for ax, what in zip(axes, ("busy", "backpressured")):
        ax.set_ylabel(f"{what} ms/s")
        ax.set_ylim(-20, 1020)
        _marks(ax, history, restart_times(metrics))
        _time_axis(ax)
    axes[0].set_title("Busy and backpressured time per vertex (its worst subtask)", loc="left")
    axes[0].set_xlabel("")
    _legend(axes[0])
    return _svg(fig)


@_plain_text
def skew_plot(history: Sequence[dict], metrics: JobMetrics) -> str | None:
    """Per-subtask records in (mean of a minute) and state (a checkpoint), when the incident opened
    and at its latest (a hot key often keeps heating up after the first sign)."""
    last = history[-1]
    vertex, hot = last.get("vertex_id"), last.get("subtask_index")
    moments = [("when it opened", int(history[0]["opened_at"])),
               ("latest", int(last.get("resolved_at") or last["updated_at"]))]
    samples = metrics.samples[metrics.samples["vertex_id"] == vertex]
    states = metrics.subtask_state[metrics.subtask_state["vertex_id"] == vertex]

    def records_at(ts: int) -> pd.Series:
        minute = samples[(samples["ts"] <= ts) & (samples["ts"] > ts - 60_000)]
        return minute.groupby("index")["records_in_per_s"].mean().dropna()

    def state_at(ts: int) -> pd.Series:
        before = states[states["ts"] <= ts]
        if before.empty:
            return pd.Series(dtype="float64")
        return before[before["ts"] == before["ts"].max()].set_index("index")["state_size_bytes"].fillna(0) / MIB

    panels = [(label, [(name, f(ts)) for name, ts in moments]) for label, f in
              (("records in /s (mean of a minute)", records_at), ("state MiB (a checkpoint)", state_at))]
    panels = [(label, series) for label, series in panels if any(len(v) and v.sum() > 0 for _, v in series)]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(9, 3.2), squeeze=False)
    for ax, (label, series) in zip(axes[0], panels):
        for n, (name, values) in enumerate(series):
            index = [int(i) for i in values.index]
            colours = ["#b00020" if i == hot else "#8a9bb0" for i in index]
            ax.bar([i + (n - 0.5) * 0.4 for i in index], values.to_numpy(), width=0.38, color=colours,
                   alpha=0.45 if n == 0 else 1.0, label=name)
        ax.set_xticks(sorted({int(i) for _, v in series for i in v.index}))
        ax.set_xlabel("subtask (left: when it opened, right: latest)")
        ax.set_title(label, loc="left")
    hot_text = f", the hot one #{hot} in red" if hot is not None else ""
    fig.suptitle(f"{_plot_name(last.get('vertex_name'))}: load per subtask{hot_text}", x=0.01, y=1.04, ha="left",
                 fontsize=10)
    return _svg(fig)


@_plain_text
def checkpoint_plot(history: Sequence[dict], metrics: JobMetrics) -> str | None:
    """Each checkpoint's duration at its trigger time, against the interval and the timeout."""
    if metrics.checkpoints.empty and metrics.status.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    done = metrics.checkpoints[metrics.checkpoints["status"] == "COMPLETED"]
    failed = metrics.checkpoints[metrics.checkpoints["status"] != "COMPLETED"]
    ax.plot(_times(done["trigger_ts"]), done["duration_ms"] / 1000.0, color="black", linewidth=1, marker=".",
            markersize=4, label="completed")
    if len(failed):
        ax.scatter(_times(failed["trigger_ts"]), failed["duration_ms"].fillna(0) / 1000.0, color="#b00020", marker="x",
                   s=40, zorder=3, label="failed")
    for column, label, style in (("interval_ms", "interval", ":"), ("timeout_ms", "timeout", "-.")):
        value = metrics.latest_status(column)
        if value:
            ax.axhline(value / 1000.0, color="#555555", linestyle=style, linewidth=1, label=f"{label} {value / 1000:.0f}s")
    ax.set_ylabel("duration (s)")
    ax.set_title("Checkpoint durations", loc="left")
    _marks(ax, history, restart_times(metrics))
    _time_axis(ax)
    _legend(ax)
    return _svg(fig)


PRIMARY_PLOTS = {STATE_LEAK: leak_plot, BACKPRESSURE: backpressure_plot, SKEW: skew_plot}


def plots_for(history: Sequence[dict], metrics: JobMetrics) -> list[str]:
    """The family's decisive plot first, then the checkpoints every page shows."""
    family = history[-1]["family"]
    plots = [PRIMARY_PLOTS[family](history, metrics)] if family in PRIMARY_PLOTS else []
    plots.append(checkpoint_plot(history, metrics))
    return [p for p in plots if p]


# ---------------------------------------------------------------------------------------------
# HTML (Jinja2, every value escaped; control characters shown escaped, see ``printable``)
# ---------------------------------------------------------------------------------------------

STYLE = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1000px;color:#1d1d1f;
line-height:1.4;padding:0 16px}h1{font-size:22px;margin:4px 0 6px}h2{font-size:16px;margin:26px 0 8px;
border-bottom:1px solid #ddd;padding-bottom:3px}.badge{display:inline-block;padding:2px 8px;border-radius:10px;
color:#fff;font-size:12px;font-weight:600;text-transform:uppercase;margin-right:6px}.state{font-size:12px;
color:#555}table{border-collapse:collapse;font-size:13px}td,th{padding:3px 10px 3px 0;text-align:left;
vertical-align:top}th{color:#555;font-weight:600}.num{text-align:right;font-variant-numeric:tabular-nums}
.plot svg{max-width:100%;height:auto}.summary{font-size:15px;margin:8px 0}code,pre{font-size:12px;
background:#f5f5f7;border-radius:4px}pre{padding:8px;overflow-x:auto}.muted{color:#777;font-size:12px}
.forecast{background:#fff4f4;border-left:4px solid #b00020;padding:6px 10px;margin:10px 0}
.fullname{overflow-wrap:anywhere}
"""

TEMPLATES = {
    "macros": """\
{% macro badge(severity) -%}
<span class="badge" style="background:{{ colours.get(severity, '#555') }}">{{ severity }}</span>
{%- endmacro %}
""",
    "page": """\
{% from "macros" import badge %}<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title }}: {{ heading }}</title>
<style>{{ style }}</style></head><body>
<div class="state">checkpoint-sentinel incident <code>{{ incident_id }}</code> · \
<a href="index.html">all open incidents</a></div>
<h1>{{ badge(severity) }}{{ title }}: {{ heading }}</h1>
{% if heading != where %}<div class="state fullname">in full: <code>{{ where }}</code></div>
{% endif %}<div class="state">{{ state }} · cluster {{ cluster }} · job id <code>{{ job_id }}</code></div>
<p class="summary">{{ summary }}</p>
{% if forecast %}<div class="forecast"><b>Forecast:</b> {{ forecast.metric }} reaches {{ forecast.limit }} in about \
<b>{{ forecast.eta }}</b> (at {{ forecast.at }}).</div>
{% endif %}<h2>What the detector saw</h2>
{% for svg in plots %}<div class="plot">{{ svg }}</div>
{% else %}<p class="muted">No metrics of this job were found for the incident's time: the input topic has been \
compacted or the events were not given.</p>
{% endfor %}{% if symptoms %}<h2>Symptoms folded into this incident</h2>
<table><tr><th>family</th><th>first seen</th><th>evidence</th></tr>
{% for s in symptoms %}<tr><td>{{ s.family }}</td><td>{{ s.first_seen }}</td><td>{{ s.evidence }}</td></tr>
{% endfor %}</table>
{% endif %}<h2>Runbook</h2>
<ol>
{% for step in runbook %}<li>{{ step }}</li>
{% endfor %}</ol>
<h2>Evidence</h2>
<p class="muted">The features the {{ family }} detector read at {{ evidence_at }} (score {{ score }}), then recent \
raw values.</p>
<table><tr><th>feature</th><th class=num>value</th></tr>
{% for name, value in features %}<tr><td><code>{{ name }}</code></td><td class=num>{{ value }}</td></tr>
{% endfor %}</table>
{% if raw %}<pre>{{ raw }}</pre>
{% endif %}<h2>Model</h2>
<p><code>{{ model.name }}</code> version {{ model.version }} (alias {{ model.alias }})</p>
<h2>Events</h2>
<table><tr><th>event</th><th>time</th><th>severity</th><th>summary</th></tr>
{% for e in events %}<tr><td>{{ e.event }}</td><td>{{ e.time }}</td><td>{{ badge(e.severity) }}</td>\
<td>{{ e.summary }}</td></tr>
{% endfor %}</table>
<h2>Labels</h2>
<pre>{{ labels }}</pre>
</body></html>
""",
    "index": """\
{% from "macros" import badge %}<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>checkpoint-sentinel: {{ open|length }} open incidents</title>\
<style>{{ style }}</style></head><body>
<h1>{{ open|length }} open incident{{ '' if open|length == 1 else 's' }}</h1>
<div class="state">as of {{ generated }} (the latest incident event)</div>
{% macro rows(items, resolved) -%}
<table><tr><th>severity</th><th>family</th><th>job / vertex</th><th>opened</th><th>{{ 'resolved' if resolved else \
'last update' }}</th><th>summary</th></tr>
{% for i in items %}<tr><td>{{ badge(i.severity) }}</td><td>{{ i.family }}</td><td>{% if i.href %}\
<a href="{{ i.href }}"{% if i.heading != i.where %} title="{{ i.where }}"{% endif %}>{{ i.heading }}</a>\
{% else %}{{ i.heading }} <span class="muted">(no page: see the report's log)</span>{% endif %}</td>\
<td>{{ i.opened }}</td><td>{{ i.until }}</td><td>{{ i.summary }}</td></tr>
{% endfor %}</table>
{%- endmacro %}
{% if open %}{{ rows(open, False) }}{% else %}<p class="muted">None.</p>{% endif %}
{% if resolved %}<h2>Resolved ({{ resolved|length }})</h2>
{{ rows(resolved, True) }}
{% endif %}</body></html>
""",
}


def _shown(value):
    """Every value a template writes: markup made here passes, anything else becomes printable
    text (and is then escaped by the environment)."""
    return value if isinstance(value, Markup) else printable("" if value is None else value)


TEMPLATE_ENVIRONMENT = jinja2.Environment(loader=jinja2.DictLoader(TEMPLATES), autoescape=True,
                                          undefined=jinja2.StrictUndefined, finalize=_shown, keep_trailing_newline=True)
TEMPLATE_ENVIRONMENT.globals.update(style=Markup(STYLE), colours=SEVERITY_COLOURS)


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
    return TEMPLATE_ENVIRONMENT.get_template("page").render(
        title=LABELS.get(last["family"], last["family"]), where=printable(name) + subtask,
        heading=_cut(name, HEADING_CHARS) + subtask, incident_id=last["incident_id"],
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
                 "heading": _cut(_where(h[-1]), HEADING_CHARS), "opened": _when(h[-1]["opened_at"]),
                 "until": _when(h[-1]["resolved_at"] if resolved_ else h[-1]["updated_at"]),
                 "summary": last_open_event(h)["summary"]} for h in items]

    return TEMPLATE_ENVIRONMENT.get_template("index").render(open=rows(open_, False), resolved=rows(resolved, True),
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
