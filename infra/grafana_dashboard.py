"""The sentinel's Grafana dashboard as code: its own health, and the incidents it publishes.

Generated with grafana-foundation-sdk, Grafana's own typed builders (generated from the same
schemas Grafana validates dashboards with, so a panel option that does not exist does not
build); grafanalib, the other choice, is a community project whose panel types trail Grafana's.
The JSON is committed (``infra/grafana/checkpoint-sentinel.json``, to import as it is) and
regenerated with::

    python -m infra.grafana_dashboard > infra/grafana/checkpoint-sentinel.json

The scrape job names are dashboard variables (text boxes) defaulting to the alert rules' job
names (:data:`infra.alert_rules.DEFAULT_JOBS`); the data source is a variable too. Per-job
features are not on it: the sentinel does not export them as metrics (one series per Flink job
and vertex would be the fleet's cardinality); they are on each incident's page.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common, prometheus, stat, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, Row, TextBoxVariable
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from infra.alert_rules import DEFAULT_JOBS

UID = "checkpoint-sentinel"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Grafana's own variable: the rate window that fits the data source's scrape interval.
RATE = "$__rate_interval"
DETECTION, COLLECTOR, ALERT = '{job="$detection_job"}', '{job="$collector_job"}', '{job="$alert_job"}'
PARTS = '{job=~"$detection_job|$collector_job|$alert_job"}'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    """One panel: its title, what it says, its queries, its unit, and whether it is a stat."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 8


HEALTH = (
    PanelSpec("Parts up", "Prometheus's `up` for each part: 0 is a part down (SentinelDetectionDown, "
              "SentinelCollectorDown, SentinelAlertRelayDown).",
              (Query(f"up{PARTS}", "{{job}}"),), kind="stat"),
    PanelSpec("Input lag", "How far the newest event the detection query processed is behind now "
              "(SentinelFallingBehind over 5 min); the watermark trails it by features.max_source_delay_s by design.",
              (Query(f"checkpoint_sentinel_event_lag_seconds{DETECTION}", "event lag"),
               Query(f"checkpoint_sentinel_watermark_lag_seconds{DETECTION}", "watermark lag")), unit="s"),
    PanelSpec("Micro-batch duration", "Quantiles of the detection query's batches.",
              (Query("histogram_quantile(0.5, sum by (le) (rate(checkpoint_sentinel_batch_duration_seconds_bucket"
                     f"{DETECTION}[{RATE}])))", "p50"),
               Query("histogram_quantile(0.99, sum by (le) (rate(checkpoint_sentinel_batch_duration_seconds_bucket"
                     f"{DETECTION}[{RATE}])))", "p99")), unit="s"),
    PanelSpec("Input rows", "Rows the detection query reads per second, and the rows in its state store "
              "(every Flink job's features and incident policy).",
              (Query(f"sum(rate(checkpoint_sentinel_input_rows_total{DETECTION}[{RATE}]))", "read/s"),
               Query(f"sum(checkpoint_sentinel_state_rows{DETECTION})", "state rows")), unit="short"),
    PanelSpec("Dead letters", "Input records sent to the dead-letter topic, by reason, and those waiting for it "
              "(SentinelDeadLetters, SentinelDeadLetterTopicFailing).",
              (Query(f"sum by (reason) (increase(checkpoint_sentinel_dead_letters_total{DETECTION}[{RATE}]))",
                     "{{reason}}"),
               Query(f"checkpoint_sentinel_dead_letters_pending{DETECTION}", "waiting")), unit="short"),
    PanelSpec("Scoring", "1 while a family's champion scores, 0 while the family is blind (SentinelFamilyBlind); "
              "the model registry and the broker reachable.",
              (Query(f"checkpoint_sentinel_model_scoring{DETECTION}", "{{family}}"),
               Query(f"checkpoint_sentinel_model_registry_reachable{DETECTION}", "registry"),
               Query(f"checkpoint_sentinel_broker_reachable{DETECTION}", "broker")), kind="stat"),
    PanelSpec("Collector cycle", "The 99th percentile of a poll of each Flink cluster, and whether it answered "
              "(SentinelFlinkClusterUnreachable, SentinelCollectorStalled).",
              (Query("histogram_quantile(0.99, sum by (le, cluster) (rate("
                     f"checkpoint_sentinel_collector_poll_duration_seconds_bucket{COLLECTOR}[{RATE}])))",
                     "p99 {{cluster}}"),
               Query(f"checkpoint_sentinel_collector_cluster_reachable{COLLECTOR}", "reachable {{cluster}}")),
              unit="s"),
    PanelSpec("Relay deliveries", "Alerts Alertmanager accepted, incident events rejected by reason, retries "
              "(SentinelAlertsRejected, SentinelAlertRelayRetrying).",
              (Query(f"sum(increase(checkpoint_sentinel_alert_relay_delivered_total{ALERT}[{RATE}]))", "delivered"),
               Query(f"sum by (reason) (increase(checkpoint_sentinel_alert_relay_rejected_total{ALERT}[{RATE}]))",
                     "rejected {{reason}}"),
               Query(f"sum(increase(checkpoint_sentinel_alert_relay_retries_total{ALERT}[{RATE}]))", "retries")),
              unit="short"),
    PanelSpec("Memory", "Resident memory of each part's process, and of the detection job's Spark driver JVM.",
              (Query(f"process_resident_memory_bytes{PARTS}", "{{job}}"),
               Query(f"checkpoint_sentinel_jvm_process_resident_memory_bytes{DETECTION}", "detection JVM")),
              unit="bytes"),
)
INCIDENTS = (
    PanelSpec("Open incidents", "Incidents open now by family and severity (the relay's book, rebuilt from the "
              "incident topic).",
              (Query(f"sum by (family, severity) (checkpoint_sentinel_open_incidents{ALERT})",
                     "{{family}} {{severity}}"),), kind="stat", width=12),
    PanelSpec("Incidents opened and resolved", "Incident events the detection job published, by family.",
              (Query("sum by (family, event) (increase(checkpoint_sentinel_incident_events_total"
                     f'{{job="$detection_job", event=~"opened|resolved"}}[{RATE}]))', "{{family}} {{event}}"),),
              width=12),
)
ROWS = (("The sentinel's health", HEALTH), ("Incidents", INCIDENTS))


def _panel(spec: PanelSpec, panel_id: int):
    if spec.kind == "stat":
        panel = stat.Panel().reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    else:
        panel = timeseries.Panel().legend(common.VizLegendOptions().show_legend(True).display_mode("list")
                                          .placement("bottom"))
    panel = panel.id(panel_id).title(spec.title).description(spec.description).datasource(DATASOURCE) \
        .unit(spec.unit).height(8).span(spec.width)
    for ref, query in zip("ABCDEFGH", spec.queries):
        panel = panel.with_target(prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref)
                                  .datasource(DATASOURCE))
    return panel


def dashboard() -> dict:
    """The dashboard's JSON model (what Grafana imports)."""
    built = (Dashboard("checkpoint-sentinel").uid(UID).tags(["checkpoint-sentinel", "flink"]).refresh("30s")
             .time("now-3h", "now").timezone("browser").editable()
             .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
             .with_variable(TextBoxVariable("detection_job").label("detection job").default_value(DEFAULT_JOBS["detection"]))
             .with_variable(TextBoxVariable("collector_job").label("collector job").default_value(DEFAULT_JOBS["collector"]))
             .with_variable(TextBoxVariable("alert_job").label("relay job").default_value(DEFAULT_JOBS["alert"])))
    panel_id = 0
    for title, specs in ROWS:
        panel_id += 1
        built = built.with_row(Row(title).id(panel_id))
        for spec in specs:
            panel_id += 1
            built = built.with_panel(_panel(spec, panel_id))
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(built.build()))


def queries(model: dict) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query of a dashboard's JSON model."""
    return [(panel["title"], target["expr"]) for panel in model["panels"] for target in panel.get("targets", [])]


def rendered(expr: str, rate_interval: str = "1m", jobs: dict[str, str] | None = None) -> str:
    """``expr`` as Grafana sends it to Prometheus: its variables replaced (the jobs by their defaults)."""
    names = {**DEFAULT_JOBS, **(jobs or {})}
    return (expr.replace("$__rate_interval", rate_interval).replace("$detection_job", names["detection"])
            .replace("$collector_job", names["collector"]).replace("$alert_job", names["alert"]))


if __name__ == "__main__":
    sys.stdout.write(json.dumps(dashboard(), indent=2, sort_keys=True) + "\n")
