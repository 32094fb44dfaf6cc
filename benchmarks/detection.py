"""The detection job end to end: throughput against the raw consume ceiling, a fleet in real time,
latency, and cost against the number of live jobs. Every figure is ``sentinel run``'s own query
(``pipelines.detection.job.start_detection``: validation, features, scoring with the champions,
incident policy, incident and dead-letter topics, feature log) on the embedded broker.

* ``throughput``: a fleet published first, then read by the job: with ``Trigger.AvailableNow``,
  and with a processing-time trigger catching up ``--max-per-batch`` events a batch (sustained
  throughput); next to a raw kafka-python consume of the same topic in the same run.
* ``fleet``: ``--fleet-jobs`` simulated Flink jobs polled every 5 s, published in real time (event
  time = wall time) for ``--fleet-minutes`` while the job runs on a 2 s trigger: every batch's
  duration, the state rows and the memory of the driver, the JVM and the Python workers over time,
  and the latency from an incident's event time to its record on the incident topic.
* ``latency``: one job of each scenario in real time on a 2 s trigger (faults every few minutes).
* ``scaling``: throughput and state for 1k, 4k and 16k live jobs (a minute of each).

Usage: ``.venv/bin/python benchmarks/detection.py [throughput|fleet|latency|scaling ...]`` (all by
default). Needs trained champions in the configured registry (``make run`` or ``sentinel train``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pyspark.sql.streaming import StreamingQueryListener

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

from benchmarks.kafka_io import machine, raw_consume  # noqa: E402
from infra.embedded_stack import EmbeddedStack, free_port  # noqa: E402
from pipelines import simulator  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.contracts import input_event_key  # noqa: E402
from pipelines.detection.job import start_detection  # noqa: E402
from pipelines.detection.scoring import ChampionCache  # noqa: E402
from pipelines.io import kafka_clients  # noqa: E402
from pipelines.spark_session import build_spark  # noqa: E402

MINUTE = 60_000


def fresh_topics(config, tag: str):
    cfg = config.model_copy(deep=True)
    suffix = f"{tag}-{int(time.time() * 1000)}"
    cfg.topics.input, cfg.topics.incidents, cfg.topics.dead_letter = (f"bench.{suffix}.in", f"bench.{suffix}.out",
                                                                      f"bench.{suffix}.dlq")
    cfg.spark.checkpoint_location = str(Path(config.state_dir) / "checkpoints" / suffix)
    cfg.features.offline_path = str(Path(config.state_dir) / "feature_store" / suffix)
    kafka_clients.ensure_topics(cfg.kafka.bootstrap_servers, cfg.kafka.client_kwargs(),
                                [cfg.topics.input, cfg.topics.incidents, cfg.topics.dead_letter], 3)
    return cfg


def encoded(jobs) -> list[tuple[int, bytes, bytes]]:
    """The fleet's events as records (event time, key, value), in event-time order."""
    records = [(e["ts"], input_event_key(e), json.dumps(e, separators=(",", ":")).encode())
               for job in jobs for e in job.events]
    records.sort(key=lambda r: r[0])
    return records


def publish(cfg, records, pace: bool = False, stop: threading.Event | None = None) -> int:
    """Send ``records``; paced, each when the wall clock reaches its event time."""
    producer = kafka_clients.make_producer(cfg.kafka.bootstrap_servers, cfg.kafka.client_kwargs(),
                                           linger_ms=20, batch_size=256 * 1024)
    sent = 0
    for ts, key, value in records:
        if pace:
            wait = ts / 1000.0 - time.time()
            if wait > 0:
                producer.flush()
                time.sleep(wait)
            if stop is not None and stop.is_set():
                break
        producer.send(cfg.topics.input, key=key, value=value)
        sent += 1
    producer.flush()
    producer.close()
    return sent


def run_to_end(spark, cfg, available_now: bool, expected: int, timeout_s: float = 3600):
    """The job on ``cfg`` until it has read ``expected`` records; (seconds, job, progress)."""
    cache = ChampionCache(cfg)
    cache.require()
    started = time.perf_counter()
    job = start_detection(spark, cfg, cache, available_now=available_now)
    try:
        if available_now:
            job.await_termination(timeout_s)
        else:
            deadline, read = time.monotonic() + timeout_s, {}
            while sum(read.values()) < expected and time.monotonic() < deadline:
                read.update({p["batchId"]: p["numInputRows"] for p in job.query.recentProgress})
                time.sleep(0.1)
        elapsed = time.perf_counter() - started
        progress = [p for p in job.query.recentProgress if p["numInputRows"]]
    finally:
        job.stop()
    return elapsed, job, progress


# --- throughput -------------------------------------------------------------------------------------


def throughput(spark, config, max_per_batch: int, out) -> None:
    fleets = {
        "24 scenarios x 4 jobs, 60 min (checkpoint-heavy: one scenario checkpoints every 0.5 s)":
            [simulator.simulate_job(name, 2000, i, 60 * MINUTE, cluster="bench")
             for i in range(4) for name in simulator.CATALOGUE],
        "production-like fleet: 600 jobs polled every 5 s, 15 min":
            list(simulator.simulate_fleet(600, 2000, 15 * MINUTE)),
    }
    out("\n### Throughput\n")
    out("| fleet | events | raw consume (ceiling) | AvailableNow | ratio | processing-time trigger, "
        f"{max_per_batch:,} per batch | ratio |")
    out("|---|---:|---:|---:|---:|---:|---:|")
    for name, jobs in fleets.items():
        records = encoded(jobs)
        rates = []
        for available_now in (True, False):
            cfg = fresh_topics(config, "throughput")
            if not available_now:
                cfg.spark.trigger_interval = "2 seconds"
                cfg.kafka.max_offsets_per_trigger = max_per_batch
            publish(cfg, records)
            if available_now:
                ceiling = raw_consume(cfg, cfg.topics.input, len(records))
            elapsed, job, progress = run_to_end(spark, cfg, available_now, len(records))
            rates.append(len(records) / elapsed)
            out(f"<!-- {name}: {'AvailableNow' if available_now else 'processing time'}: {len(records)} events in "
                f"{elapsed:.1f}s over {len(progress)} batches, {job.sinks.incidents_published} incident events -->")
        raw = len(records) / ceiling
        out(f"| {name} | {len(records):,} | {raw:,.0f}/s | {rates[0]:,.0f}/s | {rates[0] / raw:.2f} | "
            f"{rates[1]:,.0f}/s | {rates[1] / raw:.2f} |")


# --- a fleet in real time -----------------------------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[tuple[int, str]]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parent = int(stat.rsplit(")", 1)[1].split()[1])
                if parent == pid:
                    name = stat.split("(", 1)[1].rsplit(")", 1)[0]
                    children.append((int(entry.name), name))
            except (OSError, ValueError, IndexError):
                continue
    found = list(children)
    for child, _ in children:
        found += _descendants(child)
    return found


def memory(exclude: set[int] = frozenset()) -> dict[str, int]:
    """Resident memory of the driver's Python, the Spark JVM (driver and executor in local mode)
    and the Python workers."""
    me = os.getpid()
    usage = {"driver python": _rss_bytes(me), "jvm": 0, "python workers": 0}
    for pid, name in _descendants(me):
        if pid in exclude:
            continue
        if name == "java":
            usage["jvm"] += _rss_bytes(pid)
        elif name.startswith("python"):
            usage["python workers"] += _rss_bytes(pid)
    return usage


class BatchRecorder(StreamingQueryListener):
    """Every micro-batch of the run: (batch id, input rows, seconds, state rows)."""

    def __init__(self):
        self.batches: list[tuple[int, int, float, int]] = []

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        p = event.progress
        state = sum(s.numRowsTotal for s in p.stateOperators or [])
        self.batches.append((p.batchId, p.numInputRows, (p.durationMs or {}).get("triggerExecution", 0) / 1000.0,
                             state))

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


@dataclass
class FleetRun:
    batches: list = field(default_factory=list)  # (batch id, input rows, seconds, state rows)
    samples: list = field(default_factory=list)  # (seconds since start, state rows, memory)


def _publish_fleet(config_json: str, jobs_n: int, minutes: int, start_ts: int, ready) -> None:
    """A process of its own (as a collector would be): simulate the fleet, then publish it in real time."""
    from pipelines.config import SentinelConfig

    cfg = SentinelConfig.model_validate_json(config_json)
    records = encoded(simulator.simulate_fleet(jobs_n, 3000, minutes * MINUTE, start_ts=start_ts))
    ready.set()
    publish(cfg, records, pace=True)


def fleet(spark, config, jobs_n: int, minutes: int, out, trigger: str = "2 seconds") -> np.ndarray:
    import multiprocessing

    cfg = fresh_topics(config, "fleet")
    cfg.spark.trigger_interval = trigger
    out(f"\n### A fleet in real time: {jobs_n:,} jobs polled every 5 s, {minutes} min, trigger {trigger}\n")
    lead_s = 60 + jobs_n * 0.06  # simulating takes a while: the fleet starts that far in the future
    start_ts = int((time.time() + lead_s) * 1000)
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    publisher = context.Process(target=_publish_fleet, args=(cfg.model_dump_json(), jobs_n, minutes, start_ts, ready))
    publisher.start()
    cache = ChampionCache(cfg)
    cache.require()
    recorder = BatchRecorder()
    spark.streams.addListener(recorder)
    job = start_detection(spark, cfg, cache)
    if not ready.wait(max(1.0, start_ts / 1000.0 - time.time())):
        publisher.kill()
        raise RuntimeError("simulating the fleet took longer than its lead: raise lead_s")
    run = FleetRun()
    t0 = time.monotonic()
    try:
        while publisher.is_alive():
            time.sleep(10)
            last = job.query.lastProgress
            state = last["stateOperators"][0]["numRowsTotal"] if last and last["stateOperators"] else 0
            run.samples.append((time.monotonic() - t0, state, memory(exclude={publisher.pid})))
            if job.query.exception() is not None:
                raise job.query.exception()
        time.sleep(15)  # the last events' batches
    finally:
        if publisher.is_alive():
            publisher.kill()
        job.stop()
        spark.streams.removeListener(recorder)
    run.batches = [b for b in recorder.batches if b[1]]
    durations = np.array([b[2] for b in run.batches])
    first_events = int(run.batches[0][0]) if run.batches else 0
    steady = np.array([b[2] for b in run.batches if b[0] > first_events + 2])  # after the first batches' start-up
    out(f"{len(run.batches)} micro-batches with input, {sum(b[1] for b in run.batches):,} events: duration p50 "
        f"{np.percentile(durations, 50):.2f}s, p99 {np.percentile(durations, 99):.2f}s, max {durations.max():.2f}s "
        f"(after the first three: max {steady.max() if len(steady) else float('nan'):.2f}s); longer than the trigger: "
        f"{int((durations > _seconds(trigger)).sum())}, after the first three: {int((steady > _seconds(trigger)).sum())}")
    out("\n| minute | state rows | driver python MiB | JVM MiB | python workers MiB |")
    out("|---:|---:|---:|---:|---:|")
    for seconds, state, mem in run.samples[5::6]:
        out(f"| {seconds / 60:.0f} | {state:,} | {mem['driver python'] / 2**20:,.0f} | {mem['jvm'] / 2**20:,.0f} | "
            f"{mem['python workers'] / 2**20:,.0f} |")
    lags = incident_latency(cfg)
    if len(lags):
        out(f"\nEvent time to incident on the topic, over {len(lags)} incident events: p50 "
            f"{np.percentile(lags, 50):.1f}s, p99 {np.percentile(lags, 99):.1f}s, max {lags.max():.1f}s")
    return lags


def _seconds(interval: str) -> float:
    number, _, unit = interval.partition(" ")
    return float(number) * (60 if unit.startswith("minute") else 1)


def incident_latency(cfg) -> np.ndarray:
    consumer = kafka_clients.make_consumer(cfg.kafka.bootstrap_servers, cfg.kafka.client_kwargs())
    records = kafka_clients.read_records(consumer, cfg.topics.incidents)
    consumer.close()
    return np.array([(r.timestamp - json.loads(r.value)["updated_at"]) / 1000.0 for r in records])


def latency(spark, config, minutes: int, out) -> None:
    cfg = fresh_topics(config, "latency")
    cfg.spark.trigger_interval = "2 seconds"
    start_ts = int(time.time() * 1000) + 30_000
    jobs = [simulator.simulate_job(name, 3000, i, minutes * MINUTE, cluster="bench", start_ts=start_ts)
            for i, name in enumerate(simulator.CATALOGUE)]
    records = encoded(jobs)
    cache = ChampionCache(cfg)
    cache.require()
    job = start_detection(spark, cfg, cache)
    try:
        publish(cfg, records, pace=True)
        time.sleep(15)
    finally:
        job.stop()
    lags = incident_latency(cfg)
    out(f"\n### Latency: the {len(jobs)} scenarios in real time for {minutes} min, trigger 2 s, lateness "
        f"{cfg.features.lateness_s:g}s (nothing waits for it)\n")
    if len(lags):
        out(f"Event time to incident on the topic over {len(lags)} incident events: p50 {np.percentile(lags, 50):.1f}s, "
            f"p99 {np.percentile(lags, 99):.1f}s, max {lags.max():.1f}s")
    else:
        out("no incident events: nothing to measure")


# --- cost against work ---------------------------------------------------------------------------------


def scaling(spark, config, out) -> None:
    out("\n### Cost against live jobs: a minute of every job (polled every 5 s), AvailableNow\n")
    out("| live jobs | events | seconds | events/s | state rows | state rows per job | state memory MiB |")
    out("|---:|---:|---:|---:|---:|---:|---:|")
    for jobs_n in (1_000, 4_000, 16_000):
        records = encoded(simulator.simulate_fleet(jobs_n, 4000, MINUTE))
        cfg = fresh_topics(config, f"scale{jobs_n}")
        publish(cfg, records)
        elapsed, _, progress = run_to_end(spark, cfg, True, len(records))
        state = progress[-1]["stateOperators"][0]
        out(f"| {jobs_n:,} | {len(records):,} | {elapsed:.1f} | {len(records) / elapsed:,.0f} | "
            f"{state['numRowsTotal']:,} | {state['numRowsTotal'] / jobs_n:.2f} | {state['memoryUsedBytes'] / 2**20:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["throughput", "fleet", "latency", "scaling"],
                        choices=["throughput", "fleet", "latency", "scaling"])
    parser.add_argument("--fleet-jobs", type=int, default=2000)
    parser.add_argument("--fleet-minutes", type=int, default=10)
    parser.add_argument("--latency-minutes", type=int, default=6)
    parser.add_argument("--max-per-batch", type=int, default=20_000)
    args = parser.parse_args()
    base = load_config()
    ChampionCache(base).require()  # say so before starting anything
    with tempfile.TemporaryDirectory() as tmp:
        config = base.model_copy(deep=True)
        config.kafka.bootstrap_servers = f"127.0.0.1:{free_port()}"
        config.state_dir = Path(tmp)
        config.detection.metrics_file = Path(tmp) / "sentinel.prom"
        config.detection.metrics_port = None
        config.stack.start_mlflow_server = False
        stack = EmbeddedStack(config)
        stack.up(mlflow=False)
        try:
            print(f"machine: {machine()}; {time.strftime('%Y-%m-%d')}", flush=True)
            spark = build_spark(config, "bench")

            def out(line: str) -> None:
                print(line, flush=True)

            if "throughput" in args.parts:
                throughput(spark, config, args.max_per_batch, out)
            if "fleet" in args.parts:
                fleet(spark, config, args.fleet_jobs, args.fleet_minutes, out)
            if "latency" in args.parts:
                latency(spark, config, args.latency_minutes, out)
            if "scaling" in args.parts:
                scaling(spark, config, out)
        finally:
            stack.down()


if __name__ == "__main__":
    main()
