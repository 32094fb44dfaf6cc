"""The detection job end to end: throughput against the raw consume ceiling, a fleet in real time,
latency, and cost against the number of live jobs. Every figure is ``sentinel run``'s own query
(``pipelines.detection.job.start_detection``: validation, features, scoring with the champions,
incident policy, incident and dead-letter topics, feature log) on the embedded broker.

* ``throughput``: a fleet published first, then read by the job: with ``Trigger.AvailableNow``,
  and with a processing-time trigger catching up ``--max-per-batch`` events a batch (sustained
  throughput, over the whole run and after its first batch); next to a raw kafka-python consume of
  the same topic in the same run.
* ``fleet``: ``--fleet-jobs`` simulated Flink jobs polled every 5 s, published in real time (event
  time = wall time) for ``--fleet-minutes`` while the job runs on a 2 s trigger: every batch's
  duration, the state rows and the memory of the driver, the JVM and the Python workers over time,
  and the latency from an incident's event time to its record on the incident topic. With
  ``--fleet-aged-minutes``, the jobs are that old when the real-time part starts (their history
  caught up first, ``fleet_publisher.py``'s backlog): a fleet at its steady state.
* ``latency``: one job of each scenario in real time on a 2 s trigger (faults every few minutes).
* ``scaling``: throughput and state for 1k, 4k and 16k live jobs (a minute of each).
* ``rotation``: state against live and ever-seen jobs: seed 001's key rotation with Flink jobs as
  the keys (``--live-jobs`` alive at any time, each reporting twice 10 minutes apart and then never
  again, replaced at once), in 10-minute slices of event time; the state store's rows after each.

The machine's speed is printed at the start and the end (:mod:`benchmarks.calibration`): on a
shared machine it moves between runs by more than many changes do.

Usage: ``.venv/bin/python benchmarks/detection.py [throughput|fleet|latency|scaling ...]`` (all by
default). Needs trained champions in the configured registry (``make run`` or ``sentinel train``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

from benchmarks.calibration import calibration_line  # noqa: E402
from benchmarks.kafka_io import machine, raw_consume  # noqa: E402
from infra.embedded_stack import EmbeddedStack, free_port  # noqa: E402
from pipelines import simulator  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from benchmarks.fleet_publisher import encoded, publish, target  # noqa: E402
from pipelines.detection.champions import ChampionCache  # noqa: E402
from pipelines.detection.job import start_detection  # noqa: E402
from pipelines.detection.observability import ProgressListener  # noqa: E402
from pipelines.io import kafka_clients  # noqa: E402
from pipelines.io.kafka_stream import process_all_published  # noqa: E402
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


def phases(progress) -> str:
    """The median of each part of a micro-batch (Spark's ``durationMs``), in ms."""
    names = sorted({name for p in progress for name in (p["durationMs"] or {})})
    return ", ".join(f"{name} {np.median([p['durationMs'].get(name, 0) for p in progress]):,.0f}"
                     for name in names)


def store_phases(progress) -> str:
    """The median of the state store's timings per micro-batch (its commit, RocksDB's parts), in ms."""
    names = sorted({name for p in progress for name in p.get("store", {})})
    return ", ".join(f"{name} {np.median([p['store'].get(name, 0) for p in progress]):,.0f}" for name in names)


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
        f"{max_per_batch:,} per batch | ratio | the same, after its first batch | ratio |")
    out("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, jobs in fleets.items():
        records = encoded(simulator.merged_events(jobs))
        rates = []
        for available_now in (True, False):
            cfg = fresh_topics(config, "throughput")
            if not available_now:
                cfg.spark.trigger_interval = "2 seconds"
                cfg.kafka.max_offsets_per_trigger = max_per_batch
            publish(target(cfg), records)
            if available_now:
                ceiling = raw_consume(cfg, cfg.topics.input, len(records))
            elapsed, job, progress = run_to_end(spark, cfg, available_now, len(records))
            rates.append(len(records) / elapsed)
            if not available_now:
                rates.append(after_first_batch(progress))
            out(f"<!-- {name}: {'AvailableNow' if available_now else 'processing time'}: {len(records)} events in "
                f"{elapsed:.1f}s over {len(progress)} batches, {job.sinks.incidents_published} incident events; "
                f"median per batch: {phases(progress)} -->")
        raw = len(records) / ceiling
        out(f"| {name} | {len(records):,} | {raw:,.0f}/s | {rates[0]:,.0f}/s | {rates[0] / raw:.2f} | "
            f"{rates[1]:,.0f}/s | {rates[1] / raw:.2f} | {rates[2]:,.0f}/s | {rates[2] / raw:.2f} |")


def after_first_batch(progress) -> float:
    """Events a second once the job runs: the batches after the first (whose time includes what a
    query's first batch sets up: its state stores, the JVM's compilation of the plan) over the
    time from the first batch's end to the last one's."""
    def end(p) -> float:
        started = datetime.datetime.strptime(p["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
        return started.replace(tzinfo=datetime.timezone.utc).timestamp() + p["durationMs"]["triggerExecution"] / 1000
    if len(progress) < 2:
        return float("nan")
    return sum(p["numInputRows"] for p in progress[1:]) / (end(progress[-1]) - end(progress[0]))


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


def processes(exclude: set[int] = frozenset()) -> list[tuple[int, str | None]]:
    """The processes under this one, by group: ``jvm`` (Spark's driver and executor in local
    mode), ``python workers``, ``broker``; None for any other."""
    groups = {"java": "jvm", "tansu": "broker"}
    return [(pid, groups.get(name, "python workers" if name.startswith("python") else None))
            for pid, name in _descendants(os.getpid()) if pid not in exclude]


def memory(running: list[tuple[int, str | None]]) -> dict[str, int]:
    """Resident memory of the driver's Python, the Spark JVM and the Python workers (of
    :func:`processes`)."""
    usage = {"driver python": _rss_bytes(os.getpid()), "jvm": 0, "python workers": 0}
    for pid, group in running:
        if group in ("jvm", "python workers"):
            usage[group] += _rss_bytes(pid)
    return usage


def jvm_memory(spark, last_progress: dict | None) -> dict[str, int]:
    """Where the JVM's resident memory goes, as the JVM and the state store count it: the heap
    committed, the heap live after its last collection (what a leak would grow; the committed heap
    may grow up to the driver's memory without one), the JVM's other committed pools (metaspace,
    code cache), its direct buffers, and RocksDB's own memory (its block cache, memtables and
    readers, from the query's last progress). What the resident memory has beyond them is native
    memory none of them counts (malloc's arenas, Arrow's, the JIT's)."""
    management = spark._jvm.java.lang.management.ManagementFactory
    memory_bean = management.getMemoryMXBean()
    heap = memory_bean.getHeapMemoryUsage()
    after_gc = 0
    for pool in management.getMemoryPoolMXBeans():
        if str(pool.getType()) == "Heap memory" and pool.getCollectionUsage() is not None:
            after_gc += pool.getCollectionUsage().getUsed()
    direct = sum(b.getMemoryUsed() for b in management.getPlatformMXBeans(
        spark._jvm.java.lang.Class.forName("java.lang.management.BufferPoolMXBean")))
    stores = (last_progress or {}).get("stateOperators") or []
    return {"heap committed": heap.getCommitted(), "heap after gc": after_gc,
            "non-heap committed": memory_bean.getNonHeapMemoryUsage().getCommitted(),
            "direct": direct, "rocksdb": sum(s.get("memoryUsedBytes", 0) for s in stores)}


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of the process and of its children it has reaped."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS  # utime, stime, cutime, cstime


def cpu(running: list[tuple[int, str | None]], publisher: int) -> dict[str, float]:
    """CPU seconds so far of the driver's Python, the Spark JVM, the Python workers, the broker (of
    :func:`processes`) and the fleet's publisher (all on the run's two cores), and of each Python
    worker by process id (``worker <pid>``): where the cores' time goes, which batch durations
    alone do not say."""
    usage = {"driver python": _cpu_seconds(os.getpid()), "jvm": 0.0, "python workers": 0.0, "broker": 0.0,
             "publisher": _cpu_seconds(publisher)}
    for pid, group in running:
        if group is None:
            continue
        seconds = _cpu_seconds(pid)
        usage[group] += seconds
        if group == "python workers":
            usage[f"worker {pid}"] = seconds
    return usage


class BatchRecorder(ProgressListener):
    """Every micro-batch of the run: (batch id, input rows, seconds, state rows)."""

    def __init__(self):
        self.batches: list[tuple[int, int, float, int]] = []
        self.progress: list[dict] = []  # of the batches with input, for phases()

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        p = event.progress
        state = sum(s.numRowsTotal for s in p.stateOperators or [])
        self.batches.append((p.batchId, p.numInputRows, (p.durationMs or {}).get("triggerExecution", 0) / 1000.0,
                             state))
        if p.numInputRows:
            store = p.stateOperators[0] if p.stateOperators else None
            self.progress.append({"at": time.monotonic(), "batch": p.batchId, "rows": p.numInputRows,
                                  "durationMs": dict(p.durationMs or {}), "store": {} if store is None else {
                "commitTimeMs": store.commitTimeMs, "allUpdatesTimeMs": store.allUpdatesTimeMs,
                **{k: v for k, v in (store.customMetrics or {}).items() if "Latency" in k or "TimeMs" in k}}})

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


@dataclass
class FleetRun:
    batches: list = field(default_factory=list)  # (batch id, input rows, seconds, state rows)
    samples: list = field(default_factory=list)  # (seconds since start, state rows, memory, CPU seconds)


def fleet(spark, config, jobs_n: int, minutes: int, out, trigger: str = "2 seconds", aged_minutes: int = 0,
          catch_up_s: float = 0.0) -> np.ndarray:
    cfg = fresh_topics(config, "fleet")
    cfg.spark.trigger_interval = trigger
    aged = f", the jobs {aged_minutes} min old (their history caught up first)" if aged_minutes else ""
    out(f"\n### A fleet in real time: {jobs_n:,} jobs polled every 5 s, {minutes} min, trigger {trigger}{aged}\n")
    config_file = Path(cfg.state_dir) / "fleet-target.json"
    config_file.write_text(json.dumps(target(cfg)))
    cache = ChampionCache(cfg)
    cache.require()
    recorder = BatchRecorder()
    spark.streams.addListener(recorder)
    # The job first (its Python workers load the models before its query starts), then the fleet:
    # what is measured is a running job's, not its start's (reported on its own).
    started = time.monotonic()
    job = start_detection(spark, cfg, cache)
    out(f"<!-- the job started (models loaded in its Python workers) in {time.monotonic() - started:.1f}s -->")
    publisher = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fleet_publisher.py")),
                                  str(config_file), str(jobs_n), str(minutes),
                                  *([str(aged_minutes), str(catch_up_s)] if aged_minutes else [])],
                                 stdout=subprocess.PIPE, text=True)
    line = publisher.stdout.readline()  # "ready <start> <events> <backlog events>" once simulated
    if not line.startswith("ready"):
        job.stop()
        raise RuntimeError(f"the fleet's publisher stopped before publishing (exit code {publisher.wait()})")
    first_event_ms, events_n, backlog_n = map(int, line.split()[1:4])
    out(f"<!-- {events_n:,} events" + (f" in real time after a backlog of {backlog_n:,}" if backlog_n else "") + " -->")
    run = FleetRun()
    t0 = time.monotonic()
    if backlog_n:  # time 0 is the real-time part's first event: the backlog is caught up before it
        t0 += first_event_ms / 1000.0 - time.time()
    try:
        while publisher.poll() is None:
            time.sleep(10)
            last = job.query.lastProgress
            state = last["stateOperators"][0]["numRowsTotal"] if last and last["stateOperators"] else 0
            running = processes(exclude={publisher.pid})  # one walk of /proc for both
            run.samples.append((time.monotonic() - t0, state, {**memory(running), **jvm_memory(spark, last)},
                                cpu(running, publisher.pid)))
            if job.query.exception() is not None:
                raise job.query.exception()
        time.sleep(15)  # the last events' batches
    finally:
        if publisher.poll() is None:
            publisher.kill()
        job.stop()
        spark.streams.removeListener(recorder)
    if backlog_n:
        catch_up = [p for p in recorder.progress if p["at"] < t0]
        recorder.progress = [p for p in recorder.progress if p["at"] >= t0]
        caught = sum(p["rows"] for p in catch_up)
        out(f"The backlog: {caught:,} of its {backlog_n:,} events read before the real-time part, in "
            f"{len(catch_up)} micro-batches over {sum(p['durationMs'].get('triggerExecution', 0) for p in catch_up) / 1000:.0f}s"
            + ("" if caught >= backlog_n else " (**not caught up**: the first real-time batches read the rest)"))
        run.samples = [sample for sample in run.samples if sample[0] > 0]
    live = {p["batch"] for p in recorder.progress}
    run.batches = [b for b in recorder.batches if b[1] and b[0] in live]
    durations = np.array([b[2] for b in run.batches])
    first_events = int(run.batches[0][0]) if run.batches else 0
    steady = np.array([b[2] for b in run.batches if b[0] > first_events + 2])  # after the first batches' start-up
    out(f"{len(run.batches)} micro-batches with input, {sum(b[1] for b in run.batches):,} events: duration p50 "
        f"{np.percentile(durations, 50):.2f}s, p99 {np.percentile(durations, 99):.2f}s, max {durations.max():.3f}s "
        f"(after the first three: max {steady.max() if len(steady) else float('nan'):.3f}s); longer than the trigger: "
        f"{int((durations > _seconds(trigger)).sum())}, after the first three: {int((steady > _seconds(trigger)).sum())}")
    out(f"<!-- median per batch: {phases(recorder.progress)}; state store: {store_phases(recorder.progress)} -->")
    out("\n| minute | batch p50 s | batch max s | events per batch p50 | offsets p50 ms | state rows | "
        "driver python MiB | JVM MiB | python workers MiB |")
    out("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seconds, state, mem, _ in run.samples[5::6]:
        # The batches that ended in this minute (the samples are taken every 10 s, one a minute shown).
        minute = [p for p in recorder.progress if seconds - 60 < p["at"] - t0 <= seconds]
        took = [p["durationMs"].get("triggerExecution", 0) / 1000.0 for p in minute] or [float("nan")]
        offsets = [p["durationMs"].get("latestOffset", 0) for p in minute] or [float("nan")]
        events = [p["rows"] for p in minute] or [float("nan")]
        out(f"| {seconds / 60:.0f} | {np.median(took):.2f} | {max(took):.2f} | {np.median(events):,.0f} | "
            f"{np.median(offsets):,.0f} | {state:,} | "
            f"{mem['driver python'] / 2**20:,.0f} | {mem['jvm'] / 2**20:,.0f} | {mem['python workers'] / 2**20:,.0f} |")
    jvm_table(run.samples, out)
    cpu_table(run.samples, out)
    first_batches(recorder.progress[:5], out)
    lags, incidents = incident_latency(cfg)
    if backlog_n:  # the backlog's incidents are about the past
        now = [i for i, e in enumerate(incidents) if e["updated_at"] >= first_event_ms]
        lags, incidents = lags[now], [incidents[i] for i in now]
    if len(lags):
        out(f"\nEvent time to incident on the topic, over {len(lags)} incident events: p50 "
            f"{np.percentile(lags, 50):.1f}s, p99 {np.percentile(lags, 99):.1f}s, max {lags.max():.1f}s")
        # Past the job's start (its first micro-batch loads the models in every Python worker, and
        # the events of that time wait for it): what a running job gives.
        running = lags[np.array([e["updated_at"] for e in incidents]) >= first_event_ms + MINUTE]
        if len(running):
            out(f"From the second minute of events on, over {len(running)}: p50 {np.percentile(running, 50):.1f}s, "
                f"p99 {np.percentile(running, 99):.1f}s, max {running.max():.1f}s")
        # The slowest, with what they were: a tail of one kind of event points at its cause.
        for i in np.argsort(lags)[::-1][:5]:
            e = incidents[i]
            out(f"<!-- {lags[i]:.1f}s: {e['event']} {e['family']} {e['job_name']}, "
                f"{(e['updated_at'] - first_event_ms) / 1000:.0f}s into the fleet's events -->")
    return lags


def jvm_table(samples: list, out) -> None:
    """The JVM's resident memory a minute, split as :func:`jvm_memory` counts it. The committed heap
    is counted whole although pages it has not touched yet are not resident: the rest is a lower
    bound of the native memory nothing else counts."""
    out("\n| minute | JVM resident MiB | heap committed | heap live after GC | non-heap committed | direct buffers "
        "| RocksDB | the rest (native) |")
    out("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seconds, _, mem, _ in samples[5::6]:
        counted = mem["heap committed"] + mem["non-heap committed"] + mem["direct"] + mem["rocksdb"]
        out(f"| {seconds / 60:.0f} | " + " | ".join(f"{mem[k] / 2**20:,.0f}" for k in (
            "jvm", "heap committed", "heap after gc", "non-heap committed", "direct", "rocksdb"))
            + f" | {(mem['jvm'] - counted) / 2**20:,.0f} |")


def first_batches(progress: list[dict], out) -> None:
    """The first micro-batches with input, each with its parts (Spark's ``durationMs`` and the state
    store's): what makes a start slower than the batches after it."""
    for p in progress:
        out(f"<!-- batch {p['batch']}: {p['rows']:,} events, {p['durationMs'].get('triggerExecution', 0):,} ms: "
            + ", ".join(f"{k} {v:,}" for k, v in sorted(p["durationMs"].items()) if k != "triggerExecution")
            + "; state store: " + ", ".join(f"{k} {v:,}" for k, v in sorted(p["store"].items())) + " -->")


def cpu_table(samples: list, out) -> None:
    """CPU seconds a minute of each group of processes, the two busiest Python workers apart."""
    groups = ("driver python", "jvm", "python workers", "broker", "publisher")
    out("\n| minute | CPU s: driver python | JVM | python workers | of them the two busiest | broker | "
        "publisher | all (of 120) |")
    out("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for before, after in zip(samples[::6], samples[6::6]):
        spent = {name: after[3][name] - before[3].get(name, 0.0) for name in after[3]}
        workers = sorted((v for k, v in spent.items() if k.startswith("worker ")), reverse=True)[:2]
        out(f"| {after[0] / 60:.0f} | " + " | ".join(f"{spent[g]:.1f}" for g in groups[:3])
            + f" | {' + '.join(f'{w:.1f}' for w in workers)} | {spent['broker']:.1f} | {spent['publisher']:.1f} | "
            f"{sum(spent[g] for g in groups):.1f} |")


def _seconds(interval: str) -> float:
    number, _, unit = interval.partition(" ")
    return float(number) * (60 if unit.startswith("minute") else 1)


def incident_latency(cfg) -> tuple[np.ndarray, list[dict]]:
    """Seconds from each incident event's ``updated_at`` (the event time it is about) to its record
    on the topic, and the incident events, in the topic's order."""
    consumer = kafka_clients.make_consumer(cfg.kafka.bootstrap_servers, cfg.kafka.client_kwargs())
    records = kafka_clients.read_records(consumer, cfg.topics.incidents)
    consumer.close()
    incidents = [json.loads(r.value) for r in records]
    lags = np.array([(r.timestamp - e["updated_at"]) / 1000.0 for r, e in zip(records, incidents)])
    return lags, incidents


def latency(spark, config, minutes: int, out) -> None:
    cfg = fresh_topics(config, "latency")
    cfg.spark.trigger_interval = "2 seconds"
    cache = ChampionCache(cfg)
    cache.require()
    job = start_detection(spark, cfg, cache)  # running before the first event (as in the fleet)
    try:
        start_ts = int(time.time() * 1000) + 15_000
        jobs = [simulator.simulate_job(name, 3000, i, minutes * MINUTE, cluster="bench", start_ts=start_ts)
                for i, name in enumerate(simulator.CATALOGUE)]
        records = encoded(simulator.merged_events(jobs))
        if records[0][0] < time.time() * 1000:
            raise RuntimeError("simulating the scenarios took longer than 15 s: their first events would be late")
        publish(target(cfg), records, pace=True)
        time.sleep(15)
    finally:
        job.stop()
    lags, _ = incident_latency(cfg)
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
        records = encoded(simulator.merged_events(simulator.simulate_fleet(jobs_n, 4000, MINUTE)))
        cfg = fresh_topics(config, f"scale{jobs_n}")
        publish(target(cfg), records)
        elapsed, _, progress = run_to_end(spark, cfg, True, len(records))
        state = progress[-1]["stateOperators"][0]
        out(f"| {jobs_n:,} | {len(records):,} | {elapsed:.1f} | {len(records) / elapsed:,.0f} | "
            f"{state['numRowsTotal']:,} | {state['numRowsTotal'] / jobs_n:.2f} | {state['memoryUsedBytes'] / 2**20:,.0f} |")


# --- state against live jobs ---------------------------------------------------------------------------


def rotation(spark, config, live_jobs: int, slices: int, out) -> None:
    slice_ms = 10 * MINUTE
    cfg = fresh_topics(config, "rotation")
    cfg.spark.trigger_interval = "1 second"
    cfg.features.idle_timeout_s = 15 * 60
    cfg.features.max_source_delay_s = 60
    start = simulator.DEFAULT_START_TS
    events = simulator.rotating_job_events(live_jobs, 2, slice_ms, slices * slice_ms)
    out(f"\n### State against live and ever-seen jobs: {live_jobs:,} live jobs rotating (2 events 10 min apart, "
        f"then gone), idle timeout {cfg.features.idle_timeout_s / 60:g} min, watermark delay "
        f"{cfg.features.max_source_delay_s:g} s\n")
    out("| event time | events in slice | seconds | events/s | jobs ever seen | state rows | state rows per live job |")
    out("|---:|---:|---:|---:|---:|---:|---:|")
    cache = ChampionCache(cfg)
    cache.require()
    job = start_detection(spark, cfg, cache)
    seen: set[str] = set()
    try:
        for k in range(slices):
            part = [e for e in events if k * slice_ms <= e["ts"] - start < (k + 1) * slice_ms]
            publish(target(cfg), encoded(part))
            started = time.perf_counter()
            process_all_published(job.query, cfg, cfg.topics.input)
            elapsed = time.perf_counter() - started
            time.sleep(2.5)  # a batch without data fires the timers of the advanced watermark
            process_all_published(job.query, cfg, cfg.topics.input)
            state = job.query.lastProgress["stateOperators"][0]["numRowsTotal"]
            seen |= {e["job_id"] for e in part}
            out(f"| {(k + 1) * 10} min | {len(part):,} | {elapsed:.1f} | {len(part) / elapsed:,.0f} | {len(seen):,} | "
                f"{state:,} | {state / live_jobs:.2f} |")
    finally:
        job.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["throughput", "fleet", "latency", "scaling", "rotation"],
                        choices=["throughput", "fleet", "latency", "scaling", "rotation"])
    parser.add_argument("--fleet-jobs", type=int, default=2000)
    parser.add_argument("--fleet-minutes", type=int, default=10)
    parser.add_argument("--fleet-aged-minutes", type=int, default=0,
                        help="the fleet's jobs have run this long when the real-time part starts (their history "
                             "is published first, as a backlog the job catches up)")
    parser.add_argument("--fleet-catch-up-s", type=float, default=300.0,
                        help="with --fleet-aged-minutes: the time between the backlog's end and the real-time part")
    parser.add_argument("--latency-minutes", type=int, default=6)
    parser.add_argument("--max-per-batch", type=int, default=20_000)
    parser.add_argument("--live-jobs", type=int, default=8192)
    parser.add_argument("--slices", type=int, default=6, help="10-minute slices of event time for rotation")
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
        spark = None
        try:
            print(f"machine: {machine()}; {time.strftime('%Y-%m-%d')}", flush=True)
            print(calibration_line("start"), flush=True)
            spark = build_spark(config, "bench")

            def out(line: str) -> None:
                print(line, flush=True)

            if "throughput" in args.parts:
                throughput(spark, config, args.max_per_batch, out)
            if "fleet" in args.parts:
                fleet(spark, config, args.fleet_jobs, args.fleet_minutes, out,
                      aged_minutes=args.fleet_aged_minutes, catch_up_s=args.fleet_catch_up_s)
            if "latency" in args.parts:
                latency(spark, config, args.latency_minutes, out)
            if "scaling" in args.parts:
                scaling(spark, config, out)
            if "rotation" in args.parts:
                rotation(spark, config, args.live_jobs, args.slices, out)
            print(calibration_line("end"), flush=True)
        finally:
            # Before the temporary folder goes: the state store's maintenance thread may still
            # be writing a snapshot into it (a run ended in rmtree's "Directory not empty").
            if spark is not None:
                spark.stop()
            stack.down()


if __name__ == "__main__":
    main()
