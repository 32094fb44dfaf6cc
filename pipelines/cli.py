"""``sentinel``: the one entry point. Each command parses its arguments, calls a library function
and prints; errors a user can fix are printed as one clear message with a non-zero exit code."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable, Sequence

from pipelines.config import ConfigError, SentinelConfig, load_config
from pipelines.families import FAMILIES

EXIT_USAGE = 2
EXIT_FAILED = 1


class UsageError(ValueError):
    """A command called with arguments that cannot work together."""

# No internet here or on many production hosts: never let a library phone home.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TQDM_DISABLE", "1")  # Great Expectations' per-validation progress bars


def _cmd_up(config: SentinelConfig, args: argparse.Namespace) -> int:
    from infra.embedded_stack import EmbeddedStack

    for line in EmbeddedStack(config).up(mlflow=not args.no_mlflow):
        print(line)
    return 0


def _cmd_down(config: SentinelConfig, args: argparse.Namespace) -> int:
    from infra.embedded_stack import EmbeddedStack

    for line in EmbeddedStack(config).down():
        print(line)
    return 0


def _cmd_status(config: SentinelConfig, args: argparse.Namespace) -> int:
    from infra.embedded_stack import EmbeddedStack

    statuses = EmbeddedStack(config).status()
    for status in statuses:
        print(status.line())
    print(f"state    {config.state_dir}")
    return 0


def _cmd_selfcheck(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.io.kafka_clients import check_reachable
    from pipelines.selfcheck import check_storage, contract_round_trip
    from pipelines.spark_session import build_spark

    # Say so before paying for a Spark start-up.
    check_reachable(config.kafka.bootstrap_servers, config.kafka.connect_timeout_s)
    for line in check_storage(config):
        print(f"storage {line}")
    spark = build_spark(config, "selfcheck")
    result = contract_round_trip(spark, config, events=args.events)
    print(result.summary())
    return 0 if result.ok else EXIT_FAILED


def _cmd_simulate(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pathlib import Path

    from pipelines import simulator
    from pipelines.simulator.scenarios import CATALOGUE

    if args.list:
        for name, scenario in CATALOGUE.items():
            duration = f"{scenario.default_duration_ms // 60_000} min"
            print(f"{name:<28} {scenario.family or 'healthy':<19} {duration:>8}  {scenario.description}")
        return 0
    if args.calibration_report:
        from pipelines.simulator.calibration import report

        out = Path(args.calibration_report)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report(Path(config.lab.corpus_dir)))
        print(f"calibration report: {out}")
        return 0
    duration = simulator.parse_duration(args.duration) if args.duration else None
    names = args.scenario or list(CATALOGUE)
    if args.dataset:
        manifest = simulator.write_dataset(Path(args.dataset), [n for n, _ in simulator.parse_mix(names)],
                                           args.jobs_per_scenario, args.seed, duration)
        for split, info in manifest["splits"].items():
            print(f"{split:<10} {info['jobs']:>4} jobs {info['events']:>9} events  {Path(args.dataset) / split}")
        return 0
    if not (args.out or args.kafka):
        raise simulator.SimulationError("say where the events go: --out FILE.jsonl, --kafka or --dataset DIR")
    jobs = simulator.plan_jobs(simulator.parse_mix(names), args.seed, duration, fleet=args.fleet)
    truth_path = Path(args.truth) if args.truth else (Path(args.out).with_suffix(".ground_truth.jsonl") if args.out else None)
    if truth_path:
        simulator.write_jsonl(truth_path, (job.truth for job in jobs))
    if args.out:
        count = simulator.write_jsonl(Path(args.out), simulator.merged_events(jobs))
        print(f"wrote {count} events of {len(jobs)} jobs to {args.out}; ground truth in {truth_path}")
        return 0
    from datetime import datetime, timezone

    from pipelines.simulator.publish import publish_to_kafka

    def progress(sent: int, ts: int) -> None:
        print(f"  {sent} events published, event time {datetime.fromtimestamp(ts / 1000, timezone.utc):%Y-%m-%d %H:%M:%S}", flush=True)

    speed = None if args.max_speed else args.speed
    print(f"publishing {len(jobs)} jobs to {config.topics.input} at {config.kafka.bootstrap_servers}"
          f" ({'as fast as possible' if speed is None else f'{speed:g}x event time'})", flush=True)
    count = publish_to_kafka(simulator.merged_events(jobs), config, speed, progress)
    print(f"published {count} events" + (f"; ground truth in {truth_path}" if truth_path else ""))
    return 0


def _cmd_features(config: SentinelConfig, args: argparse.Namespace) -> int:
    from feature_store.definitions import FEATURES, markdown_table

    if args.action == "list":
        if args.markdown:
            print(markdown_table())
        else:
            for f in FEATURES:
                print(f"{f.name:<36} {f.family:<19} {f.level:<7} {f.unit:<13} {f.description}")
        return 0
    from feature_store import offline_store
    from pipelines.spark_session import build_spark

    paths = list(args.events or [])
    if args.dataset:
        paths += offline_store.dataset_files(args.dataset)[0]
    if not paths:
        raise UsageError("features backfill needs event files or --dataset DIR")
    store = config.location(args.store) if args.store else config.offline_store
    spark = build_spark(config, "backfill")
    rows = offline_store.backfill(spark, paths, store, config.features.idle_timeout_ms)
    print(f"wrote {rows} feature rows from {len(paths)} event file(s) to {store}")
    return 0


def _training_datasets(config: SentinelConfig, args: argparse.Namespace) -> list:
    """The --dataset folders; without them, a simulated dataset under the state folder (made once
    per seed) and the real-Flink corpus (``lab.corpus_dir``) when it is there."""
    from pathlib import Path

    from pipelines import simulator

    datasets = [Path(d) for d in getattr(args, "dataset", None) or []]
    if datasets:
        return datasets
    generated = Path(config.state_dir) / "datasets" / f"simulated-seed{args.seed}"
    if not (generated / "manifest.json").is_file():
        print(f"no --dataset given: simulating one into {generated} (every scenario, "
              f"{args.jobs_per_scenario} jobs each)", flush=True)
        simulator.write_dataset(generated, list(simulator.CATALOGUE), args.jobs_per_scenario, args.seed,
                                simulator.parse_duration(args.duration))
    corpus = Path(config.lab.corpus_dir)
    if (corpus / "manifest.json").is_file():
        print(f"training on {generated} and the real-Flink corpus {corpus}", flush=True)
        return [generated, corpus]
    print(f"training on {generated} (no real-Flink corpus at {corpus})", flush=True)
    return [generated]


def _train(config: SentinelConfig, args: argparse.Namespace, families, dry_run: bool = False) -> None:
    from models.training import run_training
    from pipelines.spark_session import build_spark

    datasets = _training_datasets(config, args)
    spark = build_spark(config, "train")
    feedback = None
    if getattr(args, "feedback", False):
        from pipelines.feedback import load_fleet_feedback

        feedback = load_fleet_feedback(spark, config)
        print(f"the fleet's feedback: {len(feedback)} verdicts on {config.topics.feedback}, "
              f"{len(feedback.rows)} feature rows of their jobs in the feature log", flush=True)
    outcomes = run_training(spark, config, datasets, families, dry_run=dry_run, seed=args.seed,
                            progress=lambda line: print(line, flush=True), feedback=feedback)
    print("\nsummary:")
    for outcome in outcomes:
        print("  " + outcome.line())


def _cmd_train(config: SentinelConfig, args: argparse.Namespace) -> int:
    _train(config, args, args.family or FAMILIES, dry_run=args.dry_run)
    return 0


def _require_champions(config: SentinelConfig, held: bool = False):
    """The champions, loaded; ``held``: the detection job's, which a restart while the registry is
    down resumes with (the copies the job keeps beside its checkpoints)."""
    from pipelines.detection.champions import ChampionCache, held_champions

    cache = ChampionCache(config, held=held_champions(config) if held else None)
    cache.require()
    print("scoring with " + ", ".join(f"{m.name} v{m.version}" for m in cache.models.values()), flush=True)
    return cache


def _cmd_run(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.detection.job import start_detection
    from pipelines.detection.spark_state import check_pyspark
    from pipelines.io.kafka_clients import check_reachable
    from pipelines.spark_session import build_spark

    logging.getLogger("pipelines.detection").setLevel(logging.INFO)
    check_pyspark()  # first: a PySpark the stateful processor was not tested with is a stop at once
    check_reachable(config.kafka.bootstrap_servers, config.kafka.connect_timeout_s)
    cache = _require_champions(config, held=True)
    spark = build_spark(config, "run")
    stop = _stop_on_signals()  # systemd and Kubernetes stop with SIGTERM: finish the batch, then stop
    job = start_detection(spark, config, cache, available_now=args.available_now)
    served = f"{job.metrics_server.url} and " if job.metrics_server else ""
    print(f"reading {config.topics.input} on {config.kafka.bootstrap_servers}; incidents to {config.topics.incidents}, "
          f"dead letters to {config.topics.dead_letter}; metrics at {served}{config.detection.metrics_file}", flush=True)
    try:
        job.await_termination(args.timeout, stop)
    finally:
        job.stop()
    print(f"stopped: {job.sinks.incidents_published} incident events, {job.sinks.dead_letters} dead letters")
    return 0


def _cmd_replay(config: SentinelConfig, args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from pipelines.detection.flink_job import replay
    from pipelines.incidents.comparison import compare

    for path in args.inputs:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no such events file: {path}")
    cache = _require_champions(config)
    result = replay(config, args.inputs, cache.models)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(i) + "\n" for i in result.incidents))
    print(f"replayed {result.events} events: {len(result.incidents)} incident events "
          f"({sum(i['event'] == 'opened' for i in result.incidents)} opened) -> {out}")
    if result.dead_letters:
        letters = out.with_name(out.stem + ".dead_letters.jsonl")
        letters.write_text("".join(json.dumps(d) + "\n" for d in result.dead_letters))
        print(f"{len(result.dead_letters)} unusable lines -> {letters}")
    if args.truth:
        truths = [json.loads(line) for t in args.truth for line in Path(t).read_text().splitlines() if line.strip()]
        for line in compare(truths, result.incidents).lines():
            print(line)
    return 0


def _cmd_evaluate(config: SentinelConfig, args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from pipelines.datasets import subset
    from pipelines.reports.backtest import evaluate_dataset, write_report

    dataset = Path(args.dataset) if args.dataset else Path(config.lab.corpus_dir)
    cache = _require_champions(config)
    with tempfile.TemporaryDirectory() as tmp:
        chosen = subset(dataset, args.run, Path(tmp) / dataset.name) if args.run else dataset
        evaluation = evaluate_dataset(config, chosen, args.split, cache.models)
    for line in evaluation.run_lines() + [""] + evaluation.family_lines() + [""] + evaluation.stratum_lines():
        print(line)
    out = Path(args.report) if args.report else Path(config.state_dir) / "reports" / f"evaluate-{dataset.name}-{args.split}"
    index = write_report(evaluation, out, f"sentinel evaluate: {dataset} ({args.split})")
    print(f"\nreport with a plot per run: {index}")
    return 0


def _cmd_incidents(config: SentinelConfig, args: argparse.Namespace) -> int:
    import json
    from contextlib import closing

    from pipelines.reports.incident_view import HEADER, follow, format_incident

    # The consumer is closed on any way out, a failed print too: left open, it kept the process alive.
    try:
        with closing(follow(config, from_beginning=args.from_beginning, timeout_s=args.timeout,
                            max_events=args.max)) as incidents:
            if args.output == "table":
                print(HEADER, flush=True)
            for incident in incidents:
                print(json.dumps(incident, separators=(",", ":")) if args.output == "json"
                      else format_incident(incident), flush=True)
    except BrokenPipeError:
        # The reader went away (`| head -1`): stop as a pipeline expects, without a traceback
        # (stdout now points at /dev/null for Python's flush at exit).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _cmd_feedback(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.display import printable
    from pipelines.feedback import give

    record = give(config, args.incident_id, "false_positive" if args.false_positive else "confirmed", args.note,
                  args.by)
    where = printable(record["job_name"]) + (f" (vertex {printable(record['vertex_id'])})" if record["vertex_id"] else "")
    print(f"recorded on {config.topics.feedback}: {printable(record['family'])} incident "
          f"{printable(record['incident_id'])} on {where} "
          f"{'was a false positive' if args.false_positive else 'is confirmed'} (by {printable(record['given_by'])}); "
          "`sentinel train --feedback` learns from it")
    return 0


def _cmd_report(config: SentinelConfig, args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from pipelines.datasets import read_jsonl
    from pipelines.display import printable
    from pipelines.io import kafka_clients
    from pipelines.reports.incident_page import usable_incidents, write_pages

    for path in [*(args.incidents or []), *(args.events or [])]:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no such file: {path}")
    kafka = config.kafka
    if not args.incidents or not args.events:
        kafka_clients.check_reachable(kafka.bootstrap_servers, kafka.connect_timeout_s)

    def from_topic(topic: str, keep=None) -> list[dict]:
        return kafka_clients.read_json_values(kafka.bootstrap_servers, kafka.client_kwargs(), topic, args.read_timeout,
                                              keep)

    started = time.monotonic()
    incidents, refused = usable_incidents([i for path in args.incidents for i in read_jsonl(Path(path))]
                                          if args.incidents else from_topic(config.topics.incidents))
    if refused:
        print(f"sentinel report: skipped {len(refused)} record(s) that are not incident events; the first: "
              f"{printable(refused[0])[:300]}", file=sys.stderr)
    if not incidents:
        print("no incidents to report" + ("" if args.incidents else f" on {config.topics.incidents}"))
        return 0
    if args.events:
        events = (e for path in args.events for e in read_jsonl(Path(path)))
    else:
        # As the collector keys them; a name no UTF-8 key can hold (a lone surrogate) matches none.
        keys = {f"{i['cluster']}/{i['job_id']}".encode("utf-8", "surrogatepass") for i in incidents}
        events = from_topic(config.topics.input, keep=lambda r: r.key in keys)
    out = Path(args.out) if args.out else Path(config.state_dir) / "incidents"
    pages = write_pages(incidents, events, out, only=args.incident or ())
    print(f"{len(pages) - 1} incident pages and the index of open incidents -> {pages[0]} "
          f"({time.monotonic() - started:.1f}s)")
    return 0


def _cmd_demo(config: SentinelConfig, args: argparse.Namespace) -> int:
    from infra.embedded_stack import EmbeddedStack
    from models import registry
    from pipelines.detection.demo import run_demo

    print("checkpoint-sentinel demo on the embedded stack")
    for line in EmbeddedStack(config).up():
        print("  " + line)
    registry.use_config(config)
    missing = [f for f in FAMILIES if registry.alias_version(getattr(config.mlflow.models, f), config.mlflow.alias) is None]
    if missing:
        print(f"no champion yet for {', '.join(missing)}: training the initial models (once; later runs reuse them)")
        _train(config, args, missing)
    else:
        print("champions found in the registry: reusing them")
    run_demo(config, fleet=args.fleet, seed=args.seed, duration=args.fleet_duration, speed=args.speed)
    print("The stack keeps running; `sentinel incidents --from-beginning` shows the incident topic, "
          "`sentinel status` the stack and `sentinel down` stops it.")
    return 0


def _collector_endpoints(config: SentinelConfig, args: argparse.Namespace) -> list:
    from pipelines.config import FlinkClusterEndpoint

    if args.flink_rest:
        if args.cluster and len(args.cluster) != len(args.flink_rest):
            raise UsageError("give one --cluster name per --flink-rest URL, or none")
        names = args.cluster or ([args.cluster_default] if len(args.flink_rest) == 1 else
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
    from pipelines.collector import run_collector

    endpoints = _collector_endpoints(config, args)
    if args.interval:
        from pipelines.simulator import parse_duration

        config.collector.interval_s = parse_duration(args.interval) / 1000
    if args.shard:
        from pipelines.collector import Shard

        try:
            config.collector.shard = str(Shard.parse(args.shard))
        except ValueError as exc:
            raise UsageError(f"--shard: {exc}") from None
    logging.getLogger("pipelines.collector").setLevel(logging.INFO if args.verbose else logging.WARNING)
    if not args.once:
        shard = f" (shard {config.collector.shard}: the jobs a hash of their id gives it)" if config.collector.shard else ""
        print(f"polling {', '.join(f'{e.name} ({e.rest_url})' for e in endpoints)}{shard} every "
              f"{config.collector.interval_s:g}s; events to {config.topics.input} on {config.kafka.bootstrap_servers}",
              flush=True)
    from pipelines.telemetry import CollectorMetrics, serve

    metrics, server = CollectorMetrics(), None
    if config.collector.metrics_port is not None and not args.once:
        server = serve(metrics.registry, config.collector.metrics_host, config.collector.metrics_port)
        print(f"metrics for Prometheus at {server.url}", flush=True)
    # As a service (systemd, Kubernetes) it is stopped with SIGTERM: the polls under way finish
    # and the producer is flushed, so what they read is published and recorded once.
    stop = None if args.once else _stop_on_signals()
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
        print(f"sentinel collect: could not reach {', '.join(unreachable)}; check the REST URL and that the "
              "JobManager runs", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _cmd_alert(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pipelines.alerting import AlertRelay

    if args.resend_interval:
        from pipelines.simulator import parse_duration

        config.alert.resend_interval_s = parse_duration(args.resend_interval) / 1000
    try:
        relay = AlertRelay(config, args.alertmanager)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    logging.getLogger("pipelines.alerting").setLevel(logging.INFO if args.verbose else logging.WARNING)
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

    stats = relay.run(_stop_on_signals(), started)
    print(f"stopped: {stats.events} incident events read, {stats.alerts_sent} alerts sent in {stats.posts} posts, "
          f"{stats.failed_tries} failed tries, {stats.rejected} rejected, {stats.fixed} fixed", flush=True)
    return 0


def _stop_on_signals():
    """An event SIGTERM and SIGINT set: the command finishes the work under way and stops cleanly
    (the detection job at a batch boundary, a lab session cancelling its jobs and its cluster)."""
    import signal
    import threading

    stop = threading.Event()

    def request_stop(signum, frame):
        print(f"\n{signal.Signals(signum).name}: stopping after the work under way", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop


def _cmd_lab(config: SentinelConfig, args: argparse.Namespace) -> int:
    from pathlib import Path

    from pipelines import lab
    from pipelines.config import LabConfig
    from pipelines.lab.corpus import GRIDS
    from pipelines.lab.scenarios import NAMED

    if args.flink_version:
        # A version's own virtualenv, unless lab.flink_venv names one explicitly.
        venv = config.lab.flink_venv
        if venv.name == LabConfig.default_venv(config.lab.flink_version).name:
            venv = venv.with_name(LabConfig.default_venv(args.flink_version).name)
        config.lab = config.lab.model_copy(update={"flink_version": args.flink_version, "flink_venv": venv})
    if args.merge_from:
        target = Path(args.dataset) if args.dataset else Path(config.lab.corpus_dir)
        merged = lab.merge_runs(Path(args.merge_from), target)
        print(f"added {len(merged)} runs of {args.merge_from} to {target}")
        return 0
    if args.grid:
        names = args.grid.split(",")
        unknown = [name for name in names if name not in GRIDS]
        if unknown:
            raise UsageError(f"unknown grid {', '.join(map(repr, unknown))}; choose from {', '.join(GRIDS)}")
        variants = [v for name in dict.fromkeys(names) for v in GRIDS[name](args.only, config.lab.flink_version)]
        dataset = Path(args.dataset) if args.dataset else Path(config.lab.corpus_dir)
        if args.forget:
            if not args.only:
                raise UsageError("--forget needs --only GLOB: say which runs to record again")
            forgotten = lab.remove_runs(dataset, [v.run_id for v in variants])
            print(f"forgot {len(forgotten)} runs of {dataset}; the grid records them again next time")
            return 0
        if args.list:
            done = lab.recorded_runs(dataset)
            for v in variants:
                print(f"{v.run_id:<58} {v.split:<10} {v.kind:<10} {v.family:<19} {v.duration_s:>4}s "
                      f"{'recorded' if v.run_id in done else ''}")
            return 0
        runs = lab.run_grid(config, variants, dataset, concurrency=args.concurrency,
                            publish_to_kafka=args.kafka, stop=_stop_on_signals())
        print(f"grid {args.grid}: {len(runs)} runs recorded in {dataset}")
        return 0
    if args.list:
        for name, named in NAMED.items():
            variant = named.variant(240)
            print(f"{name:<26} {variant.family:<19} {variant.description}")
        return 0
    if not args.scenario:
        raise UsageError("name a scenario (`sentinel lab --list` shows them) or a grid (--grid corpus)")
    if args.scenario not in NAMED:
        raise UsageError(f"unknown lab scenario {args.scenario!r}; `sentinel lab --list` shows them")
    run = lab.run_lab(config, args.scenario, duration=args.duration, split=args.split,
                      dataset=Path(args.dataset) if args.dataset else None, publish_to_kafka=not args.no_kafka,
                      keep_cluster=args.keep_cluster, stop=_stop_on_signals())
    print(run.summary())
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("checkpoint-sentinel")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    # --config and -v work before or after the subcommand; SUPPRESS keeps a subcommand that does
    # not repeat them from resetting what was given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS,
                        help="YAML config file (default: $SENTINEL_CONFIG, else ./sentinel.yaml if present)")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at INFO level")
    parser = argparse.ArgumentParser(prog="sentinel", description=__doc__.splitlines()[0], parents=[common])
    parser.add_argument("--version", action="version", version=f"sentinel (checkpoint-sentinel) {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, subcommands=commands, **kwargs) -> argparse.ArgumentParser:
        return subcommands.add_parser(name, parents=[common], **kwargs)

    up = command("up", help="start the embedded broker (with the topics) and the MLflow server")
    up.add_argument("--no-mlflow", action="store_true", help="start only the broker")
    up.set_defaults(handler=_cmd_up)
    command("down", help="stop what `sentinel up` started").set_defaults(handler=_cmd_down)
    command("status", help="say what runs where").set_defaults(handler=_cmd_status)

    selfcheck = command("selfcheck", help="round-trip example events Kafka -> Spark -> Kafka and compare")
    selfcheck.add_argument("--events", type=int, default=3000)
    selfcheck.set_defaults(handler=_cmd_selfcheck)

    simulate = command("simulate", help="labelled Flink metric streams: to a file, to Kafka, or a dataset")
    simulate.add_argument("--list", action="store_true", help="show the scenario catalogue")
    simulate.add_argument("--scenario", action="append", metavar="NAME[:WEIGHT]",
                          help="scenario to run (repeatable; default: all); weights set the --fleet mix")
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--duration", help="event time to simulate per job, e.g. 2h, 30m (default: the scenario's)")
    pace = simulate.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=float, default=1.0, help="with --kafka: event-time seconds per second (default 1)")
    pace.add_argument("--max-speed", action="store_true", help="with --kafka: publish as fast as possible")
    target = simulate.add_mutually_exclusive_group()
    target.add_argument("--out", metavar="FILE.jsonl", help="write events (and FILE.ground_truth.jsonl)")
    target.add_argument("--kafka", action="store_true", help="publish to the input topic of the config")
    target.add_argument("--dataset", metavar="DIR", help="write a labelled dataset split into train/validation/test by job")
    simulate.add_argument("--truth", metavar="FILE", help="where to write the ground truth (JSON lines)")
    simulate.add_argument("--fleet", type=int, metavar="N", help="N concurrent jobs drawn from the scenario mix")
    simulate.add_argument("--jobs-per-scenario", type=int, default=5, help="with --dataset (default 5)")
    simulate.add_argument("--calibration-report", metavar="FILE.md",
                          help="compare the simulator's features with the real-Flink corpus (lab.corpus_dir), before "
                               "and after its calibration, and write the report")
    simulate.set_defaults(handler=_cmd_simulate)

    features = command("features", help="the feature definitions and the offline store")
    feature_actions = features.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = command("list", feature_actions, help="every feature with its family, level, unit and meaning")
    listing.add_argument("--markdown", action="store_true", help="as the Markdown table of docs/FEATURES.md")
    backfill = command("backfill", feature_actions, help="compute features from recorded events into the offline store")
    backfill.add_argument("events", nargs="*", help="JSON-lines files of input events")
    backfill.add_argument("--dataset", help="every split of a dataset folder")
    backfill.add_argument("--store", help="offline store root (default: features.offline_path)")
    features.set_defaults(handler=_cmd_features)

    train = command("train", help="retrain the detectors; promote through the champion/challenger gate")
    train.add_argument("--dataset", action="append", metavar="DIR",
                       help="labelled dataset folder (repeatable); default: a simulated one under the state folder "
                            "and the real-Flink corpus (lab.corpus_dir)")
    train.add_argument("--family", action="append", choices=FAMILIES)
    train.add_argument("--dry-run", action="store_true", help="show the gate's decision; register nothing, move no alias")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--feedback", action="store_true",
                       help="also learn from on-call's verdicts (`sentinel feedback`) on the feedback topic, with the "
                            "live feature log's rows of those incidents; the gate reports and checks them")
    train.add_argument("--jobs-per-scenario", type=int, default=3, help="for a generated dataset (default 3)")
    train.add_argument("--duration", default="90m", help="event time per generated job, at most (default 90m)")
    train.set_defaults(handler=_cmd_train)

    evaluate = command("evaluate", help="replay labelled runs with the champions and the static alarms; "
                                                   "judge every run and write a report with plots")
    evaluate.add_argument("--dataset", metavar="DIR", help="dataset folder (default: the real-Flink corpus, "
                                                           "lab.corpus_dir)")
    evaluate.add_argument("--split", default="test", choices=["train", "validation", "test"], help="default test")
    evaluate.add_argument("--report", metavar="DIR", help="report folder (default <state_dir>/reports/...)")
    evaluate.add_argument("--run", action="append", metavar="RUN_ID", help="only this run (a lab run id or a job "
                                                                          "name; repeatable)")
    evaluate.set_defaults(handler=_cmd_evaluate)

    run = command("run", help="the detection job: input topic -> features -> models -> incident topic")
    run.add_argument("--available-now", action="store_true",
                     help="process what is on the topic now, then stop (cron-style); default: run until stopped")
    run.add_argument("--timeout", type=float, metavar="SECONDS", help="stop after this long")
    run.set_defaults(handler=_cmd_run)

    replay = command("replay", help="the detection pipeline on recorded events (backtest a model)")
    replay.add_argument("inputs", nargs="+", metavar="INPUT.jsonl", help="input-contract events, one JSON per line")
    replay.add_argument("--out", required=True, metavar="INCIDENTS.jsonl", help="where the incident events go")
    replay.add_argument("--truth", action="append", metavar="GROUND_TRUTH.jsonl",
                        help="compare with labelled faults (the simulator's or the lab's ground truth)")
    replay.set_defaults(handler=_cmd_replay)

    incidents = command("incidents", help="follow the incident topic as a readable live table")
    incidents.add_argument("--from-beginning", action="store_true", help="start at the oldest incident kept")
    incidents.add_argument("--timeout", type=float, metavar="SECONDS", help="stop after this long without news")
    incidents.add_argument("--max", type=int, metavar="N", help="stop after N incident events")
    incidents.add_argument("--output", choices=["table", "json"], default="table",
                           help="table (default), or one JSON incident event per line for scripts (jq)")
    incidents.set_defaults(handler=_cmd_incidents)

    feedback = command("feedback", help="say an incident was a false positive, or confirm it (training learns from it)")
    feedback.add_argument("incident_id", metavar="INCIDENT_ID")
    verdict = feedback.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--false-positive", action="store_true", help="nothing of its family was wrong")
    verdict.add_argument("--confirmed", action="store_true", help="it was a real problem of its family")
    feedback.add_argument("--note", help="what you found (kept with the verdict)")
    feedback.add_argument("--by", metavar="NAME", help="who gives the verdict (default: the login name)")
    feedback.set_defaults(handler=_cmd_feedback)

    report = command("report", help="an HTML page per incident (plots, evidence, runbook) and an index of open ones")
    report.add_argument("--incidents", action="append", metavar="INCIDENTS.jsonl",
                        help="incident events, e.g. from `sentinel replay --out` (default: the incident topic)")
    report.add_argument("--events", action="append", metavar="EVENTS.jsonl[.gz]",
                        help="the jobs' input events (default: the input topic, the incidents' jobs only)")
    report.add_argument("--incident", action="append", metavar="INCIDENT_ID", help="only this incident's page "
                                                                                  "(repeatable; the index lists all)")
    report.add_argument("--out", metavar="DIR", help="where the pages go (default <state_dir>/incidents); serve it "
                                                     "and set alert.incident_url to link alerts to the pages")
    report.add_argument("--read-timeout", type=float, default=300.0, metavar="SECONDS",
                        help="longest time to read a topic up to its end (default 300)")
    report.set_defaults(handler=_cmd_report)

    demo = command("demo", help="what `make run` runs: the embedded stack, a simulated fleet and the job")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--fleet", type=int, default=24, help="simulated jobs (default 24: every family, healthy "
                                                            "jobs and warm-ups)")
    demo.add_argument("--fleet-duration", default="75m", help="event time per simulated job (default 75m)")
    demo.add_argument("--speed", type=float, default=60.0,
                      help="event-time seconds per wall second (default 60: the fleet's hour in a minute)")
    demo.add_argument("--jobs-per-scenario", type=int, default=3, help="for the initial training dataset")
    demo.add_argument("--duration", default="90m", help="event time per job of the initial training dataset")
    demo.set_defaults(handler=_cmd_demo)

    collect = command("collect", help="poll Flink's REST API and publish its metrics to the input topic")
    collect.add_argument("--flink-rest", action="append", metavar="URL",
                         help="JobManager REST URL, e.g. http://flink-jm:8081 (repeatable; default: collector.clusters)")
    collect.add_argument("--cluster", action="append", metavar="NAME",
                         help="the cluster name of each --flink-rest (default 'flink')")
    collect.add_argument("--interval", metavar="DURATION", help="time between polls, e.g. 5s (default collector.interval_s)")
    collect.add_argument("--once", action="store_true", help="poll every cluster once, then exit (cron-style)")
    collect.add_argument("--shard", metavar="I/N", help="poll only the jobs a hash of the job id gives to shard I of N "
                                                          "collector processes, e.g. 0/4 (default collector.shard)")
    collect.set_defaults(handler=_cmd_collect, cluster_default="flink")

    alert = command("alert", help="deliver the incident topic to Alertmanager (one alert per incident)")
    alert.add_argument("--alertmanager", action="append", metavar="URL",
                       help="Alertmanager base URL, e.g. http://alertmanager:9093 (repeatable for an HA pair; "
                            "default: alert.alertmanager_urls)")
    alert.add_argument("--resend-interval", metavar="DURATION",
                       help="how often open alerts are re-sent (default alert.resend_interval_s)")
    alert.set_defaults(handler=_cmd_alert)

    lab_command = command("lab", help="run real Flink jobs that fail in known ways; record them")
    lab_command.add_argument("scenario", nargs="?", help="a named scenario (`sentinel lab --list`)")
    lab_command.add_argument("--list", action="store_true", help="show the named scenarios, or with --grid its variants")
    lab_command.add_argument("--duration", default="4m", help="how long the job runs (default 4m)")
    lab_command.add_argument("--split", default="test", choices=["train", "validation", "test"],
                             help="dataset split the run is recorded in (default test)")
    lab_command.add_argument("--dataset", metavar="DIR", help="dataset folder (default <state_dir>/lab/dataset; "
                                                              "with --grid, lab.corpus_dir)")
    lab_command.add_argument("--no-kafka", action="store_true", help="only record; do not publish to the input topic")
    lab_command.add_argument("--keep-cluster", action="store_true", help="leave the Flink cluster running afterwards")
    lab_command.add_argument("--grid", metavar="NAME", help="record every variant of a grid (corpus, long, sql; several "
                                                            "separated by commas, in one session) not yet in the "
                                                            "dataset folder; resumable")
    lab_command.add_argument("--only", metavar="GLOB", help="with --grid: only the variants whose run id matches "
                                                               "(globs separated by commas)")
    lab_command.add_argument("--concurrency", type=int, default=3, help="with --grid: jobs running side by side "
                                                                        "(default 3)")
    lab_command.add_argument("--kafka", action="store_true", help="with --grid: also publish to the input topic")
    lab_command.add_argument("--forget", action="store_true", help="with --grid (and --only): take the recorded runs "
                                                                   "out of the dataset, to record them again")
    lab_command.add_argument("--merge-from", metavar="DIR", help="add the runs recorded in dataset folder DIR to "
                                                                  "--dataset (default lab.corpus_dir), in their splits")
    lab_command.add_argument("--flink-version", metavar="VERSION",
                             help="apache-flink version to run (default lab.flink_version); each version gets its "
                                  "own virtualenv (.venv-flink-VERSION) and cluster folder: a second cluster at once "
                                  "needs other ports (SENTINEL_LAB__REST_PORT, SENTINEL_LAB__RPC_PORT)")
    lab_command.set_defaults(handler=_cmd_lab)
    return parser


# Errors that mean "fix your setup" (exit 1), printed without a traceback: (module, class).
USER_ERRORS = (("infra.embedded_stack", "StackError"), ("pipelines.io.kafka_clients", "KafkaUnavailable"),
               ("pipelines.spark_session", "JavaMissing"), ("models.validation", "TrainingSetInvalid"),
               ("models.registry", "ModelUnavailable"), ("infra.flink_cluster", "FlinkClusterError"),
               ("pipelines.collector.ledger", "LedgerError"), ("pipelines.lab", "LabError"),
               ("pipelines.detection.spark_state", "UnsupportedPySpark"),
               ("pipelines.alerting", "AlertmanagerUnavailable"), ("pipelines.reports.incident_page", "UnknownIncident"),
               ("pipelines.io.storage", "StorageError"))


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` means "fix your setup". Only modules already imported are looked in: an
    error's class exists only once its module is imported, and importing them all to match one
    (MLflow, scikit-learn and Great Expectations among them) would make a setup error slow to
    report (see BENCHMARKS.md, "A command's setup error (`benchmarks/cli_setup_error.py`)")."""
    if isinstance(exc, FileNotFoundError):
        return True
    for module, name in USER_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(exc, getattr(loaded, name)):
            return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.config = getattr(args, "config", None)
    args.verbose = getattr(args, "verbose", False)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("great_expectations").setLevel(logging.INFO if args.verbose else logging.WARNING)
    handler: Callable[[SentinelConfig, argparse.Namespace], int] = args.handler
    from pipelines.simulator import SimulationError

    try:
        config = load_config(args.config)
        return handler(config, args)
    except (ConfigError, SimulationError, UsageError) as exc:
        print(f"sentinel {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        if not is_user_error(exc):
            raise
        print(f"sentinel {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("sentinel: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
