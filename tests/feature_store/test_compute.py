"""The Spark batch path is the Python definition, for events in the order they arrived."""

from __future__ import annotations

import json
import math

from pyspark.sql import functions as F

from feature_store.compute import batch_features, event_frame
from feature_store.definitions import FEATURE_NAMES
from feature_store.job_features import features_for_events
from pipelines import simulator
from tests.helpers.events import as_a_collector_reports


def keyed(rows):
    return {(r["job_id"], r["vertex_id"], r["ts"], r["trigger_kind"]): r for r in rows}


def assert_same_features(actual: dict, expected: dict):
    assert set(actual) == set(expected)
    for key, row in expected.items():
        for name in FEATURE_NAMES:
            a, b = actual[key][name], row[name]
            if b is None or (isinstance(b, float) and math.isnan(b)):
                assert a is None or (isinstance(a, float) and math.isnan(a)), (key, name, a)
            else:
                assert a == b, (key, name, a, b)


def test_the_spark_batch_path_is_the_python_definition_in_arrival_order(spark):
    jobs = [simulator.simulate_job(name, seed=2, index=i, duration_ms=20 * 60_000)
            for i, name in enumerate(["leak_linear", "skew_join_alignment", "checkpoint_storage_errors"])]
    arriving = as_a_collector_reports(list(simulator.merged_events(jobs)))
    expected = features_for_events(arriving)
    in_time_order = features_for_events(sorted(arriving, key=lambda e: e["ts"]))
    assert keyed(expected).keys() == keyed(in_time_order).keys()
    assert expected != in_time_order  # the order counts: a checkpoint sees the samples that came before it
    lines = spark.createDataFrame([(json.dumps(e), n) for n, e in enumerate(arriving)], "value string, n long")
    frame = event_frame(lines.repartition(3), order=F.col("n"))  # scattered, but ordered by its arrival
    assert_same_features(keyed(r.asDict() for r in batch_features(frame).collect()), keyed(expected))


def test_event_files_are_read_in_their_order(spark, tmp_path):
    from feature_store.offline_store import read_event_files

    job = simulator.simulate_job("backpressure_slow_operator", seed=4, duration_ms=10 * 60_000)
    arriving = as_a_collector_reports(job.events)
    half = len(arriving) // 2
    simulator.write_jsonl(tmp_path / "a.jsonl", arriving[:half])
    simulator.write_jsonl(tmp_path / "b.jsonl", arriving[half:])
    rows = batch_features(read_event_files(spark, [tmp_path / "a.jsonl", tmp_path / "b.jsonl"])).collect()
    assert_same_features(keyed(r.asDict() for r in rows), keyed(features_for_events(arriving)))
