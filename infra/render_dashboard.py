"""The Grafana dashboard drawn without Grafana, for docs/OPERATIONS.md's picture: every panel's
queries run over a time range (``query_range``) against a real Prometheus, laid out by the JSON
model's rows and ``gridPos`` as an HTML page of inline SVG (no JavaScript), and photographed by
headless Chromium (Debian's ``chromium``)::

    python -m infra.render_dashboard --prometheus http://127.0.0.1:9090 --minutes 15 --out docs/dashboard.png

It is not Grafana: the lines, stats and legends are drawn here, the way Grafana's timeseries and
stat panels show them by default, and the page says so. docs/dashboard.png is made by
tests/infra/test_prometheus_server.py's stack with ``PYTEST_DASHBOARD_SCREENSHOT=docs/dashboard.png``.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from infra import grafana_dashboard

DASHBOARD = Path(__file__).resolve().parent / "grafana" / "checkpoint-sentinel.json"
# Grafana's grid: 24 columns, a height unit of 30 px; its classic palette, in its order.
WIDTH_PX, UNIT_PX, COLUMNS, HEADER_PX = 1500, 30, 24, 64
PALETTE = ("#73BF69", "#F2CC0C", "#8AB8FF", "#FF780A", "#F2495C", "#5794F2", "#B877D9", "#FADE2A")
# A stat panel's colour with no thresholds of its own: Grafana's defaults (green, red from 80).
DEFAULT_THRESHOLDS = ((None, "#73BF69"), (80.0, "#F2495C"))
POINTS = 240  # samples per series across the range: a line as smooth as the panel is wide


@dataclass(frozen=True)
class Series:
    """One line of a panel: its legend and its ``(epoch s, value)`` points (NaN where Prometheus had none)."""

    legend: str
    points: tuple[tuple[float, float], ...]

    def last(self) -> float | None:
        finite = [v for _, v in self.points if math.isfinite(v)]
        return finite[-1] if finite else None


def legend(template: str, labels: dict[str, str]) -> str:
    """A query's ``legendFormat`` with its ``{{label}}`` filled as Grafana does.

    >>> legend("p99 {{cluster}}", {"cluster": "lab"})
    'p99 lab'
    """
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template) or str(labels)


def query_range(prometheus_url: str, expr: str, start: float, end: float, step_s: float) -> list[dict]:
    """The matrix ``expr`` evaluates to over ``[start, end]``; a query Prometheus rejects raises."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step_s})
    try:
        with urllib.request.urlopen(f"{prometheus_url}/api/v1/query_range?{params}", timeout=30) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:  # a bad query: Prometheus says why in the body
        answer = json.loads(exc.read())
    if answer.get("status") != "success":
        raise ValueError(f"{expr}: {answer.get('errorType')}: {answer.get('error')}")
    return answer["data"]["result"]


def panel_series(prometheus_url: str, model: dict, start: float, end: float,
                 rate_interval: str = "1m") -> dict[int, list[Series]]:
    """Every non-row panel's series by panel id, its queries as Grafana sends them (the job
    variables at their defaults), at one step for the whole dashboard."""
    step = max(1.0, round((end - start) / POINTS))
    found: dict[int, list[Series]] = {}
    for panel in model["panels"]:
        if panel["type"] == "row":
            continue
        found[panel["id"]] = [
            Series(legend(target.get("legendFormat", ""), item["metric"]),
                   tuple((float(t), float(v)) for t, v in item["values"]))
            for target in panel["targets"]
            for item in query_range(prometheus_url, grafana_dashboard.rendered(target["expr"], rate_interval),
                                    start, end, step)]
    return found


def formatted(value: float | None, unit: str) -> str:
    """A value in a panel's unit, as short as Grafana writes it.

    >>> formatted(0.0042, "s"), formatted(95, "s"), formatted(3 * 2**30, "bytes"), formatted(12500, "short")
    ('4.2 ms', '1.58 min', '3 GiB', '12.5 K')
    """
    if value is None or not math.isfinite(value):
        return "No data"
    if unit == "s" and value != 0:
        for limit, scale, name in ((1, 1e-3, "ms"), (60, 1, "s"), (3600, 60, "min"), (math.inf, 3600, "h")):
            if abs(value) < limit or limit == math.inf:
                return f"{value / scale:.3g} {name}"
    if unit == "bytes":
        for power, name in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
            if abs(value) >= 1024 ** power:
                return f"{value / 1024 ** power:.3g} {name}"
        return f"{value:.0f} B"
    for power, name in ((3, "Bil"), (2, "Mil"), (1, "K")):
        if abs(value) >= 1000 ** power:
            return f"{value / 1000 ** power:.3g} {name}"
    return f"{value:.3g}"


def axis(low: float, high: float, unit: str) -> tuple[float, float, float]:
    """Round bounds for a y axis over ``[low, high]`` and its step: 1, 2, 2.5 or 5 times a power of
    ten (times a power of 1024 for bytes), at most five steps across, as Grafana's axes read.

    >>> axis(0, 1.01, "short"), axis(0, 784 * 2**20, "bytes")
    ((0.0, 1.25, 0.25), (0.0, 838860800.0, 209715200.0))
    """
    high = high if high > low else low + 1
    scale = 1024 ** math.floor(math.log(high - low, 1024)) if unit == "bytes" and high - low >= 1024 else 1
    raw = (high - low) / scale / 5
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw) * scale
    return math.floor(low / step) * step, math.ceil(high / step) * step, step


def _threshold_colour(panel: dict, value: float | None) -> str:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps")
    thresholds = [(s.get("value"), s["color"]) for s in steps] if steps else DEFAULT_THRESHOLDS
    colour = thresholds[0][1]
    for limit, step_colour in thresholds[1:]:
        if value is not None and limit is not None and value >= limit:
            colour = step_colour
    return {"green": PALETTE[0], "red": PALETTE[4]}.get(colour, colour)


def _lines(series: list[Series], x0: float, y0: float, width: float, height: float, start: float, end: float,
           low: float, high: float, colour: str | None = None, fill: bool = False) -> str:
    """Each series as SVG polylines (broken where it has no value) in the box at ``(x0, y0)``, in
    the palette's colours unless ``colour``."""
    out = []
    span = (high - low) or 1.0
    for index, line in enumerate(series):
        stroke = colour or PALETTE[index % len(PALETTE)]
        runs, run = [], []
        for t, v in line.points:
            if math.isfinite(v):
                run.append((x0 + (t - start) / ((end - start) or 1) * width, y0 + height - (v - low) / span * height))
            elif run:
                runs.append(run)
                run = []
        runs += [run] if run else []
        for run in runs:
            text = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            if fill:
                out.append(f'<polygon points="{run[0][0]:.1f},{y0 + height:.1f} {text} {run[-1][0]:.1f},'
                           f'{y0 + height:.1f}" fill="{stroke}" fill-opacity="0.15" stroke="none"/>')
            out.append(f'<polyline points="{text}" fill="none" stroke="{stroke}" stroke-width="1.5"/>')
    return "".join(out)


def _timeseries(panel: dict, series: list[Series], width: float, height: float, start: float, end: float) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    values = [v for line in series for _, v in line.points if math.isfinite(v)]
    low, high, step = axis(min(0.0, min(values)) if values else 0.0, max(values) if values else 1.0, unit)
    left, top, plot_w = 62.0, 4.0, width - 74
    # As many legend columns as the longest legend leaves room for (about 6.5 px a character).
    columns = max(1, min(3, int(plot_w // (max((len(line.legend) for line in series), default=1) * 6.5 + 28))))
    plot_h = height - top - 22 - 16 * (math.ceil(len(series) / columns) if series else 1)
    parts = [f'<svg width="{width:.0f}" height="{height:.0f}" xmlns="http://www.w3.org/2000/svg">']
    for i in range(round((high - low) / step) + 1):  # the y axis: a gridline and its value per step
        y = top + plot_h - i * step / (high - low) * plot_h
        parts.append(f'<line x1="{left}" x2="{left + plot_w:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#2c3235"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f'{html.escape(formatted(low + i * step, unit))}</text>')
    for i, anchor in enumerate(("start", "middle", "middle", "middle", "end")):  # the x axis: five times, UTC
        t = start + i / 4 * (end - start)
        x = left + i / 4 * plot_w
        parts.append(f'<text x="{x:.1f}" y="{top + plot_h + 15:.1f}" text-anchor="{anchor}">'
                     f'{datetime.fromtimestamp(t, timezone.utc):%H:%M:%S}</text>')
    if values:
        parts.append(_lines(series, left, top, plot_w, plot_h, start, end, low, high))
    else:
        parts.append(f'<text x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle" class="none">No data</text>')
    for index, line in enumerate(series):
        x = left + (index % columns) * plot_w / columns
        y = top + plot_h + 34 + 16 * (index // columns)
        parts.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="14" height="4" fill="{PALETTE[index % len(PALETTE)]}"/>'
                     f'<text x="{x + 20:.1f}" y="{y:.1f}">{html.escape(line.legend)}</text>')
    return "".join(parts) + "</svg>"


def _stat(panel: dict, series: list[Series], width: float, height: float, start: float, end: float) -> str:
    """One tile per series: its last value in the threshold's colour over its sparkline."""
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    if not series:
        return f'<svg width="{width:.0f}" height="{height:.0f}"><text x="{width / 2:.0f}" y="{height / 2:.0f}" ' \
               'text-anchor="middle" class="none">No data</text></svg>'
    columns = min(len(series), 4)
    rows = math.ceil(len(series) / columns)
    tile_w, tile_h = width / columns, height / rows
    parts = [f'<svg width="{width:.0f}" height="{height:.0f}" xmlns="http://www.w3.org/2000/svg">']
    for index, line in enumerate(series):
        x, y = (index % columns) * tile_w, (index // columns) * tile_h
        colour = _threshold_colour(panel, line.last())
        values = [v for _, v in line.points if math.isfinite(v)]
        if values:
            low, high = min(values), max(values)
            parts.append(_lines([line], x + 4, y + tile_h * 0.55, tile_w - 8, tile_h * 0.4, start, end,
                                low - (1 if high == low else 0), high, colour=colour, fill=True))
        size = min(tile_h * 0.32, tile_w / 5.5)
        parts.append(f'<text x="{x + tile_w / 2:.1f}" y="{y + tile_h * 0.22:.1f}" text-anchor="middle">'
                     f'{html.escape(line.legend)}</text>'
                     f'<text x="{x + tile_w / 2:.1f}" y="{y + tile_h * 0.22 + size + 4:.1f}" text-anchor="middle" '
                     f'style="font-size:{size:.0f}px;font-weight:500;fill:{colour}">'
                     f'{html.escape(formatted(line.last(), unit))}</text>')
    return "".join(parts) + "</svg>"


def page_height(model: dict) -> int:
    return HEADER_PX + max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in model["panels"]) * UNIT_PX + 8


def page(model: dict, series: dict[int, list[Series]], start: float, end: float, source: str) -> str:
    """The dashboard as one HTML page: a header saying what it is, then each row's title and its
    panels where ``gridPos`` puts them."""
    column = WIDTH_PX / COLUMNS
    window = (f"{datetime.fromtimestamp(start, timezone.utc):%Y-%m-%d %H:%M:%S} to "
              f"{datetime.fromtimestamp(end, timezone.utc):%H:%M:%S} UTC")
    body = [f'<div class="head"><b>{html.escape(model["title"])}</b> &mdash; not Grafana: every panel\'s queries '
            f'from {html.escape(source)}, {window}, drawn by infra/render_dashboard.py in headless Chromium'
            f'<br><span>jobs at their defaults: ' + ", ".join(
                f"{v['name']}={html.escape(v.get('query', ''))}" for v in model["templating"]["list"]
                if v["type"] == "textbox") + "</span></div>"]
    for panel in model["panels"]:
        grid = panel["gridPos"]
        x, y = grid["x"] * column + 4, HEADER_PX + grid["y"] * UNIT_PX + 4
        w, h = grid["w"] * column - 8, grid["h"] * UNIT_PX - 8
        if panel["type"] == "row":
            body.append(f'<div class="row" style="left:{x:.0f}px;top:{y:.0f}px;width:{w:.0f}px">'
                        f'{html.escape(panel["title"])}</div>')
            continue
        draw = _stat if panel["type"] == "stat" else _timeseries
        body.append(f'<div class="panel" data-panel-id="{panel["id"]}" style="left:{x:.0f}px;top:{y:.0f}px;'
                    f'width:{w:.0f}px;height:{h:.0f}px"><div class="title">{html.escape(panel["title"])}</div>'
                    f'{draw(panel, series.get(panel["id"], []), w - 2, h - 30, start, end)}</div>')
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(model["title"])}</title><style>
body {{ margin: 0; background: #111217; color: #ccccdc; font: 12px "DejaVu Sans", sans-serif;
       width: {WIDTH_PX}px; height: {page_height(model)}px; position: relative; }}
.head {{ position: absolute; left: 8px; top: 8px; font-size: 14px; line-height: 22px; }}
.head b {{ font-size: 17px; color: #fff; }} .head span {{ color: #8e8e9e; font-size: 12px; }}
.row {{ position: absolute; font-size: 14px; font-weight: bold; color: #fff; }}
.panel {{ position: absolute; background: #181b1f; border: 1px solid #2c3235; border-radius: 2px; }}
.title {{ padding: 6px 8px; height: 16px; font-weight: 500; color: #fff; font-size: 13px; }}
svg text {{ fill: #ccccdc; font-size: 11px; }} svg text.none {{ fill: #8e8e9e; font-size: 14px; }}
</style></head><body>
{"".join(body)}
</body></html>
"""


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        raise RuntimeError("the picture is taken with Debian's chromium: "
                           "apt-get install --no-install-recommends chromium")
    return found


def screenshot(page_html: str, height: int, out: Path) -> None:
    """``page_html`` as headless Chromium draws it in a window ``height`` px high, to the PNG ``out``."""
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "dashboard.html"
        source.write_text(page_html)
        done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               f"--user-data-dir={folder}/profile", f"--window-size={WIDTH_PX},{height}",
                               f"--screenshot={out.resolve()}", source.as_uri()],
                              capture_output=True, text=True, timeout=180)
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")


def render(prometheus_url: str, out: Path, start: float, end: float, model: dict | None = None,
           rate_interval: str = "1m") -> dict[int, list[Series]]:
    """Query, draw and photograph the dashboard (the committed one unless ``model``); returns the series drawn."""
    model = model or json.loads(DASHBOARD.read_text())
    series = panel_series(prometheus_url, model, start, end, rate_interval)
    screenshot(page(model, series, start, end, f"Prometheus {prometheus_url}"), page_height(model), out)
    return series


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.render_dashboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="the Prometheus to query, e.g. http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=15, help="the time range, ending now")
    parser.add_argument("--rate-interval", default="1m", help="what $__rate_interval stands for")
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    args = parser.parse_args(argv)
    end = time.time()
    render(args.prometheus.rstrip("/"), args.out, end - args.minutes * 60, end, rate_interval=args.rate_interval)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
