"""What `sentinel report` reads from a topic: the records published since a time, found by
record timestamp on the real (embedded) broker, whose answer to ``offsets_for_times`` is checked
and bisected where it is wrong, never the topic read from its start."""

from __future__ import annotations

import time

import pytest

from pipelines.io import kafka_clients
from pipelines.reports.topic_reader import read_since

RECORDS = 600  # one a second per partition, the last one a second ago


@pytest.mark.parametrize("partitions", [1, 3])
def test_read_since_returns_exactly_the_records_published_since_the_time(broker_config, new_topic, partitions):
    topic = new_topic(partitions=partitions)
    servers, options = broker_config.kafka.bootstrap_servers, broker_config.kafka.client_kwargs()
    now = int(time.time() * 1000)
    producer = kafka_clients.make_producer(servers, options)
    for partition in range(partitions):
        for i in range(RECORDS):
            producer.send(topic, value=b"%d" % i, partition=partition, timestamp_ms=now - (RECORDS - i) * 1000)
    producer.flush()
    producer.close()
    for back_s in (60, 1, RECORDS + 10):
        start = now - back_s * 1000
        records = read_since(servers, options, topic, start, timeout_s=60)
        expected = min(back_s, RECORDS) * partitions
        assert len(records) == expected, (back_s, len(records))
        assert all(r.timestamp >= start for r in records)
    assert read_since(servers, options, topic, now, timeout_s=60) == []  # nothing since: nothing read
