"""The same recorded Flink answers through a collector, with a clock each poll sets: what the
feature parity test compares between the collector before its request budget and after.

``old_client_events.json.gz`` holds what the collector of commit 0d8a03d (one request at a
time over urllib, every checkpoint's ``/checkpoints/details/:cid``, ``/jobs/:id`` and
``numRestarts`` at every poll) published for these recordings; it was written by running this
module against that commit:

    .venv/bin/python -m tests.pipelines.collector.parity
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from pipelines.config import CollectorConfig, FlinkClusterEndpoint
from tests.pipelines.collector.flink_replay import RecordedFlink, recorded_polls

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "old_client_events.json.gz"
RECORDINGS = ("leak", "skew", "checkpoint_timeout")
# Each recording polled with the clock just after its job started (the checkpoint configuration
# and the job's details read again at every poll) and with the job long settled.
CLOCKS = {"starting": 1.0, "settled": 120.0}
POLL_EVERY_S = 6.0


def clock_at(polls: list[dict], poll: int, after_start_s: float) -> float:
    """The collector's clock at ``poll``: ``after_start_s`` after the job last changed state, then
    one recording interval per poll."""
    job = polls[0]["/jobs/overview"]["jobs"][0]
    return job["last-modification"] / 1000 + after_start_s + poll * POLL_EVERY_S


def events_per_poll(make_collector, name: str, after_start_s: float) -> list[list[dict]]:
    """Every poll of recording ``name`` (and one more, which sees a finished job's end), the
    events published at each. ``make_collector(url, publish, clock)`` builds the collector."""
    polls = recorded_polls(name)
    now = [clock_at(polls, 0, after_start_s)]
    published: list[dict] = []
    per_poll = []
    with RecordedFlink(polls) as flink:
        collector = make_collector(flink.url, published.extend, lambda: now[0])
        for poll in range(len(polls) + 1):
            flink.poll = poll
            now[0] = clock_at(polls, poll, after_start_s)
            before = len(published)
            collector.poll()
            per_poll.append(published[before:])
    return per_poll


def settings() -> CollectorConfig:
    return CollectorConfig(state_dir=None, retries=0, backoff_s=0.05, request_timeout_s=5.0)


def endpoint(url: str) -> FlinkClusterEndpoint:
    return FlinkClusterEndpoint(name="lab", rest_url=url)


def main() -> None:
    from pipelines.collector import ClusterCollector

    def make(url, publish, clock):
        return ClusterCollector(endpoint(url), settings(), publish, clock=clock)

    golden = {f"{name}/{clock}": events_per_poll(make, name, after)
              for name in RECORDINGS for clock, after in CLOCKS.items()}
    with gzip.open(GOLDEN, "wt") as out:
        json.dump(golden, out, sort_keys=True)
    print({key: [len(p) for p in polls] for key, polls in golden.items()})


if __name__ == "__main__":
    main()
