"""The Grafana dashboard as code (infra/grafana_dashboard.py): the committed JSON is the generator's
output, and its queries read metrics the sentinel's parts export. Its queries are run against a
real Prometheus scraping a running sentinel in tests/infra/test_prometheus_server.py."""

from __future__ import annotations

import json
import re

from infra import alert_rules, grafana_dashboard
from pipelines.alerting import RelayMetrics
from pipelines.telemetry import CollectorMetrics, DetectionMetrics
from tests.conftest import PROJECT_ROOT

COMMITTED = PROJECT_ROOT / "infra" / "grafana" / "checkpoint-sentinel.json"


def test_the_committed_dashboard_is_the_generator_s_output():
    # Regenerate with `python -m infra.grafana_dashboard > infra/grafana/checkpoint-sentinel.json`.
    assert json.loads(COMMITTED.read_text()) == grafana_dashboard.dashboard()


def test_its_job_variables_default_to_the_rules_job_names_and_every_panel_says_what_it_shows():
    model = json.loads(COMMITTED.read_text())
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert {part: variables[f"{part}_job"]["query"] for part in alert_rules.DEFAULT_JOBS} == alert_rules.DEFAULT_JOBS
    assert variables["datasource"]["query"] == "prometheus"
    panels = [p for p in model["panels"] if p["type"] != "row"]
    assert all(p["description"] and p["targets"] for p in panels)
    assert all(t["datasource"]["uid"] == "${datasource}" for p in panels for t in p["targets"])
    assert len({p["id"] for p in model["panels"]}) == len(model["panels"])
    exprs = [expr for _, expr in grafana_dashboard.queries(model)]
    assert all('job="$' in expr or 'job=~"$' in expr for expr in exprs)  # no literal job name


def test_its_queries_read_metrics_the_sentinel_s_parts_export():
    exported = set()
    for metrics in (DetectionMetrics(), CollectorMetrics(), RelayMetrics()):
        for family in metrics.registry.collect():
            # A labelled family has no samples before its first child: its names by its type.
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
            exported |= {sample.name for sample in family.samples} | {family.name + s for s in suffixes}
    exported |= {"up"}
    named = {name for _, expr in grafana_dashboard.queries(json.loads(COMMITTED.read_text()))
             for name in re.findall(r"\b((?:checkpoint_sentinel|process)_\w+|up)\{", expr)}
    missing = named - exported - {"checkpoint_sentinel_jvm_process_resident_memory_bytes"}  # only with a JVM
    assert missing == set()
