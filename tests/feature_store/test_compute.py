"""The batch and streaming paths give the same features; the stream's state stays bounded."""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter

import pytest

from feature_store.compute import batch_features, event_frame, stream_features
from feature_store.definitions import FEATURE_NAMES
from feature_store.job_features import features_for_events
from pipelines import simulator
from pipelines.io.kafka_stream import read_kafka_stream
from pipelines.simulator.publish import publish_to_kafka

LATENESS_MS = 60_000


def keyed(rows):
    return {(r["job_id"], r["vertex_id"], r["ts"]): r for r in rows}


def assert_same_features(actual: dict, expected: dict):
    assert set(actual) == set(expected)
    for key, row in expected.items():
        for name in FEATURE_NAMES:
            a, b = actual[key][name], row[name]
            if b is None or (isinstance(b, float) and math.isnan(b)):
                assert a is None or (isinstance(a, float) and math.isnan(a)), (key, name, a)
            else:
                assert a == pytest.approx(b, rel=1e-9, abs=1e-12), (key, name)


def shuffled_within(events, window_ms, seed=1):
    """Out of order by up to ``window_ms``: events shuffled inside consecutive time buckets."""
    rng = random.Random(seed)
    buckets: dict[int, list] = {}
    for e in events:
        buckets.setdefault(e["ts"] // window_ms, []).append(e)
    out = []
    for bucket in sorted(buckets):
        group = buckets[bucket]
        rng.shuffle(group)
        out.extend(group)
    return out


def records_of(df):
    return [r.asDict() for r in df.collect()]


def run_stream(spark, config, chunks, checkpoint, idle_timeout_ms=30 * 60_000, topic=None):
    """Publish chunk after chunk and let the query catch up after each.

    Returns the output rows, the progress after each chunk, and every progress of the run.
    """
    topic = topic or config.topics.input
    features = stream_features(event_frame(read_kafka_stream(spark, config, topic)), LATENESS_MS, idle_timeout_ms)
    name = f"features_{int(time.time() * 1000)}"
    query = (features.writeStream.format("memory").queryName(name).outputMode("append")
             .option("checkpointLocation", str(checkpoint)).trigger(processingTime="200 milliseconds").start())
    progress, every = [], []
    try:
        for chunk in chunks:
            cfg = config.model_copy(deep=True)
            cfg.topics.input = topic
            publish_to_kafka(chunk, cfg)
            query.processAllAvailable()
            time.sleep(1.0)  # let the no-data batch fire the timers the new watermark expired
            query.processAllAvailable()
            progress.append(query.lastProgress)
        every = query.recentProgress
    finally:
        query.stop()
    return records_of(spark.sql(f"select * from {name}")), progress, every


def test_batch_and_stream_give_the_same_features_on_out_of_order_input(spark, config, tmp_path):
    jobs = [simulator.simulate_job(name, seed=2, index=i, duration_ms=20 * 60_000)
            for i, name in enumerate(["leak_linear", "skew_join_alignment", "checkpoint_storage_errors"])]
    events = list(simulator.merged_events(jobs))
    expected = features_for_events(events)

    # The Spark batch path is the same definition.
    frame = event_frame(spark.createDataFrame([(json.dumps(e),) for e in events], "value string"))
    assert_same_features(keyed(records_of(batch_features(frame))), keyed(expected))

    arriving = shuffled_within(events, 20_000)
    assert arriving != events
    chunks = [arriving[k * len(arriving) // 5:(k + 1) * len(arriving) // 5] for k in range(5)]
    rows, _, every = run_stream(spark, config, chunks, tmp_path / "ck")
    assert not [r for r in rows if r["is_late"]]
    assert sum(p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in every if p["stateOperators"]) == 0
    # While a job reports, its features come out up to its latest event time minus the lateness.
    horizon = {job.truth["job_id"]: job.events[-1]["ts"] - LATENESS_MS for job in jobs}
    emitted = keyed(rows)
    assert_same_features(emitted, {k: r for k, r in keyed(expected).items() if r["ts"] <= horizon[r["job_id"]]})
    assert len(emitted) > 0.9 * len(expected)


def test_events_older_than_the_watermark_are_counted_and_not_consumed(spark, config, tmp_path):
    job = simulator.simulate_job("healthy_steady", seed=4, duration_ms=10 * 60_000)
    stale = dict(job.events[5])  # minutes behind the last event: far beyond the lateness
    rows, _, every = run_stream(spark, config, [job.events, [stale]], tmp_path / "ck")
    # Spark drops rows behind the watermark before the processor sees them, and counts them.
    dropped = sum(p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in every if p["stateOperators"])
    assert dropped == 1
    expected = [r for r in features_for_events(job.events) if r["ts"] <= job.events[-1]["ts"] - LATENESS_MS]
    assert len(rows) == len(expected)
    assert_same_features(keyed(rows), keyed(expected))


def test_state_grows_with_live_jobs_not_with_jobs_ever_seen(spark, config, new_topic, tmp_path):
    start = simulator.DEFAULT_START_TS
    # 10 jobs alive at any time, each reporting every 15 s for ~5 minutes, then gone for good.
    events = simulator.rotating_job_events(10, 20, 15_000, 48 * 60_000, start_ts=start)
    span = 48 * 60_000
    chunks = [[e for e in events if k * span // 8 <= e["ts"] - start < (k + 1) * span // 8] for k in range(8)]
    rows, progress, _ = run_stream(spark, config, chunks, tmp_path / "ck", idle_timeout_ms=2 * 60_000,
                                topic=new_topic(partitions=1))
    state_rows = [p["stateOperators"][0]["numRowsTotal"] for p in progress]
    seen = [len({e["job_id"] for e in events if e["ts"] <= max(c["ts"] for c in chunk)}) for chunk in chunks]
    # Jobs ever seen keep growing; the state stays where it was once the first jobs retired.
    assert seen[-1] > 4 * seen[0], seen
    assert max(state_rows[2:]) <= 1.3 * state_rows[1], (state_rows, seen)
    assert state_rows[-1] < 0.4 * seen[-1], (state_rows, seen)  # a few rows per *live* job only
    # Every job that went quiet was flushed before it was forgotten: all its features came out.
    finished = {e["job_id"] for e in events if e["ts"] <= events[-1]["ts"] - 2 * 60_000 - LATENESS_MS}
    emitted = Counter(r["job_id"] for r in rows if not r["is_late"])
    sent = Counter(e["job_id"] for e in events)
    assert all(emitted[job] == sent[job] for job in finished - {e["job_id"] for e in events[-200:]})
