"""What ``sentinel alert`` reports on ``/metrics``: alerts delivered, rejected (by reason) and
retried, when it was last in step with an Alertmanager, and the incidents open now.
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pipelines import telemetry
from pipelines.alerting.checks import REJECT_REASONS
from pipelines.contracts import SEVERITIES
from pipelines.families import FAMILIES


class _OpenIncidents(Collector):
    """``checkpoint_sentinel_open_incidents{family, severity}``, counted from the relay's book when
    read. The relay rebuilds the book from the incident topic on start, so the count survives its
    restarts (the detection job's open incidents live in its executors' state, not its driver)."""

    def __init__(self, incidents: Callable[[], Iterable[dict]]):
        self.incidents = incidents

    def describe(self):
        return [GaugeMetricFamily(f"{telemetry.PREFIX}_open_incidents", "")]

    def collect(self):
        # Every family and severity from the start: a panel or rule sees 0, not no data.
        counts = {(family, severity): 0 for family in FAMILIES for severity in SEVERITIES}
        for incident in list(self.incidents()):
            key = (incident.get("family"), incident.get("severity"))
            counts[key] = counts.get(key, 0) + 1
        gauge = GaugeMetricFamily(f"{telemetry.PREFIX}_open_incidents", "Incidents open now, by family and "
                                  "severity, as the incident topic says", labels=["family", "severity"])
        for (family, severity), count in sorted(counts.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            gauge.add_metric([str(family), str(severity)], count)
        return [gauge]


class RelayMetrics:
    """What ``sentinel alert`` reports on ``/metrics`` (scrape job ``checkpoint-sentinel-alert``);
    ``open_incidents`` gives the incidents open now (the relay's book)."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 open_incidents: Callable[[], Iterable[dict]] = lambda: ()):
        self.registry = registry or telemetry.part_registry("alert")
        r, prefix = self.registry, f"{telemetry.PREFIX}_alert_relay"
        self.delivered = Counter(f"{prefix}_delivered", "Alerts an Alertmanager accepted", registry=r)
        self.rejected = Counter(f"{prefix}_rejected", "Incident events that did not become an alert: unreadable, "
                                "invalid with no single right fix, or refused by Alertmanager", ["reason"], registry=r)
        self.retries = Counter(f"{prefix}_retries", "Posts retried because no Alertmanager answered (connection "
                               "error, timeout, 5xx)", registry=r)
        self.last_success = Gauge(f"{prefix}_last_success_timestamp_seconds",
                                  "When the relay last was in step with an Alertmanager: a batch taken (or its "
                                  "poison rejected), or, with nothing to send, a readiness check answered",
                                  registry=r)
        for reason in REJECT_REASONS:  # present from the start, so a rule's increase() sees the first one
            self.rejected.labels(reason)
        self.registry.register(_OpenIncidents(open_incidents))
