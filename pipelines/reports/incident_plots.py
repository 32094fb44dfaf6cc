"""The plots of an incident page, matplotlib drawn to inline SVG from the job's raw metrics, the
way each family is judged:

* **state leak**: the state of the incident's vertex (its largest subtask's when the forecast is
  against the job's own per-subtask limit), the trend the detector fitted (its relative slope at
  the decision), and the forecast running into the limit;
* **skew**: per-subtask bars of records in and state, the hot subtask marked;
* **backpressure**: busy and backpressured time per vertex over time, the bottleneck in bold;
* **checkpoint failure** (and every other page, below its own plot): checkpoint durations against
  the interval and the timeout, failed checkpoints marked, restarts shown.

Names are data from a Flink job: every plot draws them as plain text (no mathtext, no LaTeX).
"""

from __future__ import annotations

import functools
import io
from typing import Sequence

import pandas as pd

from feature_store.definitions import SHORT_WINDOW_CHECKPOINTS
from pipelines.display import printable
from pipelines.families import BY_NAME
from pipelines.families.base import BARRIER_METRIC, eta_text, timeout_forecast_in
from pipelines.incidents.evidence import human_duration
from pipelines.reports.page_inputs import MIB, JobMetrics, last_open_event


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


def cut_name(name, chars: int) -> str:
    """``name`` printable, its middle cut out for an ellipsis when longer than ``chars`` (the two
    ends tell operator chains apart: where they start, and the operator they end at)."""
    text = printable(name)
    if len(text) <= chars:
        return text
    head = (chars - 1) // 2
    return text[:head] + "…" + text[len(text) - (chars - 1 - head):]


def _plot_name(name) -> str:
    return cut_name(name, PLOT_NAME_CHARS)


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
        start, start_value, end_value, per_ms = fitted_trend(at["ts"], at[column], slope, decided_at,
                                                             SHORT_WINDOW_CHECKPOINTS * interval)
        ax.plot([_time(start), _time(decided_at)], [start_value / MIB, end_value / MIB],
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


def fitted_trend(ts: pd.Series, values: pd.Series, rel_slope_per_h: float, decided_at: float,
                 span_ms: float) -> tuple[float, float, float, float]:
    """The line a relative slope (per hour, over the window's mean, as the features give it) draws
    over the ``span_ms`` before ``decided_at``: ``(start_ts, value at start, value at decided_at,
    slope per ms)``, through the window's mean at its mean time as a least-squares line passes."""
    start = max(float(ts.iloc[0]), decided_at - span_ms)
    inside = (ts >= start) & (ts <= decided_at)
    if not inside.any():  # nothing in the window: through the latest point
        inside = ts == ts.iloc[-1]
    mean_ts, mean_value = float(ts[inside].mean()), float(values[inside].mean())
    per_ms = rel_slope_per_h * mean_value / 3_600_000.0
    return (start, mean_value + per_ms * (start - mean_ts), mean_value + per_ms * (decided_at - mean_ts), per_ms)


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
    incident = last_open_event(history) if history else {}
    waits = metrics.barrier_waits[metrics.barrier_waits["vertex_id"] == incident.get("vertex_id")]
    barrier = timeout_forecast_in(incident.get("forecasts"), (BARRIER_METRIC,))
    if barrier and len(waits):
        ax.plot(_times(waits["trigger_ts"]), waits["wait_ms"] / 1000.0, color="#7a5195", linewidth=1, marker=".",
                markersize=3, label=f"barrier wait of {_plot_name(incident.get('vertex_name'))}")
    _timeout_forecast(ax, incident, timeout_forecast_in(incident.get("forecasts")), done["trigger_ts"],
                      done["duration_ms"], "#1f5fa8", "the timeout")
    _timeout_forecast(ax, incident, barrier, waits["trigger_ts"], waits["wait_ms"], "#7a5195",
                      "barriers wait out the timeout")
    ax.set_ylabel("duration (s)")
    ax.set_title("Checkpoint durations", loc="left")
    _marks(ax, history, restart_times(metrics))
    _time_axis(ax)
    _legend(ax)
    return _svg(fig)


def _timeout_forecast(ax, incident: dict, forecast: dict | None, times: pd.Series, values_ms: pd.Series, colour: str,
                      what: str) -> None:
    """One of the incident's latest forecasts against the timeout: from the series' last value
    before it (checkpoints' durations, or the vertex's barrier waits), a line to the timeout at
    its ETA and the band of its 95 % bounds (to the plot's edge where the band is open above)."""
    at = incident.get("updated_at")
    if not forecast or at is None or not forecast.get("limit") or forecast["eta_ms"] <= 0:
        return
    before = values_ms[(times <= at).to_numpy()].dropna()
    if before.empty:
        return
    value, limit = float(before.iloc[-1]), forecast["limit"]
    eta, low, high = forecast["eta_ms"], forecast.get("eta_low_ms") or forecast["eta_ms"], forecast.get("eta_high_ms")
    edge = at + (high if high is not None else 2 * eta)
    ax.fill([_time(at), _time(at + low), _time(edge)], [value / 1000.0, limit / 1000.0, limit / 1000.0],
            color=colour, alpha=0.15, linewidth=0, label="its 95 % band" + ("" if high is not None else " (open above)"))
    ax.plot([_time(at), _time(at + eta)], [value / 1000.0, limit / 1000.0],
            color=colour, linewidth=1.6, linestyle="--", label=f"forecast: {what} in {eta_text(forecast)}")


# The page plots a family's spec can name (``Family.page_plot``), by what they draw.
PAGE_PLOTS = {"state": leak_plot, "vertex_pressure": backpressure_plot, "subtask_shares": skew_plot}


def plots_for(history: Sequence[dict], metrics: JobMetrics) -> list[str]:
    """The family's decisive plot first, then the checkpoints every page shows."""
    kind = BY_NAME[history[-1]["family"]].page_plot
    plots = [PAGE_PLOTS[kind](history, metrics)] if kind else []
    plots.append(checkpoint_plot(history, metrics))
    return [p for p in plots if p]
