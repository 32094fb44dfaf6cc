"""Clock skew between a JobManager and the collector: checkpoint events carry the JobManager's
clock, samples the collector's. Lateness is judged per clock, so skew of either sign, up to the
watermark's delay (features.max_source_delay_s), drops no event and finds the same incidents (a
few seconds earlier or later: rows of the two clocks interleave as the skew has them).

Before, an event more than features.lateness_s (10 s) behind its job's latest event of any kind was
dropped: real Flink runs with the JobManager's clock 12 s behind lost 43 % of their checkpoints,
15 s behind 98 %.
"""

from __future__ import annotations

import gzip

import orjson
import pytest

from pipelines.datasets import events_path, subset
from pipelines.detection.champions import ChampionCache
from pipelines.detection.flink_job import replay
from tests.conftest import LAB_BACKPRESSURE_RUN, LAB_CORPUS, LAB_LEAK_RUN, LAB_SKEW_RUN
from tests.helpers.detection_job import write_jsonl


@pytest.fixture(scope="module")
def lab_events(tmp_path_factory) -> list[dict]:
    dataset = subset(LAB_CORPUS, [LAB_LEAK_RUN, LAB_SKEW_RUN, LAB_BACKPRESSURE_RUN],
                     tmp_path_factory.mktemp("skew") / "lab")
    return [orjson.loads(line) for split in ("validation", "test") if (path := events_path(dataset, split))
            for line in gzip.open(path)]


def _jobmanager_clock(events: list[dict], skew_ms: int) -> list[dict]:
    """The events as a collector would publish them if the JobManager's clock were ``skew_ms`` off."""
    shifted = []
    for event in events:
        if event["kind"] == "checkpoint":
            event = {**event, "ts": event["ts"] + skew_ms, "trigger_ts": event["trigger_ts"] + skew_ms}
        shifted.append(event)
    return shifted


def _opened(result) -> list[tuple]:
    return sorted((i["job_id"], i["family"], i["vertex_id"]) for i in result.incidents if i["event"] == "opened")


@pytest.mark.parametrize("skew_s", [-120, -15, -2, 2, 15, 120])
def test_skew_between_the_jobmanager_and_the_collector_drops_nothing(trained_store, lab_events, tmp_path, skew_s):
    models = ChampionCache(trained_store).require()
    straight = replay(trained_store, [write_jsonl(tmp_path / "straight.jsonl", lab_events)], models)
    skewed = replay(trained_store, [write_jsonl(tmp_path / "skewed.jsonl",
                                                _jobmanager_clock(lab_events, skew_s * 1000))], models)
    assert straight.late == {} and skewed.late == {}
    assert len(skewed.rows) == len(straight.rows)
    # The same incidents; with the JobManager far behind, a symptom (a failed checkpoint, stamped
    # by its clock) may come before its cause and open, to be resolved into the cause's incident
    # when that opens, as the policy does with any symptom seen first.
    extra = set(_opened(skewed)) - set(_opened(straight))
    assert set(_opened(straight)) <= set(_opened(skewed))
    explained = {(i["job_id"], i["family"], i["vertex_id"]) for i in skewed.incidents
                 if i["event"] == "resolved" and i["evidence"].get("explained_by")}
    assert extra <= explained and (not extra or abs(skew_s) > 15), extra
    # Each incident opens when it did without the skew, give or take the skew and a poll.
    opened = {(i["job_id"], i["family"], i["vertex_id"]): i["opened_at"] for i in straight.incidents
              if i["event"] == "opened"}
    for incident in skewed.incidents:
        key = (incident["job_id"], incident["family"], incident["vertex_id"])
        if incident["event"] == "opened" and key not in extra:
            when = opened[key]
            assert abs(incident["opened_at"] - when) <= abs(skew_s) * 1000 + 10_000
