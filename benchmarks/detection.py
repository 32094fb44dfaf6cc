"""The detection job end to end: throughput against the raw consume ceiling, and latency.

Part 1, throughput: a simulated fleet (one job per scenario) is published to the input topic;
``sentinel run --available-now`` logic (both queries: validation and dead letters, features,
scoring, policy, incident topic, feature log) processes it on ``local[2]``. Prints events/s next
to a raw kafka-python consume of the same topic.

Part 2, latency: a fleet simulated to start *now* is published in real time (event time = wall
time) while the job runs with its default trigger; for every incident event, the latency is the
incident record's Kafka timestamp minus the event time it reports (``updated_at``): the allowed
lateness, the trigger and the batch all count.

Usage: ``.venv/bin/python benchmarks/detection.py [--minutes 60] [--latency-minutes 6]``. Needs
trained champions in the configured registry (``make run`` or ``sentinel train`` first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

from benchmarks.kafka_io import machine, raw_consume  # noqa: E402
from infra.embedded_stack import EmbeddedStack, free_port  # noqa: E402
from pipelines import simulator  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.detection.job import start_detection  # noqa: E402
from pipelines.detection.scoring import ChampionCache  # noqa: E402
from pipelines.io import kafka_clients  # noqa: E402
from pipelines.simulator.publish import publish_to_kafka  # noqa: E402
from pipelines.spark_session import build_spark  # noqa: E402


def fresh_topics(config, tag: str):
    cfg = config.model_copy(deep=True)
    suffix = f"{tag}-{int(time.time())}"
    cfg.topics.input, cfg.topics.incidents, cfg.topics.dead_letter = (f"bench.{suffix}.in", f"bench.{suffix}.out",
                                                                      f"bench.{suffix}.dlq")
    kafka_clients.ensure_topics(cfg.kafka.bootstrap_servers, cfg.kafka.client_kwargs(),
                                [cfg.topics.input, cfg.topics.incidents, cfg.topics.dead_letter], 3)
    return cfg


def throughput(spark, config, minutes: int, workdir: Path) -> None:
    cfg = fresh_topics(config, "throughput")
    cfg.spark.checkpoint_location = workdir / "throughput"
    jobs = [simulator.simulate_job(name, 2000, i, minutes * 60_000, cluster="bench")
            for i, name in enumerate(simulator.CATALOGUE)]
    events = list(simulator.merged_events(jobs))
    publish_to_kafka(events, cfg)
    ceiling = raw_consume(cfg, cfg.topics.input, len(events))
    started = time.perf_counter()
    job = start_detection(spark, cfg, ChampionCache(cfg), available_now=True)
    job.await_termination()
    elapsed = time.perf_counter() - started
    job.stop()
    incidents = job.processor.incidents_published
    print(f"\nthroughput: {len(jobs)} jobs x {minutes} min, {len(events)} events")
    print("| stage | events | seconds | events/s | ratio to ceiling |")
    print("|---|---:|---:|---:|---:|")
    print(f"| raw kafka-python consume (ceiling) | {len(events)} | {ceiling:.2f} | {len(events) / ceiling:,.0f} | 1.00 |")
    print(f"| detection job, AvailableNow (validate, features, score, policy, publish) | {len(events)} | "
          f"{elapsed:.2f} | {len(events) / elapsed:,.0f} | {ceiling / elapsed:.3f} |")
    print(f"({incidents} incident events)")


def latency(spark, config, minutes: int, workdir: Path) -> None:
    cfg = fresh_topics(config, "latency")
    cfg.spark.checkpoint_location = workdir / "latency"
    start_ts = int(time.time() * 1000) + 5_000
    jobs = [simulator.simulate_job(name, 3000, i, minutes * 60_000, cluster="bench", start_ts=start_ts)
            for i, name in enumerate(simulator.CATALOGUE)]
    events = list(simulator.merged_events(jobs))
    job = start_detection(spark, cfg, ChampionCache(cfg))
    time.sleep(max(0.0, (start_ts - time.time() * 1000) / 1000))
    publisher = threading.Thread(target=publish_to_kafka, args=(events, cfg), kwargs={"speed": 1.0})
    publisher.start()
    publisher.join()
    time.sleep(60)  # the last events wait out the lateness, then a trigger and a batch
    job.stop()
    consumer = kafka_clients.make_consumer(cfg.kafka.bootstrap_servers, cfg.kafka.client_kwargs())
    records = kafka_clients.read_records(consumer, cfg.topics.incidents)
    consumer.close()
    lags = np.array([(r.timestamp - json.loads(r.value)["updated_at"]) / 1000.0 for r in records])
    print(f"\nlatency: {len(jobs)} jobs in real time for {minutes} min, {len(events)} events, "
          f"trigger {cfg.spark.trigger_interval}, lateness {cfg.features.lateness_s:g}s")
    if len(lags):
        print(f"event time -> incident on the topic over {len(lags)} incident events: p50 {np.percentile(lags, 50):.1f}s, "
              f"p99 {np.percentile(lags, 99):.1f}s, max {lags.max():.1f}s")
    else:
        print("no incident events: nothing to measure")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=60, help="event time per job for the throughput run")
    parser.add_argument("--latency-minutes", type=int, default=6, help="real time for the latency run (0: skip)")
    args = parser.parse_args()
    base = load_config()
    ChampionCache(base).require()  # say so before starting anything
    with tempfile.TemporaryDirectory() as tmp:
        config = base.model_copy(deep=True)
        config.kafka.bootstrap_servers = f"127.0.0.1:{free_port()}"
        config.state_dir = Path(tmp)
        config.features.offline_path = Path(tmp) / "feature_store"
        config.detection.metrics_file = Path(tmp) / "sentinel.prom"
        config.stack.start_mlflow_server = False
        stack = EmbeddedStack(config)
        stack.up(mlflow=False)
        try:
            print(f"machine: {machine()}")
            spark = build_spark(config, "bench")
            throughput(spark, config, args.minutes, Path(tmp))
            if args.latency_minutes:
                latency(spark, config, args.latency_minutes, Path(tmp))
        finally:
            stack.down()


if __name__ == "__main__":
    main()
