"""``sentinel collect``'s service: every cluster's :class:`~pipelines.collector.poller.ClusterCollector`
on one event loop, polled every ``collector.interval_s`` until stopped (or once, ``--once``), with
a growing pause for a cluster that cannot be reached.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable, Iterable

from pipelines.collector.poller import ClusterCollector, PollResult
from pipelines.collector.shard import Shard
from pipelines.config import CollectorConfig, FlinkClusterEndpoint
from pipelines.io.input_publisher import Publish, kafka_publisher

log = logging.getLogger(__name__)


def run_collector(config, endpoints: Iterable[FlinkClusterEndpoint], once: bool = False,
                  stop: threading.Event | None = None, report: Callable[[PollResult], None] | None = None,
                  publish: Publish | None = None, metrics=None) -> list[PollResult]:
    """Poll every cluster until ``stop`` is set, all of them on one event loop.

    With ``once``, polls each cluster once and returns the results (the cron-style mode). Every
    poll is accounted in ``metrics`` (a :class:`~pipelines.telemetry.CollectorMetrics`) when given."""
    endpoints = list(endpoints)
    if metrics is not None:
        shown = report

        def report(result: PollResult) -> None:
            metrics.record(result)
            if shown:
                shown(result)

    close: Callable[[], None] = lambda: None
    if publish is None:
        publish, close = kafka_publisher(config, awaitable=True)
    settings = config.collector
    shard = Shard.parse(settings.shard)
    collectors = [ClusterCollector(endpoint, settings, publish, storage=config.storage, shard=shard, keep_events=once)
                  for endpoint in endpoints]
    stop = stop or threading.Event()
    results: list[PollResult] = []

    async def main() -> None:
        try:
            if once:
                for collector in collectors:
                    results.append(await collector.poll_async())
                    if report:
                        report(results[-1])
                return
            await asyncio.gather(*(_poll_forever(c, settings, stop, report) for c in collectors))
        finally:
            for collector in collectors:
                await collector.rest.close()

    try:
        run_loop(main())
        return results
    finally:
        close()


def run_loop(coroutine):
    """Run ``coroutine`` on uvloop's event loop (less CPU per request than asyncio's own: see
    BENCHMARKS.md, "The collector against a fleet (`benchmarks/collector.py`)") when it is
    installed, else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


async def _poll_forever(collector: ClusterCollector, settings: CollectorConfig, stop: threading.Event,
                        report: Callable[[PollResult], None] | None) -> None:
    failures = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            result = await collector.poll_async()
        except Exception as exc:  # noqa: BLE001 - one bad poll (Kafka down, a bug on odd input) must not end collection
            log.exception("%s: poll failed: %s", collector.endpoint.name, exc)
            result = PollResult(collector.endpoint.name, reachable=False, errors=[f"{type(exc).__name__}: {exc}"])
        if report:
            report(result)
        failures = 0 if result.reachable else failures + 1
        pause = settings.interval_s if failures == 0 else min(settings.max_backoff_s, settings.interval_s * 2 ** failures)
        deadline = time.monotonic() + (max(0.0, pause - (time.monotonic() - started)) if failures == 0 else pause)
        # The stop event is a thread's (set from a signal handler): looked at every tenth of a second.
        while not stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
