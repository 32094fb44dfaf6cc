"""How far the alert relay's consumer group has read the incident topic."""

from __future__ import annotations

from kafka import TopicPartition

from pipelines.config import SentinelConfig
from pipelines.io import kafka_clients


def committed_offsets(config: SentinelConfig) -> dict[int, int | None]:
    """The relay group's committed offset of each partition of the incident topic."""
    consumer = kafka_clients.make_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs(),
                                           group_id=config.alert.group_id, enable_auto_commit=False)
    try:
        partitions = kafka_clients.partitions_of(consumer, config.topics.incidents, config.kafka.connect_timeout_s)
        return {p: consumer.committed(TopicPartition(config.topics.incidents, p)) for p in partitions}
    finally:
        consumer.close()


def end_offsets(config: SentinelConfig) -> dict[int, int]:
    """The incident topic's end offset of each partition."""
    consumer = kafka_clients.metadata_consumer(config.kafka.bootstrap_servers, config.kafka.client_kwargs())
    try:
        partitions = kafka_clients.partitions_of(consumer, config.topics.incidents, config.kafka.connect_timeout_s)
        return kafka_clients.latest_offsets(consumer, config.topics.incidents, partitions)
    finally:
        consumer.close()
