"""The detection job's self-monitoring, black box: a real job on the real broker and Spark, fed
in real time like the collector feeds it, then its input stopped, then its JVM stopped.

What on-call relies on: /metrics and the Prometheus text file say the same thing under the same
names, and the shipped rules (infra/prometheus/sentinel-alerts.yml) stay quiet on the healthy run
and would fire on each stall. The rules are evaluated on the scraped values with their own
thresholds, read from the rules file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from pipelines import simulator
from pipelines.contracts import input_event_key
from pipelines.detection.champions import ChampionCache
from pipelines.detection.job import start_detection
from pipelines.io import kafka_clients
from tests.conftest import PROJECT_ROOT
from tests.helpers import metrics
from tests.helpers.detection_job import MINUTE, detection_config_for
from tests.helpers.waiting import wait_for

RULES = PROJECT_ROOT / "infra" / "prometheus" / "sentinel-alerts.yml"
DETECTION = '{query="detection"}'
SCRAPE_EVERY_S = 5.0


def scrape(url: str) -> tuple[float, metrics.Samples]:
    """When (wall clock) and what /metrics said."""
    scraped = metrics.scrape(url)
    return time.time(), scraped


def staleness_rule(alert: str) -> tuple[str, float]:
    """The metric and threshold of a rule ``time() - <metric>{query="detection"} > <seconds>``."""
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    expr = " ".join(rules[alert]["expr"].split())
    matched = re.fullmatch(r'time\(\) - (\w+)\{query="detection"\} > (\d+)', expr)
    assert matched, f"{alert}: {expr!r} is not the staleness rule this test evaluates"
    return matched.group(1), float(matched.group(2))


def value(scraped: dict, metric: str) -> float:
    return scraped[(metric, (("query", "detection"),))]


class RealTimeFeed:
    """A healthy simulated Flink job whose events reach the input topic as their time comes, as
    the collector publishes them; the ten minutes before the start at once (its backlog)."""

    def __init__(self, config):
        now_ms = int(time.time() * 1000)
        job = simulator.simulate_job("healthy_steady", 3, 0, 30 * MINUTE, cluster="faults",
                                     start_ts=now_ms - 10 * MINUTE)
        self.events = iter(job.events)
        self.config = config
        self.stopped = threading.Event()
        self.newest_sent_ms = 0
        self.thread = threading.Thread(target=self._feed, name="real-time-feed", daemon=True)

    def _feed(self) -> None:
        kafka = self.config.kafka
        producer = kafka_clients.make_producer(kafka.bootstrap_servers, kafka.client_kwargs())
        try:
            for event in self.events:
                while event["ts"] > time.time() * 1000:
                    producer.flush()
                    if self.stopped.wait(0.2):
                        return
                if self.stopped.is_set():
                    return
                producer.send(self.config.topics.input, key=input_event_key(event), value=json.dumps(event).encode())
                self.newest_sent_ms = event["ts"]
        finally:
            producer.flush()
            producer.close()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(30)


def spark_jvm_pid(spark) -> int:
    return spark.sparkContext._gateway.proc.pid


@pytest.fixture(scope="module")
def watched(spark, broker_config, trained_store, tmp_path_factory):
    """Scrapes of one job: healthy, with its input stopped, with its JVM stopped (SIGSTOP)."""
    config = detection_config_for(broker_config, trained_store, tmp_path_factory.mktemp("self-monitoring"))
    feed = RealTimeFeed(config)
    feed.thread.start()
    job = start_detection(spark, config, ChampionCache(config))
    seen: dict[str, list] = {"healthy": [], "input_stopped": [], "jvm_stopped": []}
    try:
        url = job.metrics_server.url
        # The first batches read the backlog; healthy from the first one that read the feed's present.
        wait_for(lambda: job.query.lastProgress is not None and config.detection.metrics_file.exists()
                 and scrape(url)[1].get(("checkpoint_sentinel_last_batch_timestamp_seconds", (("query", "detection"),)))
                 is not None, 300, every_s=1.0)
        time.sleep(3 * SCRAPE_EVERY_S)
        seen["text_file"] = config.detection.metrics_file.read_text()
        seen["metrics_page"] = urllib.request.urlopen(url, timeout=5).read().decode()
        for _ in range(4):
            seen["healthy"].append(scrape(url))
            time.sleep(SCRAPE_EVERY_S)

        feed.stop()
        time.sleep(2 * SCRAPE_EVERY_S)  # what was sent is read; from here on nothing comes
        for _ in range(6):
            seen["input_stopped"].append(scrape(url))
            time.sleep(SCRAPE_EVERY_S)

        pid = spark_jvm_pid(spark)
        os.kill(pid, signal.SIGSTOP)
        try:
            for _ in range(5):
                seen["jvm_stopped"].append(scrape(url))  # served by the driver's Python process
                time.sleep(SCRAPE_EVERY_S)
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: job.query.isActive, 60, every_s=1.0)
        time.sleep(3 * SCRAPE_EVERY_S)
        seen["resumed"] = scrape(url)
    finally:
        feed.stop()
        job.stop()
    return seen


def test_the_text_file_and_metrics_page_carry_the_same_names(watched):
    page, text_file = metrics.metric_names(watched["metrics_page"]), metrics.metric_names(watched["text_file"])
    assert page == text_file
    # What the rules and on-call read, in both.
    for name in ("checkpoint_sentinel_newest_event_timestamp_seconds", "checkpoint_sentinel_event_lag_seconds",
                 "checkpoint_sentinel_last_progress_timestamp_seconds",
                 "checkpoint_sentinel_last_batch_timestamp_seconds",
                 "checkpoint_sentinel_watermark_lag_seconds", "checkpoint_sentinel_input_rows_total",
                 "checkpoint_sentinel_state_rows", "checkpoint_sentinel_model_registry_reachable",
                 "checkpoint_sentinel_model_version_info"):
        assert name in text_file, name


def test_a_healthy_job_keeps_its_event_lag_under_the_falling_behind_rule(watched):
    metric, threshold = staleness_rule("SentinelFallingBehind")
    stalled_metric, stalled_after = staleness_rule("SentinelDetectionStalled")
    for at, scraped in watched["healthy"]:
        lag = value(scraped, "checkpoint_sentinel_event_lag_seconds")
        assert 0 <= lag < threshold
        assert at - value(scraped, metric) < threshold
        assert at - value(scraped, stalled_metric) < stalled_after
    # Spark's watermark trails the newest event by the delay the sources may have: by design,
    # not a fault, and not what the rule watches.
    watermark_lag = value(watched["healthy"][-1][1], "checkpoint_sentinel_watermark_lag_seconds")
    assert watermark_lag >= 300


def test_with_its_input_stopped_the_event_lag_grows_until_the_rule_fires(watched):
    metric, threshold = staleness_rule("SentinelFallingBehind")
    stalled_metric, stalled_after = staleness_rule("SentinelDetectionStalled")
    (first_at, first), (last_at, last) = watched["input_stopped"][0], watched["input_stopped"][-1]
    assert last_at - first_at >= 20
    newest = value(first, metric)
    assert value(last, metric) == newest  # nothing newer was processed
    grown = value(last, "checkpoint_sentinel_event_lag_seconds") - value(first, "checkpoint_sentinel_event_lag_seconds")
    assert grown == pytest.approx(last_at - first_at, abs=2.0)
    # time() - newest grows with the clock from here: the rule's expression passes its threshold
    # once that much time has gone by, and stays over it.
    # The query itself is alive (it reports each idle trigger): not the stalled-job rule.
    assert value(last, stalled_metric) > value(first, stalled_metric)
    assert all(at - value(s, stalled_metric) < stalled_after for at, s in watched["input_stopped"])


def test_with_its_jvm_stopped_the_stalled_rule_s_metric_stops(watched):
    metric, threshold = staleness_rule("SentinelDetectionStalled")
    (first_at, first), (last_at, last) = watched["jvm_stopped"][0], watched["jvm_stopped"][-1]
    assert last_at - first_at >= 15
    assert value(last, metric) == value(first, metric)  # no trigger reported while the JVM is stopped
    assert last_at - value(last, metric) >= last_at - first_at
    resumed_at, resumed = watched["resumed"]  # and the job went on after SIGCONT
    assert value(resumed, metric) > value(last, metric) and resumed_at - value(resumed, metric) < threshold
