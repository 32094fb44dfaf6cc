"""The JSON Schemas and the Spark schemas generated from them describe the same documents."""

import copy
import json

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StructType

from pipelines.contracts import DEAD_LETTER, INCIDENT, INPUT, EVENT_KINDS
from pipelines.contracts.examples import example_events

EXAMPLES = list(example_events(30, seed=3))

INCIDENT_EXAMPLE = {
    "schema_version": 1, "incident_id": "inc-5b1c0e", "event": "opened", "family": "state_leak",
    "severity": "critical", "cluster": "prod-eu", "job_id": "a" * 32, "job_name": "sessions",
    "vertex_id": "90bea66de1c231edf33913ecd54406c1", "vertex_name": "CEP", "subtask_index": None,
    "score": 0.97, "model": {"name": "sentinel-state-leak", "version": "3", "alias": "champion"},
    "opened_at": 1_700_000_100_000, "updated_at": 1_700_000_100_000, "resolved_at": None,
    "summary": "State of CEP grows 41%/h with no levelling off; 5 MiB limit in ~40 s",
    "evidence": {"state_size_relative_slope_per_h": 0.41, "recent_state_size_bytes": [11300000, 20900000]},
    "forecast": {"metric": "state_size_bytes", "limit": 5242880, "eta_ms": 40000},
    "forecasts": [{"metric": "state_size_bytes", "limit": 5242880, "limit_source": "config", "limit_ratio": 0.62,
                   "eta_ms": 40000, "eta_low_ms": 31000, "eta_high_ms": 52000, "fitted_over_ms": 300000, "method": "linear_trend"}],
    "runbook": ["Set a state TTL on the CEP operator's keyed state."],
    "labels": {"cluster": "prod-eu", "family": "state_leak", "severity": "critical"},
    # Optional (additive to v1): the effects folded into this incident.
    "symptoms": [{"family": "checkpoint_failure", "first_at": 1_700_000_130_000,
                  "evidence": {"features": {"checkpoint_failed_fraction": 0.25}}}],
    "resolution": "job_gone",
    # Optional (additive to v1): opened on a forecast (a shape example: only checkpoint failures
    # are predicted), and the first failed checkpoint it warned of.
    "predicted": True, "first_failure_at": 1_700_000_130_000, "lead_time_ms": 30_000,
}

DEAD_LETTER_EXAMPLE = {
    "reason": "malformed_json", "error": "Expecting value: line 1 column 1 (char 0)",
    "source_topic": "flink.metrics", "partition": 2, "offset": 981, "kafka_timestamp": 1_700_000_000_000,
    "key": "prod-eu/" + "a" * 32, "key_encoding": "utf-8", "key_sha256": "0" * 64, "value": "not json",
    "value_encoding": "utf-8", "value_bytes": 8, "value_sha256": "1" * 64, "value_truncated": False,
}


def _leaf_paths_of_schema(schema: StructType, prefix: str = "") -> set[str]:
    paths = set()
    for field in schema.fields:
        data_type = field.dataType
        while isinstance(data_type, ArrayType):
            data_type = data_type.elementType
        if isinstance(data_type, StructType):
            paths |= _leaf_paths_of_schema(data_type, f"{prefix}{field.name}.")
        else:
            paths.add(prefix + field.name)
    return paths


def _leaf_paths_of_document(document, prefix: str = "") -> set[str]:
    paths = set()
    for key, value in document.items():
        values = value if isinstance(value, list) else [value]
        nested = [v for v in values if isinstance(v, dict)]
        if nested:
            for item in nested:
                paths |= _leaf_paths_of_document(item, f"{prefix}{key}.")
        else:
            paths.add(prefix + key)
    return paths


def _without_nulls(value):
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def test_examples_satisfy_the_input_contract():
    assert {e["kind"] for e in EXAMPLES} == set(EVENT_KINDS)
    for event in EXAMPLES:
        assert INPUT.errors(event) == []


def test_examples_cover_every_field_of_the_spark_schema():
    # Together with the round trip below, this proves every Spark field exists in the JSON Schema's documents.
    documented = set().union(*(_leaf_paths_of_document(e) for e in EXAMPLES))
    assert _leaf_paths_of_schema(INPUT.spark_schema()) == documented


def test_spark_schema_round_trips_every_example_without_loss(spark):
    df = spark.createDataFrame([(json.dumps(e),) for e in EXAMPLES], "value string")
    back = df.select(F.to_json(F.from_json("value", INPUT.spark_schema())).alias("json")).collect()
    assert [json.loads(row.json) for row in back] == [_without_nulls(e) for e in EXAMPLES]


def test_incident_and_dead_letter_round_trip_through_their_spark_schemas(spark):
    for contract, example in ((INCIDENT, INCIDENT_EXAMPLE), (DEAD_LETTER, DEAD_LETTER_EXAMPLE)):
        assert contract.errors(example) == []
        assert set(contract.field_names()) == set(example)
        row = (
            spark.createDataFrame([(json.dumps(example),)], "value string")
            .select(F.from_json("value", contract.spark_schema()).alias("d"))
            .select("d.*")
            .collect()[0]
            .asDict(recursive=True)
        )
        for key, value in example.items():
            if isinstance(value, dict) and contract is INCIDENT and key in ("evidence", "forecast"):
                # free-form objects are carried as their JSON text
                assert json.loads(row[key]) == value
            elif key == "symptoms":
                assert [{**s, "evidence": json.loads(s["evidence"])} for s in row[key]] == value
            else:
                assert row[key] == value, key


def test_spark_schema_types_follow_the_json_types():
    schema = INPUT.spark_schema()
    assert schema["ts"].dataType.simpleString() == "bigint"
    assert schema["state_size_bytes"].dataType.simpleString() == "bigint"
    assert schema["is_savepoint"].dataType.simpleString() == "boolean"
    subtask = schema["subtasks"].dataType.elementType
    assert subtask["busy_time_ms_per_s"].dataType.simpleString() == "double"
    assert INCIDENT.spark_schema()["labels"].dataType.simpleString() == "map<string,string>"
    assert all(field.nullable for field in schema.fields)


def _broken(change):
    event = copy.deepcopy(next(e for e in EXAMPLES if e["kind"] == "checkpoint"))
    change(event)
    return event


@pytest.mark.parametrize(
    "event, expected",
    [
        (_broken(lambda e: e.update(schema_version=2)), "schema_version: 1 was expected"),
        (_broken(lambda e: e.update(kind="heartbeat")), "kind: 'heartbeat' is not one of"),
        (_broken(lambda e: e.update(job_id="not-a-job-id")), "job_id: 'not-a-job-id' does not match"),
        (_broken(lambda e: e.update(state_size_bytes=-1)), "state_size_bytes: -1 is less than the minimum of 0"),
        (_broken(lambda e: e.pop("ts")), "'ts' is a required property"),
        (_broken(lambda e: e["vertices"][0]["subtasks"][0].update(start_delay_ms="slow")),
         "vertices.0.subtasks.0.start_delay_ms: 'slow' is not of type 'integer', 'null'"),
    ],
)
def test_contract_violations_are_named(event, expected):
    assert any(expected in message for message in INPUT.errors(event)), INPUT.errors(event)
    assert not INPUT.accepts(event)  # the compiled validator refuses what the precise one explains


def _mutations(events, count, seed=0):
    """Each event with one field (or one field of one nested item) dropped or set to a wrong value."""
    import random
    rng = random.Random(seed)
    wrong = [None, "x", "", -1, -1.5, 1.5, 2**70, True, [], {}]
    for _ in range(count):
        event = copy.deepcopy(rng.choice(events))
        target = event
        nested = [v for v in event.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
        if nested and rng.random() < 0.5:
            target = rng.choice(rng.choice(nested))
        key = rng.choice(list(target))
        if rng.random() < 0.3:
            del target[key]
        else:
            target[key] = rng.choice(wrong)
        yield event


def test_the_compiled_validator_and_the_precise_one_give_the_same_verdicts():
    """The job accepts on the compiled validator and explains with the precise one: a record one
    refuses and the other accepts would be a dead letter without a reason, or a bad event let in."""
    assert all(INPUT.accepts(e) for e in EXAMPLES)
    verdicts = [(INPUT.accepts(e), not INPUT.errors(e)) for e in _mutations(EXAMPLES, 3000)]
    assert [v for v in verdicts if v[0] != v[1]] == []
    assert 0 < sum(accepted for accepted, _ in verdicts) < len(verdicts)  # the mutations made both kinds


def test_the_families_are_defined_once_and_the_incident_contract_lists_them():
    from pipelines.families import FAMILIES

    schema = INCIDENT.schema["properties"]
    assert tuple(schema["family"]["enum"]) == FAMILIES
    assert tuple(schema["symptoms"]["items"]["properties"]["family"]["enum"]) == FAMILIES
    without = {k: v for k, v in INCIDENT_EXAMPLE.items() if k != "symptoms"}
    assert INCIDENT.errors(without) == []  # symptoms are optional: v1 consumers see nothing new
    assert INCIDENT.errors({**INCIDENT_EXAMPLE, "symptoms": [{"family": "gc"}]})


def test_the_feedback_contract_lists_the_families_and_the_verdicts_training_reads():
    from models.feedback import VERDICTS
    from pipelines.contracts import FEEDBACK
    from pipelines.families import FAMILIES

    schema = FEEDBACK.schema["properties"]
    assert tuple(schema["family"]["enum"]) == FAMILIES and tuple(schema["verdict"]["enum"]) == VERDICTS
    assert any("verdict" in e for e in FEEDBACK.errors({"schema_version": 1, "verdict": "meh"}))


def test_unknown_fields_are_ignored_by_readers():
    event = dict(EXAMPLES[0], producer_hostname="tm-3", extra={"nested": True})
    assert INPUT.errors(event) == []
