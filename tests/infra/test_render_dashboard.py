"""docs/OPERATIONS.md's picture of the dashboard (infra/render_dashboard.py): the page it draws has
the committed dashboard's rows and panels, each panel the series it was given. The queries
against a real Prometheus, and the picture itself, are in tests/infra/test_prometheus_server.py."""

from __future__ import annotations

import doctest
import json
import math
from html.parser import HTMLParser

from infra import render_dashboard
from infra.render_dashboard import Series

MODEL = json.loads(render_dashboard.DASHBOARD.read_text())
START, END = 1_700_000_000.0, 1_700_000_600.0


class Panels(HTMLParser):
    """The page's row titles, and per panel its title, polylines and texts."""

    def __init__(self):
        super().__init__()
        self.rows, self.panels, self._in = [], {}, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div" and attrs.get("class") in ("row", "panel", "title"):
            self._in = attrs["class"]
            if attrs["class"] == "panel":
                self.current = self.panels.setdefault(int(attrs["data-panel-id"]),
                                                      {"title": "", "lines": 0, "texts": []})
        elif tag == "polyline":
            self.current["lines"] += 1
        elif tag == "text":
            self._in = "text"

    def handle_data(self, data):
        if self._in == "row":
            self.rows.append(data)
        elif self._in == "title":
            self.current["title"] += data
        elif self._in == "text":
            self.current["texts"].append(data)
        self._in = None if self._in in ("row", "title", "text") else self._in


def test_the_page_has_each_row_and_one_panel_per_panel_of_the_committed_dashboard():
    steps = [START + 60 * i for i in range(11)]
    given = {}
    for panel in MODEL["panels"]:
        if panel["type"] != "row":
            # One series per query; the first has a gap, as a histogram quantile with no batch does.
            given[panel["id"]] = [Series(f"{panel['title']} {n}", tuple((t, math.nan if n == 0 and i == 5 else 2.0 ** n)
                                                                        for i, t in enumerate(steps)))
                                  for n, _ in enumerate(panel["targets"])]
    parsed = Panels()
    parsed.feed(render_dashboard.page(MODEL, given, START, END, "a test"))
    assert parsed.rows == [p["title"] for p in MODEL["panels"] if p["type"] == "row"]
    assert {i: p["title"] for i, p in parsed.panels.items()} == \
        {p["id"]: p["title"] for p in MODEL["panels"] if p["type"] != "row"}
    for panel in (p for p in MODEL["panels"] if p["type"] != "row"):
        drawn, queries = parsed.panels[panel["id"]], len(panel["targets"])
        # The gap breaks the first series' line in two; a stat draws each series' last value.
        assert drawn["lines"] == queries + 1
        legends = [f"{panel['title']} {n}" for n in range(queries)]
        assert all(legend in drawn["texts"] for legend in legends)
        if panel["type"] == "stat":
            values = [t for t in drawn["texts"] if t not in legends]
            assert values == ["1"] + [f"{2.0 ** n:g}" for n in range(1, queries)]


def test_a_panel_without_series_says_no_data_and_the_legend_fills_labels_as_grafana_does():
    parsed = Panels()
    parsed.feed(render_dashboard.page(MODEL, {}, START, END, "a test"))
    assert all(p["lines"] == 0 and "No data" in p["texts"] for p in parsed.panels.values())
    assert render_dashboard.legend("{{family}} {{severity}}", {"family": "skew", "severity": "warning"}) == \
        "skew warning"
    assert doctest.testmod(render_dashboard).failed == 0
