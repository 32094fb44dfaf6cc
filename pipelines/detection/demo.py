"""`make run`: a simulated fleet through the real detection job, incidents shown as they come.

The fleet (by default one job of every scenario: healthy jobs, warm-ups and every failure
family) is simulated to end *now* and published to the input topic at ``speed`` times event
time, while the detection job runs in this process on its own checkpoint (so each demo starts
clean and reads only its own events). Incidents are printed as they reach the incident topic;
at the end the injected faults are compared with the incidents.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from pipelines import simulator
from pipelines.config import SentinelConfig
from pipelines.detection.champions import ChampionCache
from pipelines.detection.job import DETECTION_QUERY, start_detection
from pipelines.incidents.comparison import compare
from pipelines.io import kafka_clients
from pipelines.io.kafka_stream import has_read_to, topic_end_offsets
from pipelines.reports.backtest import config_with_truth_overrides
from pipelines.reports.incident_view import HEADER, format_incident
from pipelines.simulator.publish import publish_to_kafka

FLEET_SEED_OFFSET = 1000  # never the jobs the initial models were trained on


def run_demo(config: SentinelConfig, fleet: int = 24, seed: int = 0, duration: str = "75m", speed: float = 60.0,
             settle_s: float = 120.0, out=print) -> dict:
    from pipelines.spark_session import build_spark

    kafka = config.kafka
    kafka_clients.ensure_topics(kafka.bootstrap_servers, kafka.client_kwargs(),
                                [config.topics.input, config.topics.incidents, config.topics.dead_letter],
                                kafka.topic_partitions)
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    duration_ms = simulator.parse_duration(duration)
    start_ts = int(time.time() * 1000) - duration_ms
    names = list(simulator.CATALOGUE)
    jobs = [simulator.simulate_job(name, seed + FLEET_SEED_OFFSET, i, duration_ms,
                                   cluster=("demo-eu", "demo-us")[i % 2], start_ts=start_ts)
            for i, name in enumerate((names * (fleet // len(names) + 1))[:fleet])]
    events = list(simulator.merged_events(jobs))
    out(f"\nfleet: {len(jobs)} simulated jobs ({sum(1 for j in jobs if j.truth['faults'])} with faults), "
        f"{len(events)} events over {duration_ms / 60000:.0f} min of event time, published at {speed:g}x")

    # The job reads from the current end of the topic, on a checkpoint of its own. The fleet's
    # operators know which of their jobs warm up for long (windows of half an hour, CEP
    # patterns): that knowledge is the demo's job overrides.
    demo_config = config_with_truth_overrides(config, [j.truth for j in jobs]).model_copy(deep=True)
    for override in demo_config.detection.job_overrides[:len(demo_config.detection.job_overrides)
                                                        - len(config.detection.job_overrides)]:
        out(f"  operator knowledge: {override.job_name} warms up for {override.warmup_horizon_s / 60:.0f} min")
    demo_config.spark.checkpoint_location = Path(config.state_dir) / "demo" / run_id / "checkpoints"
    demo_config.kafka.starting_offsets = json.dumps(
        {str(p): o for p, o in topic_end_offsets(config, config.topics.input).items()})
    incidents_start = topic_end_offsets(config, config.topics.incidents)

    cache = ChampionCache(demo_config)
    cache.require()
    spark = build_spark(demo_config, "demo")
    job = start_detection(spark, demo_config, cache)
    published = {"n": 0, "error": None}

    def publish() -> None:
        try:
            published["n"] = publish_to_kafka(events, demo_config, speed=speed)
        except Exception as exc:  # shown below; the demo then stops
            published["error"] = exc

    publisher = threading.Thread(target=publish, name="demo-publisher", daemon=True)
    started = time.monotonic()
    publisher.start()

    consumer = kafka_clients.make_consumer(kafka.bootstrap_servers, kafka.client_kwargs())
    kafka_clients.assign_from(consumer, config.topics.incidents, incidents_start)
    job_ids = {j.truth["job_id"] for j in jobs}
    incidents: list[dict] = []
    out(HEADER)
    last_progress, caught_up_at = 0.0, None
    try:
        while True:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    incident = json.loads(record.value)
                    if incident.get("job_id") in job_ids:
                        incidents.append(incident)
                        out(format_incident(incident))
            now = time.monotonic()
            if published["error"] is not None:
                raise published["error"]
            if now - last_progress >= 10:
                last_progress = now
                progress = next((q.lastProgress for q in job.queries if q.name == DETECTION_QUERY), None)
                out(f"  ... {now - started:.0f}s: {published['n'] or 'publishing'} events sent, detection batch "
                    f"{progress['batchId'] if progress else '-'}, {len(incidents)} incident events so far")
            for q in job.queries:
                if q.exception() is not None:
                    raise q.exception()
            if not publisher.is_alive():
                if caught_up_at is None and _caught_up(job, demo_config):
                    caught_up_at = now
                if (caught_up_at is not None and now - caught_up_at >= 3 * _trigger_s(demo_config)) or \
                        now - started > duration_ms / 1000 / speed + settle_s:
                    break
    finally:
        consumer.close()
        job.stop()
    comparison = compare([j.truth for j in jobs], incidents)
    summary = DemoSummary.of(comparison, [j.truth for j in jobs])
    out(f"\nsummary after {time.monotonic() - started:.0f}s: the faults the simulator injected against the incidents")
    for line in summary.lines():
        out(line)
    return {"jobs": jobs, "incidents": incidents, "comparison": comparison, "summary": summary}


@dataclass
class DemoSummary:
    """The demo's judgement as a newcomer reads it. A fault whose only incident opened before its
    labelled onset (the simulator labels the onset of the cause; its signal can show a little
    sooner) on the same job, vertex and family is counted once, as *early*: neither missed nor
    false, which :func:`~pipelines.incidents.comparison.compare` would count it as, twice."""

    detected: list[dict]
    early: list[dict]  # {family, job_name, vertex_name, lead_s, summary}
    missed: list[dict]
    false: list[dict]
    healthy_jobs: int

    @classmethod
    def of(cls, comparison, truths: list[dict]) -> "DemoSummary":
        from pipelines.families import LOCALISED

        faults_of = {t["job_id"]: t.get("faults") or [] for t in truths}
        early, missed, false = [], [], []
        for run in comparison.runs:
            taken: set[int] = set()  # the run's false incidents that are an early catch
            for gap in run.missed:
                fault = next((f for f in faults_of.get(run.job_id, []) if f["family"] == gap["family"]
                              and f.get("vertex_name") == gap.get("vertex_name")), None)
                catch = None if fault is None else next(
                    (index for index, incident in enumerate(run.false) if index not in taken
                     and incident["family"] == fault["family"] and int(incident["opened_at"]) < fault["onset_ts"]
                     and (fault["family"] not in LOCALISED or not fault.get("vertex_id")
                          or incident.get("vertex_id") == fault["vertex_id"])), None)
                if catch is None:
                    missed.append({**gap, "job_name": run.run})
                    continue
                taken.add(catch)
                early.append({"family": gap["family"], "job_name": run.run, "vertex_name": gap.get("vertex_name"),
                              "lead_s": (fault["onset_ts"] - int(run.false[catch]["opened_at"])) / 1000})
            false += [incident for index, incident in enumerate(run.false) if index not in taken]
        return cls(comparison.detected, early, missed, false, sum(r.healthy for r in comparison.runs))

    def lines(self) -> list[str]:
        from statistics import median

        from pipelines.display import fit, printable

        faults = len(self.detected) + len(self.early) + len(self.missed)
        delays = [d["delay_s"] for d in self.detected]
        out = [f"  {faults} faults injected: {len(self.detected)} detected, {len(self.early)} early, "
               f"{len(self.missed)} missed; {len(self.false)} false incidents"
               + (f"; median delay {median(delays):.0f}s after the labelled onset" if delays else "")]
        for d in self.detected:
            when = f"after {d['delay_s']:.0f}s" if d["delay_s"] >= 0 else f"{-d['delay_s']:.0f}s before the onset"
            where = printable(d.get("vertex_name") or "") + ("" if d["localised"] else " (ON ANOTHER VERTEX)")
            out.append(f"  detected {fit(d['family'], 18)} {fit(d['job_name'], 28)} {fit(where, 28)} {when}"
                       + (" (as a symptom)" if d["as_symptom"] else ""))
        for e in self.early:
            out.append(f"  EARLY    {fit(e['family'], 18)} {fit(e['job_name'], 28)} "
                       f"{fit(printable(e.get('vertex_name') or ''), 28)} {e['lead_s']:.0f}s before the labelled onset")
        for m in self.missed:
            out.append(f"  MISSED   {fit(m['family'], 18)} {fit(m['job_name'], 28)} "
                       f"{fit(printable(m.get('vertex_name') or ''), 28)}")
        for f in self.false:
            out.append(f"  FALSE    {fit(f['family'], 18)} {fit(f['job_name'], 28)} "
                       f"{fit(printable(f.get('vertex_name') or ''), 28)} {fit(f['summary'], 60).rstrip()}")
        out += ["", "what the lines mean:",
                "  detected  an incident of the fault's family on its job opened after (or just before) the labelled onset",
                "  EARLY     the fault's incident opened more than a minute before the onset the simulator labelled,",
                "            on the same job, vertex and family: caught early, counted neither missed nor false",
                "  MISSED    no incident of the fault's family on its job",
                f"  FALSE     an incident no injected fault explains: on one of the {self.healthy_jobs} healthy jobs; on a",
                "            faulty job, one of another family or place, or of the fault's own family and place that",
                "            opened more than a minute before its onset while a later incident caught the fault"]
        return out


def _trigger_s(config: SentinelConfig) -> float:
    number, _, unit = config.spark.trigger_interval.partition(" ")
    return float(number) * (60 if unit.startswith("minute") else 1)


def _caught_up(job, config: SentinelConfig) -> bool:
    """The detection query has read everything on the input topic."""
    progress = next((q.lastProgress for q in job.queries if q.name == DETECTION_QUERY), None)
    return has_read_to(progress, config.topics.input, topic_end_offsets(config, config.topics.input))
