"""The Kafka source and sink against the real broker and a real Spark session."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from pipelines.io import kafka_clients
from pipelines.io.kafka_source import KafkaPartitionRange, _rate_limited, split_evenly
from pipelines.io.kafka_stream import KAFKA_COLUMNS, kafka_stream_writer, process_all_published, read_kafka_stream
from tests.conftest import PROJECT_ROOT
from tests.pipelines.io.file_sink_driver import start_file_sink


def produce(config, topic: str, count: int, start: int = 0, partition: int | None = None, headers=None):
    """Send ``count`` records valued ``r<i>``; returns {(partition, offset): value} as acknowledged."""
    producer = kafka_clients.make_producer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    futures = [
        (i, producer.send(topic, key=f"k{i % 7}".encode(), value=f"r{i}".encode(), partition=partition,
                          headers=headers))
        for i in range(start, start + count)
    ]
    producer.flush()
    producer.close()
    acked = {}
    for i, future in futures:
        meta = future.get(timeout=10)
        acked[(meta.partition, meta.offset)] = f"r{i}"
    return acked


def run_available_now(df, sink_format: str, checkpoint: Path, **options):
    query = (
        df.writeStream.format(sink_format).options(**options)
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )
    try:
        query.awaitTermination(180)
    finally:
        query.stop()
    return query


def offsets_in_parquet(spark, path: Path) -> list[tuple[int, int, str]]:
    return [(r.partition, r.offset, r.value) for r in spark.read.parquet(str(path)).collect()]


def test_latest_offsets_use_the_fetch_high_watermark(config, new_topic):
    topic = new_topic(partitions=2)
    acked = produce(config, topic, 1000)
    consumer = kafka_clients.metadata_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    expected = {p: max(o for (q, o) in acked if q == p) + 1 for p in (0, 1)}
    assert kafka_clients.latest_offsets(consumer, topic, [0, 1]) == expected
    produce(config, topic, 3, partition=0)
    expected[0] += 3
    assert kafka_clients.latest_offsets(consumer, topic, [0, 1]) == expected
    consumer.close()


def test_latest_offsets_from_known_offsets_skip_list_offsets_and_see_data_loss(config, new_topic):
    topic = new_topic(partitions=2)
    acked = produce(config, topic, 1000)
    consumer = kafka_clients.metadata_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    ends = {p: max(o for (q, o) in acked if q == p) + 1 for p in (0, 1)}
    # From the start, the middle and the very end of each partition: the same ends.
    for known in ({0: 0, 1: 0}, {p: end // 2 for p, end in ends.items()}, ends):
        assert kafka_clients.latest_offsets(consumer, topic, [0, 1], known=known) == ends
    # A known offset past the end (the topic re-created, the broker lost data): the real end, so
    # that the caller sees it is behind what it read, not the offset it passed in.
    beyond = {0: ends[0] + 500, 1: ends[1]}
    assert kafka_clients.latest_offsets(consumer, topic, [0, 1], known=beyond) == ends
    consumer.close()


def test_round_trip_through_source_and_sink_keeps_keys_values_and_headers(spark, config, new_topic, tmp_path):
    source_topic, sink_topic = new_topic(partitions=3), new_topic(partitions=3)
    sent = produce(config, source_topic, 5000, headers=[("trace", b"t-1")])
    df = read_kafka_stream(spark, config, source_topic).select("key", "value", "headers")
    query = (
        kafka_stream_writer(df, config, sink_topic)
        .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    )
    query.awaitTermination(180)
    assert sum(p["numInputRows"] for p in query.recentProgress) == 5000

    consumer = kafka_clients.make_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    received = kafka_clients.read_records(consumer, sink_topic)
    consumer.close()
    assert sorted(r.value.decode() for r in received) == sorted(sent.values())
    assert all(r.key.decode() == f"k{int(r.value.decode()[1:]) % 7}" for r in received)
    assert all(list(r.headers) == [("trace", b"t-1")] for r in received)


def test_rows_have_the_spark_kafka_columns_and_exact_offsets(spark, config, new_topic, tmp_path):
    topic = new_topic(partitions=3)
    sent = produce(config, topic, 1200)
    df = read_kafka_stream(spark, config, topic)
    assert df.columns == KAFKA_COLUMNS
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "binary", "binary", "string", "int", "bigint", "timestamp", "int", "array<struct<key:string,value:binary>>",
    ]
    run_available_now(df.selectExpr("partition", "offset", "cast(value as string) value", "topic", "timestamp"),
                      "parquet", tmp_path / "ck", path=str(tmp_path / "out"))
    rows = spark.read.parquet(str(tmp_path / "out"))
    assert {(p, o): v for p, o, v in offsets_in_parquet(spark, tmp_path / "out")} == sent
    assert {r.topic for r in rows.select("topic").distinct().collect()} == {topic}
    assert rows.filter("timestamp is null or timestamp < timestamp'2020-01-01'").count() == 0


def test_starting_offsets_json_and_latest(spark, config, new_topic, tmp_path):
    topic = new_topic(partitions=3)
    sent = produce(config, topic, 300)
    df = read_kafka_stream(spark, config, topic, starting_offsets='{"0": 5, "1": -2, "2": -1}')
    run_available_now(df.select("partition", "offset", df.value.cast("string").alias("value")),
                      "parquet", tmp_path / "ck1", path=str(tmp_path / "json"))
    expected = {k: v for k, v in sent.items() if (k[0] == 0 and k[1] >= 5) or k[0] == 1}
    assert {(p, o): v for p, o, v in offsets_in_parquet(spark, tmp_path / "json")} == expected

    latest = read_kafka_stream(spark, config, topic, starting_offsets="latest")
    query = run_available_now(latest.select("offset"), "noop", tmp_path / "ck2")
    assert sum(p["numInputRows"] for p in query.recentProgress) == 0


def test_max_offsets_per_trigger_splits_the_backlog_into_batches(spark, config, new_topic, tmp_path):
    topic = new_topic(partitions=3)
    produce(config, topic, 1000)
    df = read_kafka_stream(spark, config, topic, max_offsets_per_trigger=300)
    query = run_available_now(df.select("offset"), "noop", tmp_path / "ck")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 1000
    assert max(sizes) <= 300
    assert len(sizes) == 4


def test_a_batch_is_read_in_tasks_of_about_equal_size(spark, config, new_topic, tmp_path):
    from pyspark.sql import functions as F

    topic = new_topic(partitions=3)
    sent = produce(config, topic, 901)
    cores = spark.sparkContext.defaultParallelism
    for read_tasks, tasks in ((None, cores), (0, 3), (4, 4)):
        config.kafka.read_tasks = read_tasks
        df = read_kafka_stream(spark, config, topic)
        out = tmp_path / f"out{read_tasks}"
        run_available_now(df.select("partition", "offset", df.value.cast("string").alias("value"),
                                    F.spark_partition_id().alias("task")),
                          "parquet", tmp_path / f"ck{read_tasks}", path=str(out))
        assert {(p, o): v for p, o, v in offsets_in_parquet(spark, out)} == sent  # every record once
        sizes = [r["count"] for r in spark.read.parquet(str(out)).groupBy("task").count().collect()]
        assert len(sizes) == tasks, (read_tasks, sizes)
        if read_tasks != 0:
            assert max(sizes) - min(sizes) < tasks, sizes


def test_split_evenly_cuts_and_joins_partition_ranges_in_order():
    ranges = [KafkaPartitionRange("t", 0, 0, 10), KafkaPartitionRange("t", 1, 5, 9), KafkaPartitionRange("t", 2, 3, 10)]
    groups = split_evenly(ranges, 2)
    assert [sum(r.size for r in g) for g in groups] == [11, 10]
    assert groups[0] == [KafkaPartitionRange("t", 0, 0, 10), KafkaPartitionRange("t", 1, 5, 6)]
    assert [(r.partition, o) for g in groups for r in g for o in range(r.start, r.end)] == \
        [(r.partition, o) for r in ranges for o in range(r.start, r.end)]
    assert split_evenly(ranges, 1) == [ranges]
    assert len(split_evenly(ranges, 50)) == 21  # never an empty task
    assert split_evenly([], 3) == []


def test_rate_limit_spreads_rows_by_lag_and_always_progresses():
    start = {"0": 0, "1": 100, "2": 50}
    end = {"0": 600, "1": 400, "2": 50}
    limited = _rate_limited(start, end, 90)
    assert sum(limited[p] - start[p] for p in start) == 90
    assert limited == {"0": 60, "1": 130, "2": 50}  # lags 600:300:0 -> 60:30:0
    assert _rate_limited({"0": 0, "1": 0}, {"0": 1, "1": 1}, 1) in ({"0": 1, "1": 0}, {"0": 0, "1": 1})
    assert _rate_limited(start, end, 10_000) == end


def test_stop_and_restart_on_the_same_checkpoint_while_records_arrive(spark, config, new_topic, tmp_path):
    topic = new_topic(partitions=3)
    sent: dict = {}
    stop_producing = threading.Event()

    def keep_producing():
        i = 0
        while not stop_producing.is_set():
            sent.update(produce(config, topic, 50, start=i))
            i += 50
            time.sleep(0.05)

    producer_thread = threading.Thread(target=keep_producing, daemon=True)
    producer_thread.start()
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    def start_query():
        df = read_kafka_stream(spark, config, topic, max_offsets_per_trigger=400)
        return (
            df.select("partition", "offset", df.value.cast("string").alias("value"))
            .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="300 milliseconds").start()
        )

    try:
        for _ in range(2):
            query = start_query()
            deadline = time.monotonic() + 60
            while len([p for p in query.recentProgress if p["numInputRows"]]) < 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            query.stop()
        query = start_query()
        time.sleep(1)
        stop_producing.set()
        producer_thread.join()
        process_all_published(query, config, topic)
        query.stop()
    finally:
        stop_producing.set()

    read = offsets_in_parquet(spark, out)
    assert len(read) == len({(p, o) for p, o, _ in read}), "a record was read twice"
    assert {(p, o): v for p, o, v in read} == sent
    assert len(sent) > 1000


@pytest.mark.slow
def test_kill_9_mid_batch_then_restart_reads_every_record_once(spark, config, new_topic, tmp_path):
    topic = new_topic(partitions=3)
    sent = produce(config, topic, 3000)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    max_offsets = 500  # records per micro-batch, before the kill and after the restart
    base = [sys.executable, str(Path(__file__).with_name("file_sink_driver.py")),
            "--bootstrap", config.kafka.bootstrap_servers, "--state-dir", str(tmp_path / "state"),
            "--topic", topic, "--checkpoint", str(checkpoint), "--out", str(out), "--max-offsets", str(max_offsets)]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    log = open(tmp_path / "driver.log", "wb")
    driver = subprocess.Popen(base + ["--task-delay-s", "3"], cwd=PROJECT_ROOT, env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Batch 0 committed and batch 1 planned (its offsets logged) but not committed: mid-batch.
        deadline = time.monotonic() + 180
        while not ((checkpoint / "commits" / "0").exists() and (checkpoint / "offsets" / "1").exists()
                   and not (checkpoint / "commits" / "1").exists()):
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the driver never reached batch 1"
            time.sleep(0.1)
        time.sleep(1.0)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert not (checkpoint / "commits" / "1").exists(), "the kill came after batch 1 was committed"
    sent.update(produce(config, topic, 700, start=3000))

    # Restarted in this process's Spark: another JVM, on the same checkpoint.
    restarted = start_file_sink(spark, config, topic, checkpoint, out, max_offsets, available_now=True)
    try:
        assert restarted.awaitTermination(300) and restarted.exception() is None
    finally:
        restarted.stop()
    read = offsets_in_parquet(spark, out)
    assert len(read) == len({(p, o) for p, o, _ in read}), "a record was read twice"
    assert {(p, o): v for p, o, v in read} == sent


def test_unreachable_broker_fails_the_query_with_a_clear_message(spark, config, tmp_path):
    cfg = config.model_copy(deep=True)
    cfg.kafka.bootstrap_servers = "127.0.0.1:9"  # discard port: nothing listens
    cfg.kafka.connect_timeout_s = 2
    started = time.monotonic()
    df = read_kafka_stream(spark, cfg, "anything")
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
    with pytest.raises(StreamingQueryException) as error:
        query.awaitTermination(120)
    query.stop()
    assert "Kafka at 127.0.0.1:9 is unreachable" in str(error.value)
    assert time.monotonic() - started < 120


def test_missing_topic_fails_with_its_name(spark, config, tmp_path):
    cfg = config.model_copy(deep=True)
    cfg.kafka.connect_timeout_s = 3
    df = read_kafka_stream(spark, cfg, "no-such-topic-here")
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
    with pytest.raises(StreamingQueryException, match="no-such-topic-here"):
        query.awaitTermination(120)
    query.stop()


def test_the_broker_probe_tells_a_broker_that_answers_from_one_that_does_not(config):
    class Gauge:
        def __init__(self):
            self.values = []

        def set(self, value):
            self.values.append(value)

    from infra.embedded_stack import free_port

    reachable, contact = Gauge(), Gauge()
    # The configured clients' options as the job passes them (a bootstrap timeout among them).
    probe = kafka_clients.BrokerProbe(config.kafka.bootstrap_servers, config.kafka.client_kwargs(), reachable,
                                      contact, timeout_s=2.0)
    assert probe.probe() and reachable.values == [1] and time.time() - contact.values[-1] < 5
    nobody = kafka_clients.BrokerProbe(f"127.0.0.1:{free_port()}", config.kafka.client_kwargs(), Gauge(), timeout_s=1.0)
    started = time.monotonic()
    assert not nobody.probe() and nobody.reachable_gauge.values == [0] and nobody.last_contact is None
    assert time.monotonic() - started < 10
    probe.start()
    probe.stop()
    assert not probe._thread.is_alive()


def test_a_read_on_a_transport_its_client_closed_is_not_reported_but_one_on_an_open_one_is(caplog):
    # kafka-python's network thread can read just after close() dropped the socket (a race):
    # the same read, forced here, on a real transport closed first and on one left open.
    import socket as socket_module

    from kafka.net.selector import NetworkSelector
    from kafka.net.transport import KafkaTCPTransport

    net, (ours, peer) = NetworkSelector(), socket_module.socketpair()
    try:
        closed_by_its_client = KafkaTCPTransport(net, ours, host="broker")
        closed_by_its_client.close()
        lost_on_its_own = KafkaTCPTransport(net, None, host="broker")
        with caplog.at_level(logging.INFO, logger="kafka.net.transport"):
            caplog.clear()
            assert closed_by_its_client._sock_recv()[1] is not None  # the read did fail
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert lost_on_its_own._sock_recv()[1] is not None
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert len(errors) == 1 and "Error receiving network data" in errors[0].getMessage()
    finally:
        peer.close()
        net.close()


def test_a_request_its_client_cancelled_on_closing_is_not_reported_but_one_that_failed_is(caplog):
    # What kafka.cluster logs when a metadata refresh fails: the close's Cancelled, or a real error.
    from kafka.errors import Cancelled, KafkaConnectionError

    with caplog.at_level(logging.INFO, logger="kafka.cluster"):
        logging.getLogger("kafka.cluster").error("Metadata refresh: failed %s", Cancelled())
        logging.getLogger("kafka.cluster").error("Metadata refresh: failed %s", KafkaConnectionError("refused"))
    assert [r.getMessage() for r in caplog.records] == ["Metadata refresh: failed KafkaConnectionError: refused"]
