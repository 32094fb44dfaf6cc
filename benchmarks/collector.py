"""The collector against real Flink: what one poll costs, and what a lab scenario costs the machine.

Starts the lab's Flink cluster (``.venv-flink``, created on first use), submits the ``skew`` scenario
job (parallelism 2, eight vertices: 16 subtasks) and polls it with the collector every
``--interval`` seconds for ``--seconds``, publishing nowhere. Reports the duration of a poll (p50,
p95, max), the REST requests and the events per poll, and the CPU and resident memory of the
cluster (JobManager, TaskManager and the Python workers of the job) over the same time.

Usage: ``.venv/bin/python benchmarks/collector.py [--seconds 120] [--interval 5]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kafka_io import machine  # noqa: E402
from infra.flink_cluster import LocalFlinkCluster, ensure_flink_runtime  # noqa: E402
from pipelines import lab  # noqa: E402
from pipelines.collector import ClusterCollector  # noqa: E402
from pipelines.config import FlinkClusterEndpoint, load_config  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def cpu_seconds_and_rss(pids: list[int]) -> tuple[float, int]:
    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return cpu, rss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--interval", type=float, default=5)
    args = parser.parse_args()
    config = load_config()
    cluster = LocalFlinkCluster(config, ensure_flink_runtime(config))
    print(cluster.start())
    roots = list(cluster.pids().values())
    scenario = lab.scenario("skew")
    argv = ["--scenario", "skew", "--job-name", "bench-skew", "--onset-ms", str(int(time.time() * 1000) + 20_000)]
    for key, value in scenario.args(240_000).items():
        argv += [f"--{key}", str(value)]
    job_id = cluster.submit_python(lab.JOB_SCRIPT, argv)
    settings = config.collector.model_copy(update={"state_dir": None})
    collector = ClusterCollector(FlinkClusterEndpoint(name="bench", rest_url=cluster.rest_url), settings,
                                 publish=lambda events: None)
    time.sleep(15)  # past start-up, into steady running
    durations, requests, events = [], [], []
    cpu_start, _ = cpu_seconds_and_rss([p for r in roots for p in process_tree(r)])
    rss_peak = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.seconds:
            result = collector.poll()
            durations.append(result.duration_s)
            requests.append(result.requests)
            events.append(len(result.events))
            _, rss = cpu_seconds_and_rss([p for r in roots for p in process_tree(r)])
            rss_peak = max(rss_peak, rss)
            time.sleep(max(0.0, args.interval - result.duration_s))
        elapsed = time.monotonic() - started
        cpu_end, _ = cpu_seconds_and_rss([p for r in roots for p in process_tree(r)])
    finally:
        cluster.cancel(job_id)
        cluster.stop()
    ms = np.array(durations) * 1000
    print(f"machine: {machine()}")
    print("job: lab skew scenario, 8 vertices x parallelism 2, 300 records/s, checkpoints every 3 s")
    print(f"polls: {len(durations)} every {args.interval:g}s; poll duration p50 {np.percentile(ms, 50):.0f} ms, "
          f"p95 {np.percentile(ms, 95):.0f} ms, max {ms.max():.0f} ms; "
          f"{np.mean(requests):.1f} REST requests and {np.mean(events):.1f} events per poll")
    print(f"cluster (JobManager, TaskManager, Python workers): {(cpu_end - cpu_start) / elapsed:.2f} cores, "
          f"peak RSS {rss_peak / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
