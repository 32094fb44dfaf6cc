"""``sentinel lab``: real Flink jobs that fail the way production jobs do, recorded as labelled data.

A lab run starts the local standalone cluster (:mod:`infra.flink_cluster`), submits the scenario
job (``flink_jobs/scenario_job.py``) with the fault's onset as a wall-clock time, and runs the
collector against the cluster for the duration: the events go to the input topic (so the live
detection job sees real Flink) and into a dataset folder in the layout the retraining workflow
reads (``<dataset>/<split>/events.jsonl``, ``ground_truth.jsonl``, ``manifest.json``), with the
ground truth (family, onset, vertex, hot subtask) of the job.

Every scenario runs the same five operators, so only the fault differs between them; the
scenarios that are not about state keep it bounded with a TTL, so each job has exactly one
labelled fault.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pipelines.simulator import parse_duration, read_jsonl, write_jsonl

log = logging.getLogger(__name__)

JOB_SCRIPT = Path(__file__).parent / "flink_jobs" / "scenario_job.py"
LAB_CLUSTER = "lab"
SPLITS = ("train", "validation", "test")


class LabError(RuntimeError):
    """A lab run that cannot be done as asked; the message says what to change."""


@dataclass(frozen=True)
class LabScenario:
    name: str
    family: str | None  # None: healthy
    description: str
    vertex: str | None  # the operator the fault lives in (its vertex is named after it)
    onset_fraction: float  # of the duration; 0 = from the start
    job_args: dict = field(default_factory=dict)
    # Subtask of a skew: which one the hot key hashes to is read from the run, not guessed.
    hot_subtask: bool = False

    def args(self, duration_ms: int) -> dict:
        values = {"rate": 100, "payload-bytes": 100, "checkpoint-interval-ms": 3000, **self.job_args}
        if values.get("ttl-s") == "duration*0.75":
            values["ttl-s"] = round(duration_ms * 0.75 / 1000)
        return values


SCENARIOS: dict[str, LabScenario] = {s.name: s for s in (
    LabScenario("leak", "state_leak", "keys rotate and their state is never cleared; JobManager checkpoint "
                "storage, so the job reports its 5 MiB limit", "keyed-state", 0.0,
                {"checkpoint-storage": "jobmanager"}),
    LabScenario("healthy_ttl", None, "the same keys with a 20 s state TTL: grows for 20 s, then flat",
                None, 0.0, {"ttl-s": 20, "checkpoint-storage": "jobmanager"}),
    LabScenario("warmup", None, "a long TTL (three quarters of the run): state grows for minutes, then "
                "levels off", None, 0.0, {"ttl-s": "duration*0.75", "checkpoint-storage": "jobmanager"}),
    LabScenario("backpressure", "backpressure", "the enrich operator slows to 150 records/s under 400 "
                "records/s: buffers fill, barriers queue, checkpoints slow down", "enrich", 0.25,
                {"rate": 400, "ttl-s": 20, "slow-records-per-s": 150}),
    LabScenario("skew", "skew", "90 % of the records carry one key from the onset (parallelism 2)",
                "keyed-state", 0.25, {"rate": 300, "ttl-s": 20, "parallelism": 2, "hot-share": 0.9},
                hot_subtask=True),
    LabScenario("checkpoint_timeout", "checkpoint_failure", "enrich nearly stops (10 records/s) and the "
                "checkpoint timeout is 5 s: checkpoints expire", "enrich", 0.25,
                {"rate": 300, "ttl-s": 20, "slow-records-per-s": 10, "checkpoint-timeout-ms": 5000}),
)}


def scenario(name: str) -> LabScenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise LabError(f"unknown lab scenario {name!r}; choose from {', '.join(SCENARIOS)}") from None


@dataclass
class LabRun:
    scenario: str
    job_id: str
    events: list[dict]
    truth: dict
    dataset: Path
    split: str

    def summary(self) -> str:
        kinds = {k: sum(e["kind"] == k for e in self.events) for k in ("checkpoint", "vertex_metrics", "job_status")}
        sizes = [e["state_size_bytes"] for e in self.events if e["kind"] == "checkpoint" and e["status"] == "COMPLETED"]
        failed = sum(1 for e in self.events if e["kind"] == "checkpoint" and e["status"] == "FAILED")
        state = f"state {sizes[0]:,} -> {sizes[-1]:,} bytes" if sizes else "no completed checkpoint"
        return (f"lab {self.scenario}: job {self.job_id}, {kinds['checkpoint']} checkpoints ({failed} failed, {state}), "
                f"{kinds['vertex_metrics']} vertex samples, {kinds['job_status']} job statuses; "
                f"recorded in {self.dataset / self.split}")


def run_lab(config, name: str, duration: str = "4m", split: str = "test", dataset: Path | None = None,
            publish_to_kafka: bool = True, keep_cluster: bool = False, interval_s: float | None = None,
            progress: Callable[[str], None] = print, stop: threading.Event | None = None) -> LabRun:
    """Run one lab scenario end to end and record it; see the module docstring."""
    from infra.flink_cluster import LocalFlinkCluster, ensure_flink_runtime
    from pipelines.collector import ClusterCollector, kafka_publisher
    from pipelines.config import FlinkClusterEndpoint

    chosen = scenario(name)
    duration_ms = parse_duration(duration)
    if split not in SPLITS:
        raise LabError(f"--split must be one of {', '.join(SPLITS)}")
    dataset = Path(dataset or Path(config.lab.datasets_dir) / "dataset")
    publish_kafka, close_kafka = (kafka_publisher(config) if publish_to_kafka else (None, lambda: None))
    stop = stop or threading.Event()
    events: list[dict] = []

    def publish(batch: list[dict]) -> None:
        if publish_kafka is not None:
            publish_kafka(batch)
        events.extend(batch)

    cluster = LocalFlinkCluster(config, ensure_flink_runtime(config, log=progress))
    try:
        progress(cluster.start())
        submitted_at = int(time.time() * 1000)
        # The onset is a wall-clock time; submission takes about ten seconds, so leave room for it.
        onset_ms = submitted_at + (15_000 + int(chosen.onset_fraction * duration_ms) if chosen.onset_fraction else 0)
        job_name = f"lab-{name}"
        argv = ["--scenario", name, "--job-name", job_name, "--onset-ms", str(onset_ms)]
        for key, value in chosen.args(duration_ms).items():
            argv += [f"--{key}", str(value)]
        job_id = cluster.submit_python(JOB_SCRIPT, argv)
        progress(f"submitted {job_name} as job {job_id}; collecting every "
                 f"{interval_s or config.collector.interval_s:g}s for {duration}")
        settings = config.collector.model_copy(update={
            "state_dir": Path(config.lab.datasets_dir) / "collector",
            **({"interval_s": interval_s} if interval_s else {})})
        collector = ClusterCollector(FlinkClusterEndpoint(name=LAB_CLUSTER, rest_url=cluster.rest_url),
                                     settings, publish, source="lab")
        started = time.monotonic()
        while time.monotonic() - started < duration_ms / 1000 and not stop.is_set():
            poll_started = time.monotonic()
            result = collector.poll()
            if not result.reachable:
                raise LabError(f"the lab cluster stopped answering: {result.errors[0]}")
            progress(f"  {time.monotonic() - started:5.0f}s  {result.line()}")
            stop.wait(max(0.0, settings.interval_s - (time.monotonic() - poll_started)))
        cluster.cancel(job_id)
        _wait_terminal(cluster, job_id)
        collector.poll()  # the last checkpoints and the CANCELED status
        job_events = [e for e in events if e["job_id"] == job_id]
        truth = ground_truth(chosen, job_id, job_name, job_events, onset_ms, submitted_at)
        record_run(dataset, split, job_events, truth)
        return LabRun(name, job_id, job_events, truth, dataset, split)
    finally:
        close_kafka()
        if not keep_cluster:
            for line in cluster.stop():
                progress(line)


def _wait_terminal(cluster, job_id: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cluster.job_state(job_id) in ("CANCELED", "FINISHED", "FAILED"):
            return
        time.sleep(0.5)


def ground_truth(chosen: LabScenario, job_id: str, job_name: str, events: list[dict], onset_ms: int,
                 submitted_at: int) -> dict:
    """The simulator's ground-truth shape, from what the run did: the fault vertex is found by its
    operator name, and a skew's hot subtask is the one that received most records after the onset."""
    times = [e["ts"] for e in events]
    start_ts, end_ts = (min(times), max(times)) if times else (submitted_at, submitted_at)
    faults = []
    if chosen.family:
        vertex_id = vertex_name = None
        if chosen.vertex:
            names = {e["vertex_name"]: e["vertex_id"] for e in events if e["kind"] == "vertex_metrics"}
            vertex_name = chosen.vertex if chosen.vertex in names else None
            vertex_id = names.get(chosen.vertex)
        subtask = _hot_subtask(events, vertex_id, onset_ms) if chosen.hot_subtask else None
        faults.append({"family": chosen.family, "onset_ts": max(onset_ms, start_ts), "vertex_id": vertex_id,
                       "vertex_name": vertex_name, "subtask_index": subtask, "description": chosen.description})
    return {"cluster": LAB_CLUSTER, "job_id": job_id, "job_name": job_name, "scenario": f"lab_{chosen.name}",
            "family": chosen.family or "healthy", "seed": None, "index": 0, "start_ts": start_ts,
            "end_ts": end_ts, "source": "lab", "faults": faults}


def _hot_subtask(events: list[dict], vertex_id: str | None, onset_ms: int) -> int | None:
    totals: dict[int, float] = {}
    for event in events:
        if event["kind"] == "vertex_metrics" and event["vertex_id"] == vertex_id and event["ts"] >= onset_ms:
            for sample in event["subtasks"]:
                totals[sample["index"]] = totals.get(sample["index"], 0.0) + (sample["records_in_per_s"] or 0.0)
    return max(totals, key=totals.get) if totals and max(totals.values()) > 0 else None


def record_run(dataset: Path, split: str, events: list[dict], truth: dict) -> None:
    """Add one run to the dataset folder (events kept in time order, one ground-truth line per job)."""
    folder = dataset / split
    events_path, truth_path = folder / "events.jsonl", folder / "ground_truth.jsonl"
    previous = list(read_jsonl(events_path)) if events_path.is_file() else []
    truths = [t for t in (read_jsonl(truth_path) if truth_path.is_file() else []) if t["job_id"] != truth["job_id"]]
    merged = sorted([e for e in previous if e["job_id"] != truth["job_id"]] + events, key=lambda e: e["ts"])
    write_jsonl(events_path, merged)
    write_jsonl(truth_path, truths + [truth])
    manifest_path = dataset / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {
        "format": "checkpoint-sentinel dataset v1", "source": "lab", "splits": {}}
    manifest.setdefault("splits", {})[split] = {
        "jobs": len(truths) + 1, "events": len(merged), "job_ids": sorted([t["job_id"] for t in truths] + [truth["job_id"]])}
    manifest["scenarios"] = sorted({t["scenario"] for s in manifest["splits"] for t in
                                    read_jsonl(dataset / s / "ground_truth.jsonl")})
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
