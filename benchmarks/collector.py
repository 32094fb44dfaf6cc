"""The collector against a fleet: N Flink jobs polled every ``--interval`` seconds from one process.

Serves ``--jobs`` synthetic jobs from the lab's recorded Flink 2.3 answers
(:mod:`benchmarks.flink_fleet_replay`, in processes of their own), starts the embedded broker and
runs one collector in this process for ``--seconds``, publishing every event to the input topic
(``--publish none``: nowhere). Prints per minute and at the end: REST requests per job-poll (the
overview and the JobManager's heap included, shared by the jobs), the cycle time (one poll of
every job) p50/p99, this process's CPU seconds per job-poll and over the wall time (the kafka
client's thread included), its resident memory at the end of the first cycle and at the end, and
the events published per second; then one JSON line of those figures.

``--tree DIR`` runs the collector of another checkout (e.g. ``git archive 0d8a03d pipelines | tar
-x -C DIR``), one poll at a time as it did: the figures before a change.

    .venv/bin/python benchmarks/collector.py --jobs 2000 --interval 5 --seconds 600
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE / 2**20


def cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def sys_s() -> float:
    return os.times().system


def runqueue_wait_s() -> float | None:
    """Seconds this process's threads were ready to run but waited for a CPU (the scheduler's
    accounting): what a machine shared with other work costs the collector in wall time. None
    where the kernel does not keep that account (its schedstat reads zeros)."""
    ran = waited = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
            ran, waited = ran + int(fields[0]), waited + int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return waited / 1e9 if ran else None


def start_fleet(args, port: int) -> list[subprocess.Popen]:
    epoch_ms = int(time.time() * 1000)
    servers = []
    for _ in range(args.server_processes):
        server = subprocess.Popen([sys.executable, "-m", "benchmarks.flink_fleet_replay", "--jobs", str(args.jobs),
                                   "--port", str(port), "--checkpoint-interval", str(args.checkpoint_interval),
                                   "--epoch-ms", str(epoch_ms),
                                   *(["--metrics-refresh", args.metrics_refresh] if args.metrics_refresh else [])],
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True)
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the replay server did not start")
        servers.append(server)
    return servers


def stop_fleet(servers: list[subprocess.Popen]) -> dict:
    served = {"requests": 0, "cpu_s": 0.0}
    for server in servers:
        server.terminate()
        out, _ = server.communicate(timeout=30)
        figures = json.loads(out.strip().splitlines()[-1])
        served["requests"] += figures["requests"]
        served["cpu_s"] += figures["cpu_s"]
    return served


def published(result) -> int:
    """The events a poll published (an older collector's result lists them)."""
    counts = getattr(result, "published", None)
    return sum(counts.values()) if counts is not None else len(result.events)


class Cycles:
    """What each cycle (one poll of every job) cost."""

    def __init__(self):
        self.durations: list[float] = []
        self.requests = self.job_polls = self.events = self.errors = 0
        self.first_error = ""
        self.rss_after_first: float | None = None
        self.minutes: list[str] = []
        self.first = self.second = None

    def add(self, result) -> None:
        """Every cycle after the first two: the first reads each job's whole checkpoint history (a
        backlog a collector publishes once, when it starts), the second what finished meanwhile.
        The figures are the steady state's."""
        if self.first is None:
            self.first = result
            return
        if self.second is None:
            self.second = result
            self.rss_after_first, self.cpu_after_first, self.wall_after_first = rss_mib(), cpu_s(), time.monotonic()
            self.sys_after_first, self.waited_after_first = sys_s(), runqueue_wait_s()
            return
        self.durations.append(result.duration_s)
        self.requests += result.requests
        self.job_polls += getattr(result, "job_polls", 0) or result.jobs
        self.events += published(result)
        self.errors += len(result.errors)
        self.first_error = self.first_error or (result.errors[0] if result.errors else "")


def run_new(args, config, publish) -> Cycles:
    from pipelines.collector import ClusterCollector, run_loop
    from pipelines.config import FlinkClusterEndpoint

    endpoint = FlinkClusterEndpoint(name="fleet", rest_url=args.url)
    collector = ClusterCollector(endpoint, config.collector, publish, storage=config.storage, keep_events=False)
    cycles = Cycles()

    async def loop() -> None:
        started = time.monotonic()
        next_minute, cpu_minute = None, 0.0
        try:
            while time.monotonic() - started < args.seconds:
                cycle_started = time.monotonic()
                cycles.add(await collector.poll_async())
                now = time.monotonic()
                if next_minute is None:  # minutes counted from the end of the first cycle
                    next_minute, cpu_minute = now + 60, cpu_s()
                elif now >= next_minute:
                    last = f"{cycles.durations[-1]:.2f}s" if cycles.durations else "a start-up cycle"
                    cycles.minutes.append(f"minute {len(cycles.minutes) + 1}: {(cpu_s() - cpu_minute) / 60:.2f} cores, "
                                          f"RSS {rss_mib():.0f} MiB, last cycle {last}")
                    print(cycles.minutes[-1], flush=True)
                    next_minute, cpu_minute = next_minute + 60, cpu_s()
                await asyncio.sleep(max(0.0, args.interval - (now - cycle_started)))
        finally:
            await collector.rest.close()

    run_loop(loop())
    return cycles


def run_old(args, config, publish) -> Cycles:
    from pipelines.collector import ClusterCollector
    from pipelines.config import FlinkClusterEndpoint

    collector = ClusterCollector(FlinkClusterEndpoint(name="fleet", rest_url=args.url), config.collector, publish,
                                 storage=config.storage)
    cycles = Cycles()
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        cycle_started = time.monotonic()
        cycles.add(collector.poll())
        time.sleep(max(0.0, args.interval - (time.monotonic() - cycle_started)))
    return cycles


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--checkpoint-interval", type=float, default=60.0,
                        help="each synthetic job's checkpoint interval (the lab's recording: 3 s)")
    parser.add_argument("--concurrency", type=int, default=None, help="collector.max_concurrent_requests")
    parser.add_argument("--server-processes", type=int, default=1)
    parser.add_argument("--metrics-refresh", help="the fleet's metrics.fetcher.update-interval, e.g. 2000 "
                                                  "(default: not set, Flink's 10 s)")
    parser.add_argument("--publish", choices=("kafka", "none"), default="kafka")
    parser.add_argument("--tree", type=Path, help="the checkout whose collector to run (default: this one)")
    args = parser.parse_args()
    if args.tree:
        sys.path.insert(0, str(args.tree.resolve()))
        import pipelines.collector  # noqa: F401 - the tree's, before anything puts this checkout first
        import pipelines.config  # noqa: F401
    sys.path.insert(1 if args.tree else 0, str(ROOT))

    from benchmarks.kafka_io import machine
    from infra.embedded_stack import EmbeddedStack, free_port
    from pipelines.config import load_config

    port = free_port()
    args.url = f"http://127.0.0.1:{port}"
    servers = start_fleet(args, port)
    stack = None
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config().model_copy(deep=True)
        config.state_dir = Path(tmp)
        config.collector.state_dir = Path(tmp) / "collector"
        config.collector.interval_s = args.interval
        if args.concurrency and not args.tree:
            config.collector.max_concurrent_requests = args.concurrency
        close = lambda: None  # noqa: E731
        publish = lambda events: None  # noqa: E731
        try:
            if args.publish == "kafka":
                config.kafka.bootstrap_servers = f"127.0.0.1:{free_port()}"
                config.stack.start_mlflow_server = False
                stack = EmbeddedStack(config)
                stack.up(mlflow=False)
                from pipelines.collector import kafka_publisher

                publish, close = kafka_publisher(config, awaitable=True) if not args.tree else kafka_publisher(config)
            cycles = (run_old if args.tree else run_new)(args, config, publish)
            wall, cpu = time.monotonic() - cycles.wall_after_first, cpu_s() - cycles.cpu_after_first
            kernel = sys_s() - cycles.sys_after_first
            waited_now = runqueue_wait_s()
            waited = None if waited_now is None else waited_now - cycles.waited_after_first
            rss_end = rss_mib()
        finally:
            close()
            if stack is not None:
                stack.down()
            served = stop_fleet(servers)
    if not cycles.durations:
        raise SystemExit("only the two start-up cycles ran: give more --seconds")
    durations = np.array(cycles.durations)
    job_polls = max(1, cycles.job_polls)
    figures = {
        "jobs": args.jobs, "interval_s": args.interval,
        "requests_per_job_poll": round(cycles.requests / job_polls, 2),
        "cycle_p50_s": round(float(np.percentile(durations, 50)), 3),
        "cycle_p99_s": round(float(np.percentile(durations, 99)), 3),
        "cpu_cores": round(cpu / wall, 3),
        "rss_start_mib": round(cycles.rss_after_first or 0.0, 1), "rss_end_mib": round(rss_end, 1),
        "events_per_s": round(cycles.events / wall, 1),
    }
    print(f"machine: {machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"fleet: {args.jobs} jobs of the lab's recorded skew job (8 vertices x parallelism 2), a checkpoint every "
          f"{args.checkpoint_interval:g}s each; collector {'of ' + str(args.tree) if args.tree else 'of this tree'}, "
          f"publishing to {'the embedded broker' if args.publish == 'kafka' else 'nowhere'}")
    for name, warm_up in (("first", cycles.first), ("second", cycles.second)):
        print(f"{name} cycle (start-up: every job's checkpoint history, then what finished meanwhile): "
              f"{warm_up.duration_s:.2f}s, {warm_up.requests} requests, {published(warm_up)} events")
    print(f"cycles after those: {len(durations)} in {wall:.0f}s; cycle time p50 {figures['cycle_p50_s']:.2f}s, "
          f"p99 {figures['cycle_p99_s']:.2f}s, max {durations.max():.2f}s")
    print(f"requests: {cycles.requests} for {cycles.job_polls} job-polls = {figures['requests_per_job_poll']:.2f} per "
          f"job-poll; {cycles.errors} errors{' (first: ' + cycles.first_error + ')' if cycles.errors else ''}")
    print(f"CPU: {cpu:.1f}s ({kernel:.1f}s of it in the kernel: the sockets, loopback's both ends included) = "
          f"{cpu / job_polls * 1000:.2f} ms per job-poll, {figures['cpu_cores']:.2f} cores; "
          f"replay server: {served['cpu_s']:.1f}s for {served['requests']} requests")
    print(f"waited for a CPU while ready to run (other work on the machine): "
          f"{'not accounted by this kernel' if waited is None else f'{waited:.0f}s of {wall:.0f}s'}; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    print(f"RSS: {figures['rss_start_mib']:.0f} MiB after the start-up cycles, {figures['rss_end_mib']:.0f} MiB at the end")
    print(f"events: {cycles.events} = {figures['events_per_s']:.0f}/s")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
