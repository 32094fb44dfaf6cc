"""The offline store's layout, the backfill, and point-in-time correct training data."""

from __future__ import annotations

import json
from datetime import date

from pyspark.sql import Row

from feature_store import offline_store
from feature_store.definitions import feature_row_schema
from feature_store.job_features import features_for_events
from pipelines import simulator

DAY = 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def feature_rows(spark, rows):
    """A feature frame from a few hand-made rows (unspecified features null)."""
    names = feature_row_schema().fieldNames()
    full = [{**dict.fromkeys(names), "is_late": False, "trigger_kind": "checkpoint", **r} for r in rows]
    return spark.createDataFrame([Row(**{n: r[n] for n in names}) for r in full], feature_row_schema())


def test_write_partitions_by_date_and_read_prunes_by_time(spark, tmp_path):
    rows = [{"cluster": "c", "job_id": "j", "ts": T0 + d * DAY + 5, "state_size_bytes": float(d)} for d in range(3)]
    offline_store.write_features(feature_rows(spark, rows), tmp_path / "store")
    partitions = sorted(p.name for p in (tmp_path / "store").iterdir() if p.name.startswith("date="))
    assert partitions == ["date=2026-01-01", "date=2026-01-02", "date=2026-01-03"]
    middle = offline_store.read_features(spark, tmp_path / "store", start_ts=T0 + DAY, end_ts=T0 + 2 * DAY)
    assert [(r.ts, r.date) for r in middle.collect()] == [(T0 + DAY + 5, date(2026, 1, 2))]
    # Rewriting a day replaces it and keeps the others.
    offline_store.write_features(feature_rows(spark, [{"cluster": "c", "job_id": "j", "ts": T0 + 7, "state_size_bytes": 9.0}]),
                                 tmp_path / "store")
    everything = offline_store.read_features(spark, tmp_path / "store")
    assert sorted((r.ts, r.state_size_bytes) for r in everything.collect()) == [
        (T0 + 7, 9.0), (T0 + DAY + 5, 1.0), (T0 + 2 * DAY + 5, 2.0)]


def test_backfill_from_event_files_gives_the_batch_definition(spark, tmp_path):
    job = simulator.simulate_job("leak_seed000", seed=1)
    path = tmp_path / "events.jsonl"
    simulator.write_jsonl(path, job.events)
    written = offline_store.backfill(spark, [path], tmp_path / "store")
    expected = features_for_events(job.events)
    assert written == len(expected)
    stored = {(r.vertex_id, r.ts): r.state_rel_slope_per_h
              for r in offline_store.read_features(spark, tmp_path / "store").collect()}
    assert stored == {(r["vertex_id"], r["ts"]): r["state_rel_slope_per_h"] for r in expected}


def test_labels_are_point_in_time_and_localised(spark, tmp_path):
    truth = [{"cluster": "c", "job_id": "j1", "job_name": "a", "scenario": "leak_linear", "family": "state_leak",
              "start_ts": T0, "end_ts": T0 + 100,
              "faults": [{"family": "state_leak", "onset_ts": T0 + 50, "vertex_id": "v-leaky", "vertex_name": "W",
                          "subtask_index": None, "description": ""}]},
             {"cluster": "c", "job_id": "j2", "job_name": "b", "scenario": "healthy_steady", "family": "healthy",
              "start_ts": T0, "end_ts": T0 + 100, "faults": []},
             {"cluster": "c", "job_id": "j3", "job_name": "c", "scenario": "lab_leak_fixed", "family": "state_leak",
              "start_ts": T0, "end_ts": T0 + 100,
              "faults": [{"family": "state_leak", "onset_ts": T0, "vertex_id": "v-leaky", "vertex_name": "W",
                          "subtask_index": None, "description": "fixed at 60", "end_ts": T0 + 60}]}]
    path = tmp_path / "truth.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in truth))
    rows = [{"cluster": "c", "job_id": "j1", "vertex_id": vid, "ts": T0 + t}
            for t in (10, 50, 90) for vid in (None, "v-leaky", "v-other")]
    rows += [{"cluster": "c", "job_id": "j3", "vertex_id": "v-leaky", "ts": T0 + t} for t in (10, 59, 60, 90)]
    rows += [{"cluster": "c", "job_id": "j2", "vertex_id": None, "ts": T0 + 90},
             {"cluster": "c", "job_id": "unlabelled", "vertex_id": None, "ts": T0 + 90}]
    labelled = offline_store.label_features(feature_rows(spark, rows), offline_store.read_ground_truth(spark, [path]))
    got = {(r.job_id, r.vertex_id, r.ts - T0): (r.label, r.onset_ts) for r in labelled.collect()}
    assert got == {
        ("j1", None, 10): ("healthy", None), ("j1", "v-leaky", 10): ("healthy", None), ("j1", "v-other", 10): ("healthy", None),
        ("j1", None, 50): ("state_leak", T0 + 50), ("j1", "v-leaky", 50): ("state_leak", T0 + 50),
        ("j1", "v-other", 50): ("healthy", None),
        ("j1", None, 90): ("state_leak", T0 + 50), ("j1", "v-leaky", 90): ("state_leak", T0 + 50),
        ("j1", "v-other", 90): ("healthy", None),
        ("j2", None, 90): ("healthy", None),
        # A fault that ends (a fixed leak) labels its rows up to the fix, not after it.
        ("j3", "v-leaky", 10): ("state_leak", T0), ("j3", "v-leaky", 59): ("state_leak", T0),
        ("j3", "v-leaky", 60): ("healthy", None), ("j3", "v-leaky", 90): ("healthy", None),
    }


def test_as_of_join_never_takes_features_from_the_future(spark):
    features = feature_rows(spark, [
        {"cluster": "c", "job_id": "j", "vertex_id": None, "ts": T0 + 10, "state_size_bytes": 1.0},
        {"cluster": "c", "job_id": "j", "vertex_id": None, "ts": T0 + 20, "state_size_bytes": 2.0},
        {"cluster": "c", "job_id": "j", "vertex_id": "v", "ts": T0 + 15, "state_size_bytes": 7.0},
    ])
    entities = spark.createDataFrame(
        [("c", "j", None, T0 + 5, "before"), ("c", "j", None, T0 + 10, "at"), ("c", "j", None, T0 + 19, "between"),
         ("c", "j", None, T0 + 99, "after"), ("c", "j", "v", T0 + 16, "vertex")],
        "cluster string, job_id string, vertex_id string, ts long, tag string")
    joined = {r.tag: (r.feature_ts, r.state_size_bytes)
              for r in offline_store.as_of_join(entities, features).collect()}
    assert joined == {"before": (None, None), "at": (T0 + 10, 1.0), "between": (T0 + 10, 1.0),
                      "after": (T0 + 20, 2.0), "vertex": (T0 + 15, 7.0)}


def test_training_set_from_a_simulated_dataset(spark, tmp_path):
    simulator.write_dataset(tmp_path / "ds", ["leak_linear", "healthy_steady"], jobs_per_scenario=3, seed=6,
                            duration_ms=30 * 60_000)
    events, truths = offline_store.dataset_files(tmp_path / "ds")
    offline_store.backfill(spark, events, tmp_path / "store")
    rows = offline_store.training_set(spark, tmp_path / "store", truths).collect()
    truth = {t["job_id"]: t for path in truths for t in simulator.read_jsonl(path)}
    assert {r.job_id for r in rows} == set(truth)
    for r in rows:
        faults = truth[r.job_id]["faults"]
        if r.vertex_id is None and faults and r.ts >= faults[0]["onset_ts"]:
            assert r.label == "state_leak" and r.onset_ts == faults[0]["onset_ts"]
        elif not faults or r.ts < faults[0]["onset_ts"]:
            assert r.label == "healthy" and r.onset_ts is None
    assert {r.label for r in rows} == {"healthy", "state_leak"}
    # The store remembers what it was computed from: retraining skips an unchanged dataset, not a changed one.
    assert offline_store.backfilled_from(tmp_path / "store", events, offline_store.DEFAULT_IDLE_TIMEOUT_MS)
    assert not offline_store.backfilled_from(tmp_path / "store", events, 60_000)
    with open(events[0], "a") as more:
        more.write("\n")
    assert not offline_store.backfilled_from(tmp_path / "store", events, offline_store.DEFAULT_IDLE_TIMEOUT_MS)


def test_a_folder_without_a_manifest_is_not_a_dataset(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="not a dataset folder"):
        offline_store.dataset_files(tmp_path)


def test_the_feature_reference_in_docs_is_current():
    from feature_store.definitions import markdown_table
    from tests.conftest import PROJECT_ROOT

    assert markdown_table() in (PROJECT_ROOT / "docs" / "FEATURES.md").read_text()


def test_the_live_feature_log_lands_in_the_store_like_a_backfill(spark, tmp_path):
    """The detection job's writer: a file per micro-batch, partition and date (here a batch of
    two partitions across midnight); a re-run batch replaces its own files."""
    import pyarrow as pa

    from pipelines.detection.flink_job import feature_frame
    from pipelines.detection.outputs import FEATURE_ROW_ARROW_SCHEMA

    job = simulator.simulate_job("backpressure_slow_operator", seed=3, duration_ms=15 * 60_000,
                                 start_ts=T0 + DAY - 3 * 60_000)
    expected = features_for_events(job.events)
    frame = feature_frame(expected)
    half = len(frame) // 2
    store = tmp_path / "store"
    offline_store.append_feature_log(frame.iloc[:half], store, 7, part=0)
    second = pa.Table.from_pandas(frame.iloc[half:].loc[:, FEATURE_ROW_ARROW_SCHEMA.names],
                                  schema=FEATURE_ROW_ARROW_SCHEMA, preserve_index=False)
    offline_store.append_feature_log(second, store, 7, part=1)
    offline_store.append_feature_log(frame.iloc[:half], store, 7, part=0)  # the batch run again
    assert sorted(p.name for p in (store / "date=2026-01-02").iterdir()) == [
        "live-batch-000000000007-00000.parquet", "live-batch-000000000007-00001.parquet"]
    rows = offline_store.read_features(spark, store).collect()
    logged = {(r.vertex_id, r.ts): r.busy_max for r in rows}
    assert len(rows) == len(logged) == len(expected)  # no row twice
    assert logged == {(r["vertex_id"], r["ts"]): r["busy_max"] for r in expected}
    assert {r.date.isoformat() for r in rows} == {"2026-01-01", "2026-01-02"}
