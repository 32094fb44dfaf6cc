"""`sentinel alert`, the Alertmanager relay (layer 6, a runtime: it may import the layers below).

:mod:`~pipelines.alerting.relay` consumes the incident topic and keeps Alertmanager in step with
it (how, and why, in its docstring); :mod:`~pipelines.alerting.alerts` makes an incident event's
alerts, :mod:`~pipelines.alerting.checks` says what Alertmanager takes,
:mod:`~pipelines.alerting.alertmanager` is its v2 API and :mod:`~pipelines.alerting.metrics` the
relay's ``/metrics``.
"""

from pipelines.alerting.alertmanager import REFUSED_STATUSES, AlertmanagerUnavailable, Alertmanagers, AlertsRefused
from pipelines.alerting.alerts import NOT_IDENTITY, AlertBook, alert_labels, last_of_each_alert, to_alert
from pipelines.alerting.checks import (INVALID_ANNOTATION_NAME, INVALID_LABEL_NAME, INVALID_TIME, LABEL_NAME,
                                       MAX_ANNOTATION_CHARS, MAX_LABEL_VALUE_CHARS, REFUSED, REJECT_REASONS,
                                       UNREADABLE, CheckedAlert, check_alert, incident_of)
from pipelines.alerting.metrics import RelayMetrics
from pipelines.alerting.relay import AlertRelay, RelayStats

__all__ = ["INVALID_ANNOTATION_NAME", "INVALID_LABEL_NAME", "INVALID_TIME", "LABEL_NAME", "MAX_ANNOTATION_CHARS",
           "MAX_LABEL_VALUE_CHARS", "NOT_IDENTITY", "REFUSED", "REFUSED_STATUSES", "REJECT_REASONS", "UNREADABLE",
           "AlertBook", "AlertRelay", "AlertmanagerUnavailable", "Alertmanagers", "AlertsRefused", "CheckedAlert",
           "RelayMetrics", "RelayStats", "alert_labels", "check_alert", "incident_of", "last_of_each_alert",
           "to_alert"]
