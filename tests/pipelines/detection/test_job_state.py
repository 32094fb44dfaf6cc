"""Stored job states by version (:mod:`pipelines.detection.job_state`): a state and a checkpoint
written before states had a version (``tests/fixtures/state_v1``, made by its
``make_fixture.py`` with the code of that time) are read and resumed with their features and
open incidents, and what this code cannot read stops the job with what it is."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import orjson
import pytest

from feature_store.definitions import FEATURE_NAMES
from feature_store.job_features import JobFeatureState, features_for_events
from feature_store.offline_store import read_features
from pipelines.detection.flink_job import FlinkJobState
from pipelines.detection.job import DETECTION_QUERY
from pipelines.detection.job_state import GROWTH_BUFFERS, STATE_VERSION, StoredStateError, decode, encode, migrate
from pipelines.detection.spark_state import relocate_checkpoint
from tests.helpers.detection_job import publish, read_topic

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "state_v1"


def v1_blob() -> bytes:
    return (FIXTURE / "leak_job_state.v1.json").read_bytes()


def test_a_version_1_state_migrates_to_the_current_layout_its_growth_history_rebuilt():
    stored = orjson.loads(v1_blob())
    assert "version" not in stored  # as the code before versions wrote it
    current = migrate(orjson.loads(v1_blob()))
    assert current["version"] == STATE_VERSION and current["policy"] == stored["policy"]
    assert {k: current["machine"][k] for k in stored["machine"]} == stored["machine"]
    # The growth test's buffers (version 3), from the checkpoints the stored buffers hold.
    machine = current["machine"]
    times = {e[0] for e in stored["machine"]["completed_long"] + stored["machine"]["completed"]}
    assert machine["trajectory"] and {e[0] for e in machine["trajectory"]} <= times
    assert machine["growth_window"][-1][0] == max(times) and len(machine["growth_window"]) >= 10
    assert machine["durations"] and machine["durations"][-1][0] == stored["machine"]["checkpoints"][-1][0]
    job = FlinkJobState.from_bytes(v1_blob())
    assert job.policy == stored["policy"] and job.policy  # the job's open incident among it
    rewritten = orjson.loads(job.to_bytes())
    assert rewritten["version"] == STATE_VERSION and rewritten["policy"] == stored["policy"]
    assert rewritten["machine"] == machine
    # Any other field added to the feature state since version 1 was written: its default.
    defaults = orjson.loads(FlinkJobState().to_bytes())["machine"]
    added = rewritten["machine"].keys() - stored["machine"].keys() - set(GROWTH_BUFFERS)
    assert {k: rewritten["machine"][k] for k in added} == {k: defaults[k] for k in added}
    assert FlinkJobState.from_bytes(job.to_bytes()).to_bytes() == job.to_bytes()


def test_a_field_the_stored_state_lacks_takes_its_default_and_one_it_does_not_know_is_an_error():
    stored = orjson.loads(v1_blob())
    # As a state written before a field existed: the field's default.
    older = {**stored, "machine": {k: v for k, v in stored["machine"].items() if k not in ("long_trend_cache",
                                                                                           "failed_excused")}}
    machine, _ = decode(orjson.dumps(older))
    assert machine.long_trend_cache == {} and machine.failed_excused == JobFeatureState().failed_excused
    assert machine.completed_long == stored["machine"]["completed_long"]
    newer = {**stored, "machine": {**stored["machine"], "a_field_from_the_future": [1, 2]}}
    with pytest.raises(StoredStateError, match=r"fields the feature state does not know: a_field_from_the_future"):
        decode(orjson.dumps(newer))


@pytest.mark.parametrize("layout, error", [
    ({"version": STATE_VERSION + 1}, rf"version {STATE_VERSION + 1}, newer than this code's {STATE_VERSION}"),
    ({"version": "2"}, r"has version '2': not a version"),
    ({"version": 0}, r"has version 0: not a version"),
    ({"extra": 1}, r"of version 1 has the keys \['extra', 'machine', 'policy'\], not \['machine', 'policy'\]"),
    ({"version": 3, "extra": 1}, r"of version 3 has the keys \['extra', 'machine', 'policy', 'version'\]"),
])
def test_a_state_this_code_cannot_read_is_an_error_not_a_fresh_start(layout, error):
    stored = {**orjson.loads(v1_blob()), **layout}
    with pytest.raises(StoredStateError, match=error):
        FlinkJobState.from_bytes(orjson.dumps(stored))
    with pytest.raises(StoredStateError, match=r"a JSON list, not an object"):
        decode(b"[]")


def test_encode_writes_the_current_version():
    job = FlinkJobState.from_bytes(v1_blob())
    assert orjson.loads(encode(job.machine, job.policy)) == orjson.loads(job.to_bytes())


def keyed(rows: list[dict]) -> dict:
    return {(r["job_id"], r["vertex_id"], r["ts"], r["trigger_kind"]): r for r in rows}


def test_a_job_resumes_from_a_checkpoint_of_the_previous_state_version(spark, detection_config, new_topic):
    """The fixture's checkpoint holds two jobs' states as version 1 after the first part of their
    events, the leak's incident open. Resumed on the rest: every feature continues from the
    stored values (the rows are those of the whole stream's batch definition, which a fresh state
    would not give), and the open incident is carried on, not opened again: it is resolved, with
    its stored id, when its job goes silent."""
    from pipelines.detection.champions import ChampionCache
    from pipelines.detection.job import start_detection

    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    assert manifest["state_version"] == 1
    with gzip.open(FIXTURE / "events.jsonl.gz", "rt") as lines:
        events = [json.loads(line) for line in lines]
    read = manifest["events_read"]
    config = detection_config
    # The same records in the same order: each job's at the offsets the checkpoint names.
    config.topics.input = new_topic(partitions=manifest["topic_partitions"])
    for name, value in manifest["features"].items():
        setattr(config.features, name, value)
    config.detection.state_buckets = manifest["detection"]["state_buckets"]
    checkpoint = config.checkpoint_dir(DETECTION_QUERY)
    shutil.copytree(FIXTURE / "checkpoint", checkpoint.local_path())
    # Spark names the operator's schema files by the absolute path they were written at: the job
    # points them at the copy (relocate_checkpoint) before it starts.
    operator_metadata = checkpoint / "state" / "0" / "_metadata" / "v2" / "0"
    assert str(checkpoint) not in operator_metadata.read_text()
    publish(config, events)

    job = start_detection(spark, config, ChampionCache(config), available_now=True)
    try:
        job.await_termination(900)
    finally:
        job.stop()

    idle_ms, lateness_ms = config.features.idle_timeout_ms, int(config.features.lateness_s * 1000)
    whole = keyed(features_for_events(events, idle_ms, lateness_ms))
    before = keyed(features_for_events(events[:read], idle_ms, lateness_ms))
    expected = {k: row for k, row in whole.items() if k not in before}
    logged = {k: r.asDict() for k, r in keyed_rows(read_features(spark, config.offline_store / "live").collect())}
    assert logged.keys() == expected.keys()
    # What the test tells apart: the same events on a fresh state give other features.
    fresh = keyed(features_for_events(events[read:], idle_ms, lateness_ms))
    assert [k for k in expected.keys() & fresh.keys() if expected[k]["job_age_s"] != fresh[k]["job_age_s"]]
    # A state stored before the input-rate history existed has none: the usual input rate is
    # learnt again from the resume on, as a machine stripped of that history at the same point.
    relearnt = keyed(resumed_without(events, read, "input_rates", idle_ms, lateness_ms))
    assert [k for k, row in relearnt.items() if row["records_in_over_usual"] != expected[k]["records_in_over_usual"]]
    for k, row in expected.items():
        for name in FEATURE_NAMES:
            want = relearnt[k][name] if name in RELEARNT_AFTER_RESUME else row[name]
            assert _same(logged[k][name], want), (k, name, logged[k][name], want)
    assert job.sinks.late == {} and job.sinks.dead_letters == 0
    assert f"file:{checkpoint.local_path()}/state/0/_stateSchema/" in operator_metadata.read_text()
    assert relocate_checkpoint(checkpoint) == []  # nothing left to point elsewhere

    (stored,) = [i for i in manifest["published"] if i["event"] == "opened"]
    resumed = [i for i in read_topic(config, config.topics.incidents) if i["job_id"] == stored["job_id"]]
    assert not [i for i in resumed if i["family"] == stored["family"] and i["event"] == "opened"], resumed
    assert [i["incident_id"] for i in resumed if i["event"] == "resolved"] == [stored["incident_id"]], resumed


RELEARNT_AFTER_RESUME = ("records_in_over_usual", "busiest_input_over_usual")


def resumed_without(events: list[dict], read: int, history: str, idle_ms: int, lateness_ms: int) -> list[dict]:
    """The feature rows of ``events[read:]``, each job's machine having consumed its part of
    ``events[:read]`` and then lost the field ``history`` (back to its default)."""
    machines: dict[tuple, JobFeatureState] = {}
    rows: list[dict] = []
    for i, event in enumerate(events):
        if i == read:
            for machine in machines.values():
                setattr(machine, history, type(getattr(machine, history))())
        machine = machines.setdefault((event["cluster"], event["job_id"]), JobFeatureState())
        produced = machine.consume(event, idle_ms, lateness_ms)
        if produced and i >= read:
            rows.extend(produced)
    return rows


def keyed_rows(rows) -> list[tuple]:
    return [((r.job_id, r.vertex_id, r.ts, r.trigger_kind), r) for r in rows]


def _same(a, b) -> bool:
    import math

    return a == b or (b is None and (a is None or math.isnan(a)))
