"""The input topic's publisher: input-contract events to Kafka, keyed by their job, each call
returning once Kafka acknowledged them. The collector publishes through it, and so does the lab.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Awaitable, Callable

# Takes one job's events; returns once Kafka acknowledged them all (or an awaitable that does),
# and raises otherwise.
Publish = Callable[[list[dict]], "Awaitable[None] | None"]


def kafka_publisher(config, awaitable: bool = False) -> tuple[Publish, Callable[[], None]]:
    """Send events to the input topic, keyed ``<cluster>/<job_id>``; returns (publish, close).

    ``publish`` returns only once Kafka acknowledged every event, and raises otherwise. With
    ``awaitable`` (for a collector's event loop), called from a running loop it returns at once an
    awaitable that completes then, without blocking the loop: the other jobs' requests go on
    meanwhile."""
    import orjson

    from pipelines.contracts import input_event_key
    from pipelines.io import kafka_clients

    kafka = config.kafka
    kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)
    producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
    lock = threading.Lock()
    topic = config.topics.input

    def send(events: list[dict]) -> list:
        return [producer.send(topic, key=input_event_key(event), value=orjson.dumps(event)) for event in events]

    def publish(events: list[dict]):
        try:
            loop = asyncio.get_running_loop() if awaitable else None
        except RuntimeError:
            loop = None
        if loop is None:
            with lock:
                futures = send(events)
                producer.flush()
            for future in futures:
                future.get(timeout=kafka.connect_timeout_s)
            return None
        acknowledged = loop.create_future()
        pending = [len(events)]
        counted = threading.Lock()

        def settle(error: BaseException | None) -> None:
            if not acknowledged.done():
                acknowledged.set_result(None) if error is None else acknowledged.set_exception(error)

        # The producer's own thread completes the sends: the loop hears once, when the last is
        # acknowledged or the first fails (waking it per event costs a syscall each).
        def done(_metadata) -> None:
            with counted:
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                loop.call_soon_threadsafe(settle, None)

        def failed(exc: BaseException) -> None:
            with counted:
                first, pending[0] = pending[0] > 0, -1
            if first:
                loop.call_soon_threadsafe(settle, exc)

        for future in send(events):
            future.add_callback(done)
            future.add_errback(failed)
        return asyncio.wait_for(acknowledged, timeout=max(kafka.connect_timeout_s, 30.0))

    def close() -> None:
        producer.flush()
        producer.close()

    return publish, close
