"""`sentinel incidents`: the incident topic read back as a table, from the real broker."""

from __future__ import annotations

import json

from models.post_rule import PostRule
from pipelines.incidents import policy
from pipelines.reports.incident_view import follow, format_incident
from tests.helpers.cli import run_sentinel
from tests.helpers.incidents import rows_and_scores
from tests.helpers.topics import publish_incidents


def test_following_the_topic_from_the_beginning_shows_each_incident_event(config):
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9), (20, 0.1), (21, 0.1), (35, 0.1)], family="skew", hot_subtask=2.0,
                                   records_in_max_over_mean=4.0)
    events = policy.step({}, rows, scores, {"skew": PostRule(0.5, 2, 3)}, policy.PolicySettings())
    assert [e["event"] for e in events] == ["opened", "resolved"]
    publish_incidents(config.kafka, config.topics.incidents, events)

    seen = list(follow(config, from_beginning=True, timeout_s=10, max_events=2))
    assert [e["incident_id"] for e in seen] == [events[0]["incident_id"]] * 2
    lines = [format_incident(e) for e in seen]
    assert lines[0].startswith("1970-01-01 00:01:00  OPEN") and "orders / Window #2" in lines[0]
    assert "subtask 2 carries 4.0x the mean load" in lines[0]
    assert "RESOLVED" in lines[1] and "has cleared" in lines[1]
    # From the end of the topic (the default) nothing old is shown.
    assert list(follow(config, timeout_s=2)) == []


def test_the_command_prints_json_lines_for_scripts_with_config_and_verbose_after_it(config, tmp_path):
    rows, scores = rows_and_scores([(0, 0.9), (1, 0.9)], family="skew", hot_subtask=1.0, records_in_max_over_mean=3.0)
    (opened,) = policy.step({}, rows, scores, {"skew": PostRule(0.5, 2, 3)}, policy.PolicySettings())
    publish_incidents(config.kafka, config.topics.incidents, [opened])
    settings = tmp_path / "sentinel.yaml"
    settings.write_text(f"kafka: {{bootstrap_servers: '{config.kafka.bootstrap_servers}'}}\n"
                        f"topics: {{incidents: {config.topics.incidents}}}\nstate_dir: {tmp_path / 'state'}\n")
    result = run_sentinel("incidents", "--from-beginning", "--max", "1", "--timeout", "20", "--output", "json",
                          "--config", str(settings), "-v", env={})
    assert result.returncode == 0, result.stderr[-2000:]
    assert [json.loads(line) for line in result.stdout.splitlines()] == [opened]
    version = run_sentinel("--version", env={})
    assert version.returncode == 0 and version.stdout.startswith("sentinel (checkpoint-sentinel) ")


def test_a_line_says_the_soonest_forecast_s_eta_and_its_limit():
    forecast = {"metric": "checkpoint_duration_ms", "limit": 1000, "limit_source": "job", "eta_ms": 240_000,
                "eta_low_ms": 180_000, "eta_high_ms": None}
    incident = {"updated_at": 0, "event": "updated", "severity": "warning", "family": "state_leak", "job_id": "j",
                "job_name": "orders", "vertex_name": "keyed", "summary": "[warning] state leak", "forecast": forecast,
                "forecasts": [forecast]}
    assert format_incident(incident).endswith("(ETA ~4 min (or later: from 3 min) to the 1s checkpoint timeout)")
    assert "ETA" not in format_incident({**incident, "event": "resolved"})
