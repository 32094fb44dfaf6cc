"""Feature computation: throughput on the stream and in batch, and state against live keys.

Part 1, throughput: a simulated fleet (every scenario, realistic events) goes through the
streaming feature path (Kafka source -> event frame -> transformWithState) and the batch
path (applyInPandas) on ``local[2]``; prints input events/s and feature rows/s.

Part 2, bounded state: seed 001's key rotation with Flink jobs as the keys: 8,192 jobs alive
at any time, each reporting twice 10 minutes apart and then never again, replaced at once. The
stream runs in 10-minute slices of event time; after each slice it prints the state store's
rows next to the live jobs and the jobs ever seen.

Usage: ``.venv/bin/python benchmarks/features.py [--live-jobs 8192] [--fleet 48]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from benchmarks.kafka_io import machine  # noqa: E402
from feature_store.compute import batch_features, event_frame, stream_features  # noqa: E402
from feature_store.job_features import features_for_events  # noqa: E402
from infra.embedded_stack import EmbeddedStack, free_port  # noqa: E402
from pipelines import simulator  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.io import kafka_clients  # noqa: E402
from pipelines.io.kafka_stream import read_kafka_stream  # noqa: E402
from pipelines.simulator.publish import publish_to_kafka  # noqa: E402
from pipelines.spark_session import build_spark  # noqa: E402


def run_slices(spark, config, topic, slices, checkpoint, idle_timeout_ms, lateness_ms=30_000):
    features = stream_features(event_frame(read_kafka_stream(spark, config, topic)), lateness_ms, idle_timeout_ms)
    query = (features.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(processingTime="1 second").start())
    cfg = config.model_copy(deep=True)
    cfg.topics.input = topic
    results = []
    try:
        for events in slices:
            publish_to_kafka(events, cfg)
            started = time.perf_counter()
            query.processAllAvailable()
            elapsed = time.perf_counter() - started  # the data batches
            time.sleep(1.5)  # let the no-data batch fire the timers of the advanced watermark
            query.processAllAvailable()
            progress = [p for p in query.recentProgress]
            state = next((p["stateOperators"][0] for p in reversed(progress) if p["stateOperators"]), {})
            results.append((events, elapsed, state.get("numRowsTotal"), state.get("memoryUsedBytes")))
        rows_out = sum(p["numInputRows"] for p in query.recentProgress)
    finally:
        query.stop()
    return results, rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live-jobs", type=int, default=8192)
    parser.add_argument("--slices", type=int, default=9, help="10-minute slices of event time for part 2")
    parser.add_argument("--fleet", type=int, default=48)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as state:
        config = load_config(environ={"SENTINEL_STATE_DIR": state,
                                      "SENTINEL_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"})
        stack = EmbeddedStack(config)
        stack.up(mlflow=False)
        try:
            kafka_clients.ensure_topics(config.kafka.bootstrap_servers, config.kafka.client_kwargs(),
                                        ["fleet", "rotation"], 1)
            spark = build_spark(config, "bench-features")
            spark.conf.set("spark.sql.shuffle.partitions", "2")

            # --- part 1: throughput on a realistic fleet -------------------------------------
            jobs = simulator.fleet_jobs(args.fleet, simulator.parse_mix(list(simulator.CATALOGUE)), seed=9,
                                   duration_ms=30 * 60_000)
            events = list(simulator.merged_events(jobs))
            expected_rows = len(features_for_events(events))
            results, _ = run_slices(spark, config, "fleet", [events], f"{state}/ck-fleet", 30 * 60_000)
            stream_s = sum(r[1] for r in results)
            frame = event_frame(spark.createDataFrame([(json.dumps(e),) for e in events], "value string")).cache()
            frame.count()
            started = time.perf_counter()
            batch_rows = batch_features(frame).count()
            batch_s = time.perf_counter() - started

            # --- part 2: state against live and ever-seen jobs --------------------------------
            slice_ms = 10 * 60_000
            rotation = simulator.rotating_job_events(args.live_jobs, 2, slice_ms, args.slices * slice_ms)
            start = simulator.DEFAULT_START_TS
            rot_slices = [[e for e in rotation if k * slice_ms <= e["ts"] - start < (k + 1) * slice_ms]
                          for k in range(args.slices)]
            rot_results, _ = run_slices(spark, config, "rotation", rot_slices, f"{state}/ck-rot", 15 * 60_000)
            spark.stop()
        finally:
            stack.down()

    print(f"machine: {machine()}\n")
    print(f"Part 1: {args.fleet} simulated jobs x 30 min, every scenario: {len(events)} events, "
          f"{expected_rows} feature rows (batch definition)\n")
    print("| path | events | seconds | events/s | feature rows/s |")
    print("|---|---:|---:|---:|---:|")
    print(f"| stream (transformWithState, one trigger) | {len(events)} | {stream_s:.1f} | "
          f"{len(events) / stream_s:,.0f} | {expected_rows / stream_s:,.0f} |")
    print(f"| batch (applyInPandas) | {len(events)} | {batch_s:.1f} | {len(events) / batch_s:,.0f} | "
          f"{batch_rows / batch_s:,.0f} |")
    print(f"\nPart 2: {args.live_jobs} live jobs rotating (2 events 10 min apart, then gone), idle timeout 15 min\n")
    print("| event time | events in slice | seconds | events/s | jobs ever seen | live jobs | state rows | state rows per live job |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    seen: set[str] = set()
    for k, (slice_events, elapsed, rows, _) in enumerate(rot_results):
        seen |= {e["job_id"] for e in slice_events}
        print(f"| {(k + 1) * 10} min | {len(slice_events)} | {elapsed:.1f} | {len(slice_events) / elapsed:,.0f} | "
              f"{len(seen)} | {args.live_jobs} | {rows} | {rows / args.live_jobs:.2f} |")


if __name__ == "__main__":
    main()
