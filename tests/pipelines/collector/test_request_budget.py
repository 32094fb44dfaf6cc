"""The collector's request budget against the same recorded Flink answers as the collector before
it: the features the detection job computes from the events are the same, for fewer requests."""

import gzip
import json
import math

import pytest

from feature_store.job_features import features_for_events
from pipelines.collector import ClusterCollector
from tests.pipelines.collector.flink_replay import RecordedFlink, recorded_polls
from tests.pipelines.collector.parity import (CLOCKS, GOLDEN, RECORDINGS, clock_at, endpoint, events_per_poll,
                                              settings)


def new_collector(url, publish, clock):
    return ClusterCollector(endpoint(url), settings(), publish, clock=clock)


def same(a, b) -> bool:
    """Feature rows equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def golden() -> dict:
    with gzip.open(GOLDEN, "rt") as recorded:
        return json.load(recorded)


@pytest.mark.parametrize("recording", RECORDINGS)
@pytest.mark.parametrize("clock", CLOCKS)
def test_the_features_of_the_new_clients_events_equal_the_old_clients(golden, recording, clock):
    old = golden[f"{recording}/{clock}"]
    new = events_per_poll(new_collector, recording, CLOCKS[clock])
    old_features = features_for_events([e for poll in old for e in poll])
    new_features = features_for_events([e for poll in new for e in poll])
    assert len(new_features) == len(old_features) > 0
    assert same(new_features, old_features)
    # Stronger than the features: the very same events, poll by poll.
    def as_text(polls):
        return [sorted(json.dumps(e, sort_keys=True) for e in poll) for poll in polls]

    assert as_text(new) == as_text(old)


def test_a_settled_job_costs_fewer_requests_per_poll():
    """The recorded job long settled: after the first poll, ``/jobs/:id`` and ``numRestarts`` are
    not asked again, nor ``/checkpoints/details/:cid`` ever (each vertex's subtask answer has the
    vertex's totals)."""
    polls = recorded_polls("skew")
    now = [clock_at(polls, 0, 120.0)]
    with RecordedFlink(polls) as flink:
        collector = ClusterCollector(endpoint(flink.url), settings(), lambda events: None, clock=lambda: now[0])
        asked = []
        for poll in range(2):
            flink.poll, now[0] = poll, clock_at(polls, poll, 120.0)
            before = len(flink.requests)
            collector.poll()
            asked.append(flink.requests[before:])
    job_id = polls[0]["/jobs/overview"]["jobs"][0]["jid"]
    assert not any("/checkpoints/details/" in path and "/subtasks/" not in path for poll in asked for path in poll)
    assert f"/jobs/{job_id}" in asked[0] and f"/jobs/{job_id}" not in asked[1]
    assert not any(path.startswith(f"/jobs/{job_id}/metrics") for path in asked[1])
    # Recorded by the old client at that poll: overview, heap, /jobs/:id, checkpoints, numRestarts,
    # 8 vertices' metrics, and per new checkpoint its details and 8 vertices' subtasks.
    fresh = sum(1 for path in polls[1] if path.count("/subtasks/"))
    old_requests = 5 + 8 + fresh + fresh // 8
    assert len(asked[1]) == 2 + 1 + 8 + fresh < old_requests


@pytest.mark.parametrize("refresh", ["10 s", "2000", None])
def test_vertex_metrics_are_asked_once_per_refresh_of_the_jobmanagers_metrics(refresh):
    """Flink's JobManager refreshes the metrics it serves every metrics.fetcher.update-interval
    (10 s unless set): polled every 5 s, every other answer would repeat the one before. A job's
    first ask waits for a job-dependent share of a refresh (the fleet's jobs spread over polls)."""
    import copy

    polls = copy.deepcopy(recorded_polls("leak"))
    polls[0]["/jobmanager/config"] = ([{"key": "metrics.fetcher.update-interval", "value": refresh}]
                                      if refresh else [{"key": "parallelism.default", "value": "1"}])
    start = clock_at(polls, 0, 120.0)
    now = [start]
    counts, samples = [], []
    with RecordedFlink(polls) as flink:
        flink.poll = 1  # the running job, at every poll
        collector = ClusterCollector(endpoint(flink.url), settings(), lambda events: None, clock=lambda: now[0])
        for poll in range(6):
            now[0] = start + 5 * poll
            before = len(flink.requests)
            result = collector.poll()
            counts.append(sum("/vertices/" in path for path in flink.requests[before:]))
            samples.append(sum(e["kind"] == "vertex_metrics" for e in result.events))
        assert flink.requests.count("/jobmanager/config") == 1  # read once, not at every poll
    assert counts == samples and set(counts) <= {0, 8}
    if refresh == "2000":
        assert counts == [8] * 6
    else:  # every other poll, from one of the first three on
        first = counts.index(8)
        assert first <= 2 and counts[first:] == [8, 0] * ((6 - first) // 2) + [8] * ((6 - first) % 2)
        assert counts[:first] == [0] * first
