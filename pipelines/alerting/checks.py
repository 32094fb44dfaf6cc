"""What Alertmanager's v2 API takes of an alert (:func:`check_alert`: what has one right fix is
fixed, what has none is rejected), and the reasons an incident event does not become an alert,
as ``..._alert_relay_rejected_total{reason}`` counts them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")  # Prometheus's, which Alertmanager enforces
MAX_LABEL_VALUE_CHARS = 1024  # identity and routing, not content: a Flink SQL operator name can be far longer
MAX_ANNOTATION_CHARS = 16384

UNREADABLE = "unreadable_incident"  # not an incident event the relay can turn into an alert
INVALID_LABEL_NAME = "invalid_label_name"
INVALID_ANNOTATION_NAME = "invalid_annotation_name"
INVALID_TIME = "invalid_time"
REFUSED = "refused_by_alertmanager"
REJECT_REASONS = (UNREADABLE, INVALID_LABEL_NAME, INVALID_ANNOTATION_NAME, INVALID_TIME, REFUSED)


@dataclass(frozen=True)
class CheckedAlert:
    """An alert as it will be sent (``None`` when rejected), what was fixed in it, and why it was
    rejected."""

    alert: dict | None
    fixes: tuple[str, ...] = ()
    reason: str | None = None
    detail: str = ""


def _valid_utf8(value: str) -> str:
    """``value`` with lone surrogates (what JSON's ``\\ud800`` escapes decode to) replaced by U+FFFD,
    as Alertmanager's JSON decoder would."""
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)


def _shortened(value: str, limit: int) -> str:
    """At most ``limit`` characters, the whole value's hash at the end so two long values stay apart."""
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return value[:limit - len(digest) - 1] + "\u2026" + digest


def _sane(value: str, limit: int, what: str, fixes: list[str]) -> str:
    fixed = _valid_utf8(value)
    if fixed != value:
        fixes.append(f"{what} was not valid UTF-8 (replaced with U+FFFD)")
    if len(fixed) > limit:
        fixes.append(f"{what} had {len(fixed)} characters (shortened to {limit})")
        fixed = _shortened(fixed, limit)
    return fixed


def _parse_time(text) -> datetime:
    return datetime.fromisoformat(str(text).replace("Z", "+00:00"))


def check_alert(alert: dict) -> CheckedAlert:
    """The alert Alertmanager's v2 API will take, or why there is none: label and annotation names
    as Prometheus's, values valid UTF-8 of sane length, annotations strings, and ``startsAt <=
    endsAt`` (an end before the start, as a resolve stamped before the open, ends at the start)."""
    fixes: list[str] = []
    bad = sorted(str(name) for name in alert.get("labels", {}) if not LABEL_NAME.match(str(name)))
    if bad:
        return CheckedAlert(None, (), INVALID_LABEL_NAME, f"label names {bad!r} are not [a-zA-Z_][a-zA-Z0-9_]*")
    if not alert.get("labels"):
        return CheckedAlert(None, (), INVALID_LABEL_NAME, "no labels")
    bad = sorted(str(name) for name in alert.get("annotations", {}) if not LABEL_NAME.match(str(name)))
    if bad:
        return CheckedAlert(None, (), INVALID_ANNOTATION_NAME,
                            f"annotation names {bad!r} are not [a-zA-Z_][a-zA-Z0-9_]*")
    labels = {name: _sane(str(value), MAX_LABEL_VALUE_CHARS, f"label {name}", fixes)
              for name, value in alert["labels"].items()}
    annotations = {}
    for name, value in alert.get("annotations", {}).items():
        if value is None:
            continue
        if not isinstance(value, str):
            fixes.append(f"annotation {name} was not a string (sent as JSON)")
            value = json.dumps(value, sort_keys=True, default=str)
        annotations[name] = _sane(value, MAX_ANNOTATION_CHARS, f"annotation {name}", fixes)
    try:
        starts, ends = _parse_time(alert["startsAt"]), _parse_time(alert["endsAt"])
    except (KeyError, ValueError) as exc:
        return CheckedAlert(None, (), INVALID_TIME, f"startsAt/endsAt unreadable ({exc})")
    fixed = {**alert, "labels": labels, "annotations": annotations}
    if ends < starts:
        fixes.append(f"endsAt {alert['endsAt']} was before startsAt {alert['startsAt']} (ends at startsAt)")
        fixed["endsAt"] = alert["startsAt"]
    return CheckedAlert(fixed, tuple(fixes))


def incident_of(alert: dict) -> str:
    """The incident id an alert carries (``?``: none)."""
    return str(alert.get("annotations", {}).get("incident_id", "?"))
