"""The production commands: collect, run, alert, report, incidents, feedback, selfcheck, status.

Each handler parses, calls one library function and prints; the dependencies it needs are checked
first, so that one that is down ends the command within seconds with the key to fix.
"""

from __future__ import annotations

import argparse
import logging
import sys

from pipelines.cli.common import require_champions, require_kafka, stop_on_signals
from pipelines.cli.parser import Command, duration, positive_int
from pipelines.config import SentinelConfig
from pipelines.errors import EXIT_FAILED, UsageError


def _collector_endpoints(config: SentinelConfig, args: argparse.Namespace) -> list:
    from pipelines.config import FlinkClusterEndpoint

    if args.flink_rest:
        if args.cluster and len(args.cluster) != len(args.flink_rest):
            raise UsageError("give one --cluster name per --flink-rest URL, or none")
        names = args.cluster or (["flink"] if len(args.flink_rest) == 1 else
                                 [f"flink-{i}" for i in range(len(args.flink_rest))])
        try:
            return [FlinkClusterEndpoint(name=name, rest_url=url) for name, url in zip(names, args.flink_rest)]
        except ValueError as exc:
            raise UsageError(f"--flink-rest: {exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}") from None
    if args.cluster:
        raise UsageError("--cluster names the cluster of a --flink-rest URL; without one, the clusters come from "
                         "collector.clusters in the config")
    if not config.collector.clusters:
        raise UsageError("no Flink cluster to poll: pass --flink-rest URL [--cluster NAME], or list "
                         "collector.clusters (name, rest_url) in the config")
    return list(config.collector.clusters)


def _cmd_collect(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.collector import Shard, run_collector
    from pipelines.telemetry import CollectorMetrics, serve

    endpoints = _collector_endpoints(config, args)
    if args.interval:
        config.collector.interval_s = args.interval
    if args.shard:
        try:
            config.collector.shard = str(Shard.parse(args.shard))
        except ValueError as exc:
            raise UsageError(f"--shard: {exc}") from None
    require_kafka(config)
    logging.getLogger("pipelines.collector").setLevel(logging.INFO if args.verbose else logging.WARNING)
    if not args.once:
        shard = f" (shard {config.collector.shard}: the jobs a hash of their id gives it)" if config.collector.shard else ""
        print(f"polling {', '.join(f'{e.name} ({e.rest_url})' for e in endpoints)}{shard} every "
              f"{config.collector.interval_s:g}s; events to {config.topics.input} on {config.kafka.bootstrap_servers}",
              flush=True)
    metrics, server = CollectorMetrics(), None
    if config.collector.metrics_port is not None and not args.once:
        server = serve(metrics.registry, config.collector.metrics_host, config.collector.metrics_port)
        print(f"metrics for Prometheus at {server.url}", flush=True)
    # As a service (systemd, Kubernetes) it is stopped with SIGTERM: the polls under way finish
    # and the producer is flushed, so what they read is published and recorded once.
    stop = None if args.once else stop_on_signals()
    try:
        results = run_collector(config, endpoints, once=args.once, report=lambda r: print(r.line(), flush=True),
                                metrics=metrics, stop=stop)
    finally:
        if server is not None:
            server.close()
    if stop is not None and stop.is_set():
        print("stopped: the producer flushed and closed", flush=True)
    unreachable = [r.cluster for r in results if not r.reachable]
    if unreachable:
        print(f"sentinel collect: could not reach {', '.join(unreachable)}; check the REST URL (--flink-rest, or "
              "rest_url in collector.clusters) and that the JobManager runs", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _cmd_run(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.detection.spark_state import check_pyspark
    from pipelines.io.reachability import cap_mlflow_retries, mlflow_probes

    logging.getLogger("pipelines.detection").setLevel(logging.DEBUG if args.verbose > 1 else logging.INFO)
    check_pyspark()  # first: a PySpark the stateful processor was not tested with is a stop at once
    require_kafka(config)
    from pipelines.detection.champions import HELD_CHAMPIONS
    from pipelines.detection.job import start_detection
    from pipelines.io.kafka_stream import explain_data_loss
    from pipelines.spark_session import build_spark

    # A registry that is down is a stop only for a job that holds no copies of its champions yet.
    cap_mlflow_retries()
    down = [probe for probe in mlflow_probes(config.mlflow.tracking_uri, config.mlflow.registry_uri) if not probe.ok]
    if down and not config.checkpoint_dir(HELD_CHAMPIONS).exists():
        down[0].raise_if_down("(the job holds no copies of the champions yet to score with meanwhile)")
    cache = require_champions(config, held=True)
    spark = build_spark(config, "run")
    stop = stop_on_signals()  # systemd and Kubernetes stop with SIGTERM: finish the batch, then stop
    job = start_detection(spark, config, cache, available_now=args.available_now)
    served = f"{job.metrics_server.url} and " if job.metrics_server else ""
    print(f"reading {config.topics.input} on {config.kafka.bootstrap_servers}; incidents to {config.topics.incidents}, "
          f"dead letters to {config.topics.dead_letter}; metrics at {served}{config.detection.metrics_file}", flush=True)
    try:
        job.await_termination(args.timeout, stop)
    except Exception as exc:
        lost = explain_data_loss(exc)
        if lost is None:
            raise
        raise lost from exc
    finally:
        job.stop()
    print(f"stopped: {job.sinks.incidents_published} incident events, {job.sinks.dead_letters} dead letters")
    return 0


def _cmd_alert(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.alerting import AlertRelay

    if args.resend_interval:
        config.alert.resend_interval_s = args.resend_interval
    try:
        relay = AlertRelay(config, args.alertmanager)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    logging.getLogger("pipelines.alerting").setLevel(logging.INFO if args.verbose else logging.WARNING)
    require_kafka(config)
    try:
        relay.serve_metrics()
    except OSError as exc:
        raise UsageError(f"cannot serve /metrics on {config.alert.metrics_host}:{config.alert.metrics_port} ({exc}): "
                         "set alert.metrics_port (SENTINEL_ALERT__METRICS_PORT) to a free port, 0 for any, or "
                         "null for none") from None

    def started() -> None:
        served = f"; /metrics at {relay.metrics_server.url}" if relay.metrics_server else ""
        print(f"delivering {config.topics.incidents} on {config.kafka.bootstrap_servers} to "
              f"{', '.join(relay.alertmanagers.urls)} (consumer group {config.alert.group_id}); open alerts re-sent "
              f"every {config.alert.resend_interval_s:g}s, each ending {config.alert.open_alert_ttl_s:g}s later "
              f"unless re-sent{served}", flush=True)

    stats = relay.run(stop_on_signals(), started)
    print(f"stopped: {stats.events} incident events read, {stats.alerts_sent} alerts sent in {stats.posts} posts, "
          f"{stats.failed_tries} failed tries, {stats.rejected} rejected, {stats.fixed} fixed", flush=True)
    return 0


def _cmd_report(config: SentinelConfig, args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from pipelines.display import printable
    from pipelines.reports.incident_page import write_pages
    from pipelines.reports.topic_reader import report_inputs

    for path in [*(args.incidents or []), *(args.events or [])]:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no such file: {path}")
    if not args.incidents or not args.events:
        require_kafka(config)
    started = time.monotonic()
    inputs = report_inputs(config, args.incidents, args.events, args.read_timeout, args.since)
    if inputs.refused:
        print(f"sentinel report: skipped {len(inputs.refused)} record(s) that are not incident events; the first: "
              f"{printable(inputs.refused[0])[:300]}", file=sys.stderr)
    if not inputs.incidents:
        print("no incidents to report" + ("" if args.incidents else f" on {config.topics.incidents}"))
        return 0
    out = Path(args.out) if args.out else Path(config.state_dir) / "incidents"
    pages = write_pages(inputs.incidents, inputs.events, out, only=args.incident or ())
    print(f"{len(pages) - 1} incident pages and the index of open incidents -> {pages[0]} "
          f"({time.monotonic() - started:.1f}s{inputs.read_note})")
    return 0


def _cmd_incidents(config: SentinelConfig, args: argparse.Namespace) -> int:
    import json
    from contextlib import closing

    from pipelines.reports.incident_view import HEADER, follow, format_incident

    # The consumer is closed on any way out, a failed print too: left open, it kept the process alive.
    with closing(follow(config, from_beginning=args.from_beginning, timeout_s=args.timeout,
                        max_events=args.max)) as incidents:
        if args.output == "table":
            print(HEADER, flush=True)
        for incident in incidents:
            print(json.dumps(incident, separators=(",", ":")) if args.output == "json"
                  else format_incident(incident), flush=True)
    return 0


def _cmd_feedback(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.display import printable
    from pipelines.feedback import give

    require_kafka(config)
    record = give(config, args.incident_id, "false_positive" if args.false_positive else "confirmed", args.note,
                  args.by)
    where = printable(record["job_name"]) + (f" (vertex {printable(record['vertex_id'])})" if record["vertex_id"] else "")
    print(f"recorded on {config.topics.feedback}: {printable(record['family'])} incident "
          f"{printable(record['incident_id'])} on {where} "
          f"{'was a false positive' if args.false_positive else 'is confirmed'} (by {printable(record['given_by'])}); "
          "`sentinel train --feedback` learns from it")
    return 0


def _cmd_selfcheck(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.selfcheck import check_storage, contract_round_trip
    from pipelines.spark_session import build_spark

    require_kafka(config)  # say so before paying for a Spark start-up
    for line in check_storage(config):
        print(f"storage {line}")
    spark = build_spark(config, "selfcheck")
    result = contract_round_trip(spark, config, events=args.events)
    print(result.summary())
    return 0 if result.ok else EXIT_FAILED


def _cmd_status(config: SentinelConfig, args: argparse.Namespace) -> int:
    from infra.embedded_stack import EmbeddedStack
    from pipelines.io.reachability import service_probes

    probes = service_probes(config)
    print("configured services:")
    for probe in probes:
        print("  " + probe.line())
    print("embedded stack (`sentinel up`):")
    for status in EmbeddedStack(config).status():
        print("  " + status.line())
    print(f"state    {config.state_dir}")
    down = [p for p in probes if not p.ok]
    if down:
        print(f"sentinel status: {len(down)} configured service(s) unreachable: " +
              "; ".join(f"{p.service} at {p.where}, check {p.key}" for p in down), file=sys.stderr)
        return EXIT_FAILED
    return 0


def _collect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flink-rest", action="append", metavar="URL",
                   help="JobManager REST URL, e.g. http://flink-jm:8081 (repeatable; default: collector.clusters)")
    p.add_argument("--cluster", action="append", metavar="NAME",
                   help="the cluster name of each --flink-rest (repeatable; default 'flink', or flink-0, flink-1, "
                        "... for several)")
    p.add_argument("--interval", type=duration, metavar="DURATION",
                   help="time between polls, e.g. 5s (default: collector.interval_s)")
    p.add_argument("--once", action="store_true", help="poll every cluster once, then exit; 1 if one was "
                                                       "unreachable (cron-style)")
    p.add_argument("--shard", metavar="I/N", help="poll only the jobs a hash of the job id gives to shard I of N "
                                                  "collector processes, e.g. 0/4 (default: collector.shard)")


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--available-now", action="store_true",
                   help="process what is on the topic now, then stop (cron-style); without it, run until stopped")
    p.add_argument("--timeout", type=duration, metavar="DURATION", help="stop after this long (default: never)")


def _alert_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alertmanager", action="append", metavar="URL",
                   help="Alertmanager base URL, e.g. http://alertmanager:9093 (repeatable for an HA pair; "
                        "default: alert.alertmanager_urls)")
    p.add_argument("--resend-interval", type=duration, metavar="DURATION",
                   help="how often open alerts are re-sent (default: alert.resend_interval_s)")


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--incidents", action="append", metavar="INCIDENTS.jsonl",
                   help="incident events, e.g. from `sentinel replay --out` (repeatable; default: the incident topic)")
    p.add_argument("--events", action="append", metavar="EVENTS.jsonl[.gz]",
                   help="the jobs' input events (repeatable; default: the input topic, the incidents' jobs only)")
    p.add_argument("--incident", action="append", metavar="INCIDENT_ID",
                   help="only this incident's page (repeatable; the index lists all; default: every incident)")
    p.add_argument("--since", type=duration, metavar="DURATION", default=24 * 3600.0,
                   help="read from the topics: the incident events published in this last stretch of time, and "
                        "their jobs' input events from half an hour before the first of them")
    p.add_argument("--out", metavar="DIR", help="where the pages go (default: <state_dir>/incidents); serve it "
                                                "and set alert.incident_url to link alerts to the pages")
    p.add_argument("--read-timeout", type=duration, default=300.0, metavar="DURATION",
                   help="longest time to read a topic up to its end")


def _incidents_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from-beginning", action="store_true",
                   help="start at the oldest incident kept (without it: only new ones)")
    p.add_argument("--timeout", type=duration, metavar="DURATION",
                   help="stop after this long without news (default: follow until stopped)")
    p.add_argument("--max", type=positive_int, metavar="N", help="stop after N incident events (default: no limit)")
    p.add_argument("--output", choices=["table", "json"], default="table",
                   help="a table, or one JSON incident event per line for scripts (jq)")


def _feedback_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("incident_id", metavar="INCIDENT_ID", help="the incident's id (`sentinel incidents` shows it)")
    verdict = p.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--false-positive", action="store_true", help="nothing of its family was wrong")
    verdict.add_argument("--confirmed", action="store_true", help="it was a real problem of its family")
    p.add_argument("--note", help="what you found, kept with the verdict (default: none)")
    p.add_argument("--by", metavar="NAME", help="who gives the verdict (default: the login name)")


def _selfcheck_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=positive_int, default=3000, metavar="N",
                   help="example input events to send round the trip")


COMMANDS = [
    Command("collect", "production", "poll Flink's REST API and publish its metrics to the input topic",
            ("sentinel collect --flink-rest http://flink-jm:8081 --cluster prod-eu1",
             "sentinel collect --once    # every cluster of collector.clusters once (cron)"),
            _cmd_collect, _collect_arguments),
    Command("run", "production", "the detection job: input topic -> features -> models -> incident topic",
            ("sentinel run", "sentinel run --available-now    # what is on the topic now, then stop"),
            _cmd_run, _run_arguments),
    Command("alert", "production", "deliver the incident topic to Alertmanager (one alert per incident)",
            ("sentinel alert --alertmanager http://alertmanager-0:9093 --alertmanager http://alertmanager-1:9093",),
            _cmd_alert, _alert_arguments),
    Command("report", "production", "an HTML page per incident (plots, evidence, runbook) and an index of open ones",
            ("sentinel report --out /srv/sentinel/incidents --since 2h",
             "sentinel report --incidents replay.jsonl --events events.jsonl.gz"),
            _cmd_report, _report_arguments),
    Command("incidents", "production", "follow the incident topic as a readable live table",
            ("sentinel incidents --from-beginning --timeout 5s",
             "sentinel incidents --from-beginning --timeout 5s --output json | jq -r .summary"),
            _cmd_incidents, _incidents_arguments),
    Command("feedback", "production", "say an incident was a false positive, or confirm it (training learns from it)",
            ("sentinel feedback 7f3c...e1 --false-positive --note 'a planned backfill refills state'",),
            _cmd_feedback, _feedback_arguments),
    Command("selfcheck", "production", "prove the round trip Kafka -> Spark -> Kafka and the storage locations",
            ("sentinel selfcheck --config sentinel.yaml",), _cmd_selfcheck, _selfcheck_arguments),
    Command("status", "production", "whether each configured service answers, and what the embedded stack runs",
            ("sentinel status --config sentinel.yaml    # exit 1 when a configured service is unreachable",),
            _cmd_status),
]
