"""``sentinel feedback``: on-call says an incident was wrong (or right); training learns from it.

A verdict is one record on the feedback topic (key: the incident id; contract
``schemas/feedback.v1.json``), carrying the incident's identity and times copied from its latest
event on the incident topic. ``sentinel train --feedback`` reads the latest verdict per incident
and the live feature log's rows of those incidents (:func:`load_fleet_feedback`); what becomes of
them is :mod:`models.feedback`'s business.
"""

from __future__ import annotations

import getpass
import json
import logging
import time

from pipelines.config import SentinelConfig
from pipelines.contracts import FEEDBACK, SCHEMA_VERSION
from pipelines.io import kafka_clients
from pipelines.reports.incident_page import UnknownIncident

log = logging.getLogger(__name__)


def verdict_record(history: list[dict], verdict: str, note: str | None, given_by: str, given_at_ms: int) -> dict:
    """The feedback record for an incident whose events are ``history`` (in order)."""
    last = history[-1]
    record = {"schema_version": SCHEMA_VERSION, "incident_id": last["incident_id"], "verdict": verdict, "note": note,
              "given_at": given_at_ms, "given_by": given_by, "family": last["family"], "cluster": last["cluster"],
              "job_id": last["job_id"], "job_name": last.get("job_name") or "", "vertex_id": last.get("vertex_id"),
              "opened_at": last["opened_at"], "last_seen_at": last.get("resolved_at") or last["updated_at"]}
    errors = FEEDBACK.errors(record)
    if errors:
        raise ValueError(f"the feedback record breaks its contract: {'; '.join(errors)}")
    return record


def _read_json(config: SentinelConfig, topic: str, keep=None, timeout_s: float = 300.0) -> list[dict]:
    return kafka_clients.read_json_values(config.kafka.bootstrap_servers, config.kafka.client_kwargs(), topic,
                                          timeout_s, keep)


def give(config: SentinelConfig, incident_id: str, verdict: str, note: str | None = None,
         given_by: str | None = None) -> dict:
    """Publish a verdict on ``incident_id`` (looked up on the incident topic); returns the record."""
    kafka = config.kafka
    kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)
    key = incident_id.encode()
    history = _read_json(config, config.topics.incidents, keep=lambda r: r.key == key)
    if not history:
        raise UnknownIncident(f"no incident {incident_id} on {config.topics.incidents} "
                              "(`sentinel incidents --from-beginning --output json` lists the ids)")
    who = given_by or getpass.getuser()
    record = verdict_record(history, verdict, note, who, int(time.time() * 1000))
    kafka_clients.ensure_topics(kafka.bootstrap_servers, kafka.client_kwargs(), [config.topics.feedback],
                                kafka.topic_partitions)
    producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
    try:
        producer.send(config.topics.feedback, key=key, value=json.dumps(record, separators=(",", ":")).encode()) \
            .get(timeout=30)
    finally:
        producer.close()
    return record


def read_verdicts(config: SentinelConfig) -> list[dict]:
    """Every valid verdict on the feedback topic, the latest per incident (an invalid record is
    logged and skipped: it cannot be a label)."""
    from models.feedback import latest_verdicts

    kafka = config.kafka
    kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)
    kafka_clients.ensure_topics(kafka.bootstrap_servers, kafka.client_kwargs(), [config.topics.feedback],
                                kafka.topic_partitions)
    valid = []
    for record in _read_json(config, config.topics.feedback):
        errors = FEEDBACK.errors(record)
        if errors:
            log.warning("feedback record skipped, it breaks the contract: %s", "; ".join(errors))
        else:
            valid.append(record)
    return latest_verdicts(valid)


def load_fleet_feedback(spark, config: SentinelConfig):
    """The latest verdicts and the live feature log's rows of their jobs and windows."""
    import pandas as pd
    from pyspark.sql import functions as F

    from feature_store import offline_store
    from models.feedback import FleetFeedback, window

    verdicts = read_verdicts(config)
    log_root = config.offline_store / "live"
    if not verdicts or not log_root.is_dir():
        return FleetFeedback(verdicts, pd.DataFrame())
    spans = [window(v) for v in verdicts]
    jobs = sorted({v["job_id"] for v in verdicts})
    rows = (offline_store.read_features(spark, log_root, min(s for s, _ in spans), max(e for _, e in spans) + 1)
            .filter(F.col("job_id").isin(jobs)).drop("date").toPandas())
    return FleetFeedback(verdicts, rows)
