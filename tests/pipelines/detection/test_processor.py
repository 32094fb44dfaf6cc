"""The detection job's stateful stage on a real broker and Spark: it logs the batch definition's
features for the events in the order they arrived, counts what it cannot use, and keeps state
for live jobs only."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from feature_store.definitions import FEATURE_NAMES
from feature_store.job_features import features_for_events
from feature_store.offline_store import read_features
from pipelines import simulator
from pipelines.detection.champions import ChampionCache
from pipelines.detection.flink_job import replay
from pipelines.detection.job import DETECTION_QUERY, start_detection
from pipelines.detection.spark_state import state_partitions
from pipelines.io.kafka_stream import process_all_published
from tests.helpers.events import as_a_collector_reports
from tests.helpers.detection_job import fleet, key, publish, read_topic, write_jsonl

SEED = 11


def run_in_chunks(spark, config, chunks):
    """The job on a processing-time trigger, caught up after each chunk is published; returns
    the running job's sinks and every progress of its query."""
    job = start_detection(spark, config, ChampionCache(config))
    try:
        for chunk in chunks:
            publish(config, chunk)
            process_all_published(job.query, config, config.topics.input)
        progress = job.query.recentProgress
    finally:
        job.stop()
    return job.sinks, progress


def logged_features(spark, config) -> dict:
    rows = read_features(spark, config.offline_store / "live").collect()
    keyed = {(r.job_id, r.vertex_id, r.ts, r.trigger_kind): r.asDict() for r in rows}
    assert len(keyed) == len(rows)  # no row twice
    return keyed


@pytest.mark.parametrize("reads", ["parsed states kept", "every state read back"])
def test_the_live_job_logs_the_batch_features_of_what_arrived_and_replay_gives_its_incidents(
        spark, detection_config, tmp_path, reads):
    config = detection_config
    if reads == "every state read back":
        # No state kept parsed by the workers, all jobs in one bucket: the bucket's map read at once.
        config.detection.state_cache_jobs, config.detection.state_buckets = 0, 1
    jobs = fleet(["leak_linear", "backpressure_slow_operator", "skew_hot_key", "healthy_steady"], SEED, 40)
    arriving = as_a_collector_reports(list(simulator.merged_events(jobs)))
    thirds = len(arriving) // 3
    sinks, _ = run_in_chunks(spark, config, [arriving[:thirds], arriving[thirds:2 * thirds], arriving[2 * thirds:]])
    expected = {(r["job_id"], r["vertex_id"], r["ts"], r["trigger_kind"]): r for r in features_for_events(arriving)}
    logged = logged_features(spark, config)
    # What differs, not pytest's diff of the two key sets: thousands of lines, quadratic to diff.
    # (Sorted as text: a job-level row's vertex_id is None, which does not compare with a str.)
    missing = sorted(expected.keys() - logged.keys(), key=str)
    extra = sorted(logged.keys() - expected.keys(), key=str)
    assert not missing and not extra, (f"{len(missing)} rows not logged, first {missing[:5]}; "
                                       f"{len(extra)} rows logged but not expected, first {extra[:5]}")
    for row_key, row in expected.items():
        for name in FEATURE_NAMES:
            a, b = logged[row_key][name], row[name]
            assert (a == b) or (b is None and (a is None or math.isnan(a))), (row_key, name, a, b)
    assert sinks.late == {}
    published = read_topic(config, config.topics.incidents)
    assert {i["family"] for i in published if i["event"] == "opened"} >= {"state_leak", "backpressure", "skew"}
    assert sinks.incidents_published == len(published)
    # The replay of the same records in the same order: the same incident events, whatever the micro-batches.
    expected_incidents = replay(config, [write_jsonl(tmp_path / "arrived.jsonl", arriving)],
                                ChampionCache(config).require()).incidents
    assert sorted(map(key, published)) == sorted(map(key, expected_incidents))


def test_late_events_are_counted_not_silently_lost(spark, detection_config):
    """Three ways to be late: behind the job's latest event by more than the allowed lateness,
    out of order in its stream, behind the whole input's watermark (by more than the sources'
    delay). Each is counted by its reason; none reaches the features."""
    config = detection_config
    config.features.max_source_delay_s = 120.0
    (job,) = fleet(["healthy_steady"], SEED, 10)
    events = job.events
    last = events[-1]["ts"]
    checkpoint = next(e for e in reversed(events) if e["kind"] == "checkpoint")
    sample = next(e for e in reversed(events) if e["kind"] == "vertex_metrics")
    behind_job = {**checkpoint, "checkpoint_id": checkpoint["checkpoint_id"] + 1000, "ts": last - 60_000,
                  "trigger_ts": last - 61_000}
    out_of_order = {**sample, "ts": sample["ts"] - 1}
    behind_input = {**checkpoint, "checkpoint_id": checkpoint["checkpoint_id"] + 2000, "ts": last - 5 * 60_000,
                    "trigger_ts": last - 5 * 60_000 - 1000}
    sinks, progress = run_in_chunks(spark, config, [events, [behind_job, out_of_order, behind_input]])
    assert sinks.late == {"late": 1, "out_of_order": 1, "behind_watermark": 1}
    # The query's checkpoint names the shuffle partitions its state keys were spread over.
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    assert state_partitions(config.checkpoint_dir(DETECTION_QUERY)) == partitions
    # Counted by the processor, not dropped by Spark unnamed before it.
    dropped = sum(p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in progress if p["stateOperators"])
    assert dropped == 0
    metrics = config.detection.metrics_file.read_text()
    for reason in ("late", "out_of_order", "behind_watermark"):
        assert f'checkpoint_sentinel_late_events_total{{reason="{reason}"}} 1' in metrics
    # The features are those of the events in time, as if the late ones had never come.
    assert logged_features(spark, config).keys() == {(r["job_id"], r["vertex_id"], r["ts"], r["trigger_kind"])
                                                    for r in features_for_events(events)}


def test_state_is_kept_for_live_jobs_not_for_jobs_ever_seen(spark, detection_config, new_topic):
    config = detection_config
    config.topics.input = new_topic(partitions=1)
    config.features.idle_timeout_s = 120.0
    config.features.max_source_delay_s = 30.0
    start = simulator.DEFAULT_START_TS
    # 10 jobs alive at any time, each reporting every 15 s for 5 minutes, then gone for good.
    events = simulator.rotating_job_events(10, 20, 15_000, 48 * 60_000, start_ts=start)
    span = 48 * 60_000
    chunks = [[e for e in events if k * span // 8 <= e["ts"] - start < (k + 1) * span // 8] for k in range(8)]
    job = start_detection(spark, config, ChampionCache(config))
    state_rows = []
    try:
        for chunk in chunks:
            publish(config, chunk)
            process_all_published(job.query, config, config.topics.input)
            state_rows.append(job.query.lastProgress["stateOperators"][0]["numRowsTotal"])
    finally:
        job.stop()
    seen = [len({e["job_id"] for e in events if e["ts"] <= max(c["ts"] for c in chunk)}) for chunk in chunks]
    # Jobs ever seen keep growing; the state stays where it was once the first jobs were forgotten.
    assert seen[-1] > 4 * seen[0], seen
    assert max(state_rows[2:]) <= 1.3 * state_rows[1], (state_rows, seen)
    assert state_rows[-1] < 0.5 * seen[-1], (state_rows, seen)  # a few rows per *live* job only
    # Every row of every job was logged before its job was forgotten.
    logged = logged_features(spark, config)
    assert len(logged) == len(features_for_events(events))


def test_a_worker_reuses_a_parsed_state_only_while_the_store_holds_the_version_it_wrote(collector):
    from pipelines.detection.flink_job import FlinkJobState
    from pipelines.detection.processor import _ParsedStates

    parsed, job = _ParsedStates(collector), FlinkJobState()
    parsed.keep("a", 7, job, limit=2)
    assert parsed.take("a", 7) is job
    # Taken out while a batch uses it: a batch that fails before writing leaves nothing behind.
    assert parsed.take("a", 7) is None
    parsed.keep("a", 8, job, limit=2)
    collector.task_started()
    assert parsed.take("a", 9) is None  # another worker wrote it since
    assert parsed.take("a", 8) is None  # ... and the stale copy is gone
    assert [kept for _, kept in collector.garbage] == [job]  # to be freed between tasks
    collector.release()
    assert collector.garbage  # not while the task runs
    collector.task_ended().cancel()
    collector.release()
    assert collector.garbage == []
    for name, version in (("a", 1), ("b", 2), ("c", 3)):
        parsed.keep(name, version, FlinkJobState(), limit=2)
    assert parsed.take("a", 1) is None and parsed.take("b", 2) is not None  # the least recently written went
    parsed.keep("d", 4, FlinkJobState(), limit=0)
    assert parsed.take("d", 4) is None  # 0: nothing kept


def test_the_input_is_keyed_by_job_with_the_event_time_of_its_top_level_ts(spark):
    """What Spark reads before the shuffle (the job from the key, the event time by a pattern
    where it can and by the JSON path where it cannot) agrees with a JSON parser on every shape
    of record, and a "ts" that is no integer is a null event time, not a failed micro-batch."""
    import json
    import re
    import time

    from pyspark.sql import functions as F

    from pipelines.detection.processor import detection_input
    from pipelines.detection.validation import EARLIEST_TS

    ts, job = 1767225613500, "0123456789abcdef0123456789abcdef"
    event = {"schema_version": 1, "kind": "job_status", "cluster": "c1", "job_id": job, "job_name": "n", "ts": ts}
    values = [
        json.dumps(event, separators=(",", ":")),  # as the collector writes it
        json.dumps(event),  # spaces after the separators
        '{ "ts" : %d }' % ts,
        '{"vertices": [{"ts": 5}], "ts": %d}' % ts,  # behind a nested value: the JSON path
        '{"labels": {"ts": 5}, "ts": %d}' % ts,
        '{"job_name": "a \\"ts\\": 5 b", "ts": %d}' % ts,  # an escaped quote before it
        '{"job_name": "x", "ts": %d.0}' % ts, '{"ts": 1.5e12}', '{"ts": "soon"}', '{"ts": null}',
        '{"ts": 99999999999999999999}', '{"ts": 1767225613}', '{"ts": -1}', '{"cluster": "c2"}',
        "not json", None,
        # Ahead of the clock: within the allowed skew (5 minutes here), and an hour ahead.
        '{"ts": %d}' % (time.time() * 1000 + 60_000), '{"ts": %d}' % (time.time() * 1000 + 3_600_000),
    ]
    keys = [f"c1/{job}", f"a/b/{job}", "bad/record", f"c1/{job.upper()}", None]
    records = [(None if k is None else k.encode(), None if v is None else v.encode(), "in", 0, i * len(keys) + j, None)
               for i, v in enumerate(values) for j, k in enumerate(keys)]
    frame = spark.createDataFrame(records, "key binary, value binary, topic string, partition int, offset long, "
                                           "timestamp timestamp")
    read = {r.offset: r for r in detection_input(frame, 300_000)
            .select("offset", "cluster", "job_id", F.unix_millis("event_time").alias("event_ms")).collect()}
    assert len(read) == len(records)
    for record_key, value, _, _, offset, _ in records:
        try:
            document = json.loads(value)
        except (TypeError, ValueError):
            document = {}
        found = re.fullmatch(r"(.+)/([0-9a-f]{32})", record_key.decode()) if record_key is not None else None
        cluster, job_id = found.groups() if found else (document.get("cluster"), document.get("job_id"))
        plausible = type(document.get("ts")) is int and EARLIEST_TS <= document["ts"] <= time.time() * 1000 + 300_000
        expected = document["ts"] if plausible else None
        row = read[offset]
        assert (row.cluster, row.job_id, row.event_ms) == (cluster, job_id, expected), (record_key, value)


def test_the_python_workers_load_the_champions_before_the_first_batch_or_the_start_stops(spark, detection_config):
    """A stateful task's two Python workers (the processor's, the feature log writer's) per
    shuffle partition: the processor's with the champions the driver resolves, the writer's
    without models or scikit-learn (it scores nothing); a registry the workers cannot load from
    stops the job's start with what it is."""
    import orjson

    from models.registry import ModelUnavailable
    from pipelines.detection.processor import load_models_on_workers

    def maps_scikit_learn(pid: int) -> bool:  # its compiled modules, mapped once imported
        return "/sklearn/" in Path(f"/proc/{pid}/maps").read_text()

    config = detection_config
    champions = {family: [m.name, m.version] for family, m in ChampionCache(config).require().items()}
    workers = load_models_on_workers(spark, config)
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    scoring = [w for w in workers if w["models"] is not None]
    writers = [w for w in workers if w["models"] is None]
    assert len(scoring) == len(writers) == partitions
    assert [orjson.loads(w["models"]) for w in scoring] == [champions] * partitions
    assert all(maps_scikit_learn(w["pid"]) for w in scoring) and not any(maps_scikit_learn(w["pid"]) for w in writers)
    assert not {w["pid"] for w in scoring} & {w["pid"] for w in writers}

    config.mlflow.alias = "nobody"
    with pytest.raises(ModelUnavailable, match=r"Python workers could not load the champions.*no model has the alias "
                                               r"'nobody'"):
        start_detection(spark, config, ChampionCache(detection_config))
    assert not spark.streams.active


def test_a_record_reaches_the_processor_packed_and_unpacks_to_what_was_read(spark):
    """packed_record (Spark) and unpacked_record (the processor) agree on every field, with the
    nulls, separators and bytes that Kafka and a producer can put there."""
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

    from pipelines.detection.processor import packed_record, unpacked_record

    schema = StructType([StructField("cluster", StringType()), StructField("job_id", StringType()),
                         StructField("key", BinaryType()), StructField("value", BinaryType()),
                         StructField("topic", StringType()), StructField("partition", IntegerType()),
                         StructField("offset", LongType()), StructField("kafka_timestamp_ms", LongType())])
    records = [
        ("prod-eu", "0123456789abcdef0123456789abcdef", b"prod-eu/0123456789abcdef0123456789abcdef", b'{"ts":1}',
         "flink.metrics", 2, 17, 1_700_000_000_000),
        ("a:b\ncé", "x:y", b"\x00\xff:\n", b"", "t.1", 0, 0, None),  # separators inside, an empty value
        (None, None, None, None, "t-2", 11, 2**40, -5),  # nothing read: no key, a tombstone
        ("c", "", b"", b"\n\n:" * 1000, "t", 1, 3, 0),
    ]
    packed = spark.createDataFrame(records, schema).select(packed_record().alias("record")).collect()
    for (cluster, job_id, record_key, value, topic, partition, offset, timestamp), row in zip(records, packed):
        got_cluster, got_job_id, record = unpacked_record(bytes(row.record))
        assert (got_cluster, got_job_id) == (cluster, job_id)
        assert (record.key, record.value, record.topic, record.partition, record.offset,
                record.kafka_timestamp_ms) == (record_key, value, topic, partition, offset, timestamp)
    # A cluster name that is not UTF-8 (a record key's bytes) is read the same way every time.
    assert unpacked_record(b"0:1::2:1:0:-1:t\n\xffzq")[:2] == ("\ufffdz", "q")
