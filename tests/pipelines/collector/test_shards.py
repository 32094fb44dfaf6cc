"""Several collector processes sharing one cluster's jobs (``collector.shard``), against a fleet of
jobs served from real Flink answers (``benchmarks/flink_fleet_replay.py``) whose checkpoints
advance with the clock: every checkpoint published once across the shards, a shard that stops and
comes back publishes what finished meanwhile and nothing twice, and so does a change of the
number of shards, back and forth (an older layout's ledger files left behind)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.embedded_stack import free_port
from pipelines.collector import ClusterCollector, Shard
from pipelines.config import CollectorConfig, FlinkClusterEndpoint

ROOT = Path(__file__).resolve().parents[3]
JOBS = 12
CHECKPOINT_EVERY_S = 2.0


def test_every_job_has_exactly_one_shard_and_a_new_shard_takes_only_its_share():
    ids = [f"{n:032x}" for n in range(600)]
    three = [Shard(i, 3) for i in range(3)]
    owners = [[s.owns("eu", job) for s in three].index(True) for job in ids]
    assert all(sum(s.owns("eu", job) for s in three) == 1 for job in ids)
    assert all(150 <= owners.count(i) <= 250 for i in range(3))  # about a third each
    four = [Shard(i, 4) for i in range(4)]
    moved = [job for job, owner in zip(ids, owners) if not four[owner].owns("eu", job)]
    assert all(four[3].owns("eu", job) for job in moved)  # a job moves only to the new shard
    assert 100 <= len(moved) <= 200  # about a quarter
    assert [str(Shard.parse(t)) for t in ("0/1", "2/4")] == ["0/1", "2/4"]
    for bad in ("4/4", "1", "-1/2", "a/b"):
        with pytest.raises(ValueError):
            Shard.parse(bad)


@pytest.fixture(scope="module")
def fleet():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.flink_fleet_replay", "--jobs", str(JOBS), "--port",
                               str(port), "--checkpoint-interval", str(CHECKPOINT_EVERY_S), "--metrics-refresh", "1000"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.communicate(timeout=30)


def shard_collector(url: str, state_dir: Path, shard: str | None, published: list) -> ClusterCollector:
    settings = CollectorConfig(state_dir=state_dir, shard=shard, retries=1, backoff_s=0.05)
    return ClusterCollector(FlinkClusterEndpoint(name="fleet", rest_url=url), settings, published.extend)


def checkpoints(events: list[dict]) -> list[tuple[str, int]]:
    return [(e["job_id"], e["checkpoint_id"]) for e in events if e["kind"] == "checkpoint"]


def latest(events: list[dict]) -> dict[str, int]:
    """Each job's latest finished checkpoint, as its last job status counts them."""
    return {e["job_id"]: e["checkpoints_completed_total"] for e in events if e["kind"] == "job_status"}


def test_shards_split_the_jobs_survive_a_restart_and_a_new_shard_count_without_publishing_twice(fleet, tmp_path):
    published: list[dict] = []
    state = tmp_path / "collector"
    first, second = (shard_collector(fleet, state, f"{i}/2", published) for i in range(2))
    first_jobs, second_jobs = set(), set()
    for _ in range(2):
        first_jobs |= {e["job_id"] for e in (first.poll().events)}
        second_jobs |= {e["job_id"] for e in (second.poll().events)}
        time.sleep(CHECKPOINT_EVERY_S)
    assert len(first_jobs) + len(second_jobs) == JOBS and not first_jobs & second_jobs
    assert first_jobs and second_jobs
    assert sorted(p.name for p in state.iterdir()) == ["fleet.shard-0-of-2.json", "fleet.shard-1-of-2.json"]

    # The second shard's process dies; the first goes on; the second comes back from its ledger
    # (its jobs' checkpoints of the downtime are still in Flink's history of 10).
    for _ in range(3):
        first.poll()
        time.sleep(CHECKPOINT_EVERY_S)
    shard_collector(fleet, state, "1/2", published).poll()

    # One process for the whole fleet from now on: it takes both shards' ledgers.
    time.sleep(CHECKPOINT_EVERY_S)
    whole = shard_collector(fleet, state, None, published)
    assert set(whole.ledger.jobs) == first_jobs | second_jobs
    whole.poll()

    # And back to two shards, whose ledger files are now older than the whole fleet's.
    time.sleep(CHECKPOINT_EVERY_S)
    for i in range(2):
        shard_collector(fleet, state, f"{i}/2", published).poll()

    ids = checkpoints(published)
    assert len(ids) == len(set(ids)), "a checkpoint published twice"
    newest = latest(published)
    for job in first_jobs | second_jobs:
        mine = sorted(c for j, c in ids if j == job)
        assert mine == list(range(mine[0], newest[job] + 1)), f"job {job}: checkpoints missed: {mine}"
