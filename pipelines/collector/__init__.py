"""``sentinel collect``: poll Flink's REST API and publish input-contract events to Kafka.

Its parts: :mod:`~pipelines.collector.poller` (one cluster's poll, :class:`ClusterCollector`),
:mod:`~pipelines.collector.service` (every cluster on one event loop, until stopped),
:mod:`~pipelines.collector.shard` (which process polls which job), :mod:`~pipelines.collector.rest`
(Flink's REST client), :mod:`~pipelines.collector.mapping` (Flink's answers as events) and
:mod:`~pipelines.collector.ledger` (what was published, across restarts). The events go out
through :func:`pipelines.io.input_publisher.kafka_publisher`.
"""

from pipelines.collector.poller import CONFIG_REREAD_S, SETTLE_MS, ClusterCollector, PollResult
from pipelines.collector.service import run_collector, run_loop
from pipelines.collector.shard import Shard
from pipelines.io.input_publisher import Publish, kafka_publisher

__all__ = ["CONFIG_REREAD_S", "SETTLE_MS", "ClusterCollector", "PollResult", "Publish",
           "Shard", "kafka_publisher", "run_collector", "run_loop"]
