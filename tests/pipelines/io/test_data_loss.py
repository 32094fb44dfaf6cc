"""A query whose input topic lost offsets it had not read (the topic re-created under it) stops
with one line that names this project's key and its variable, not Spark's option and plan."""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException

from pipelines.io import kafka_clients
from pipelines.io.kafka_stream import InputDataLost, explain_data_loss, read_kafka_stream


def _send(config, topic: str, count: int) -> None:
    producer = kafka_clients.make_producer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    for i in range(count):
        producer.send(topic, key=b"k", value=f"r{i}".encode(), partition=0)
    producer.flush()
    producer.close()


def _read(spark, config, topic: str, checkpoint) -> None:
    query = (read_kafka_stream(spark, config, topic).writeStream.format("noop")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
    finally:
        query.stop()


def test_a_re_created_topic_stops_the_query_with_one_line_naming_the_key(spark, config, new_topic, tmp_path):
    topic = new_topic(partitions=1)
    _send(config, topic, 50)
    _read(spark, config, topic, tmp_path / "ck")  # the checkpoint has read to offset 50
    admin = kafka_clients.make_admin(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    try:
        admin.delete_topics([topic])
    finally:
        admin.close()
    kafka_clients.ensure_topics(config.kafka.bootstrap_servers, config.kafka.client_kwargs(), [topic], 1)
    _send(config, topic, 5)
    with pytest.raises(StreamingQueryException) as failure:
        _read(spark, config, topic, tmp_path / "ck")
    assert "failOnDataLoss" in str(failure.value)  # the source's own words, with Spark's plan around them

    lost = explain_data_loss(failure.value)
    assert isinstance(lost, InputDataLost)
    message = str(lost)
    assert "\n" not in message and message.startswith("the input topic lost offsets the job had not read: ")
    assert "kafka.fail_on_data_loss: false (SENTINEL_KAFKA__FAIL_ON_DATA_LOSS=false)" in message
    assert topic in message and "failOnDataLoss" not in message and "Plan" not in message


def test_any_other_failure_is_left_as_it_is():
    assert explain_data_loss(RuntimeError("Kafka at 127.0.0.1:9 is unreachable")) is None
