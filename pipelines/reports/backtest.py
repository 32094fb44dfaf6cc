"""``sentinel evaluate``: replay labelled runs through the live pipeline and judge every run.

Each run of a dataset split (the simulator's or the lab's layout) is replayed exactly as
``sentinel replay`` does (validation, features, the champions, their post-rules, the incident
policy), and, on the same feature rows through the same policy, by the static alarms operators
use today. Both are judged run by run by :func:`pipelines.incidents.comparison.compare`. The report
is a table per run (expected families, what was found and how soon, false incidents, whether the
right vertex was named), per-family totals next to the baseline, and a plot per run of its
decisive metric over time with the onset and the incidents marked.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from models.evaluation import replay_incidents, static_alarms, truth_overrides
from models.registry import LoadedDetector
from pipelines.config import JobOverride as JobOverrideConfig
from pipelines.config import SentinelConfig
from pipelines.datasets import dataset_files, read_truths
from pipelines.display import fit
from pipelines.families import BY_NAME, FAMILIES, Plot
from pipelines.incidents import lead_time
from pipelines.incidents.comparison import Comparison, RunOutcome, compare
from pipelines.incidents.policy import PolicySettings

# A fault that ends: its incident resolves within the policy's clear time and this much more.
ENDING_GRACE_S = 60.0
# What a healthy run's plot shows (a faulty run's: its family's decisive plot, where it has one).
HEALTHY_PLOT = Plot("state_size_bytes", "state (bytes)")
# The marks of incidents of a family the registry does not know.
UNKNOWN_COLOUR = "blue"


@dataclass
class Evaluation:
    split: str
    comparison: Comparison
    baseline: Comparison
    rows: pd.DataFrame
    incidents: list[dict]
    baseline_incidents: list[dict]
    versions: dict[str, str]
    truths: list[dict]
    strata: dict[str, str] = field(default_factory=dict)  # run -> its Flink version, job kind and length
    lead: list[lead_time.LeadTime] = field(default_factory=list)  # runs with a checkpoint failure: the champions'
    baseline_lead: list[lead_time.LeadTime] = field(default_factory=list)  # and the static alarms' (no forecast)
    resolve_after_s: float = 600.0  # the policy's clear time: a fault that ends resolves this long after
    # runs whose checkpoints never failed, warned all the same (the champions'; static alarms never forecast)
    unfailing_warned: list[lead_time.WarningWithoutFailure] = field(default_factory=list)

    def ending_lines(self) -> list[str]:
        """Per fault that ends in its run (a leak fixed): when it ended, when its incidents
        resolved, and whether within the clear time and a minute (the champions, then the static
        alarms); none when no fault ends."""
        ended = self.comparison.ended
        if not ended:
            return []
        bound = self.resolve_after_s + ENDING_GRACE_S
        header = (f"{'run':<58} {'family':<12} {'ended at':>8} {'resolved':>8} {'after end':>9} {'resolution':<14}"
                  f" {'in time':>7} | {'static: after end':>17}")
        lines = [header, "-" * len(header)]
        starts = {t.get("run_id") or t["job_name"]: t.get("start_ts") for t in self.truths}
        baseline = {(f["job_name"], f["family"]): f for f in self.baseline.ended}
        for f in ended:
            start = starts.get(f["job_name"]) or f["ended_at"]
            after, base = f["resolved_after_end_s"], baseline.get((f["job_name"], f["family"]))
            lines.append(f"{fit(f['job_name'], 58)} {fit(f['family'], 12)} {_ms(f['ended_at'] - start):>8}"
                         f" {_ms(None if f['resolved_at'] is None else f['resolved_at'] - start):>8}"
                         f" {_sec(after if after is not None else float('nan')):>9} {fit(f['resolution'] or 'still open', 14)}"
                         f" {_yes(None if after is None else after <= bound):>7} |"
                         f" {_sec(base['resolved_after_end_s'] if base and base['resolved_after_end_s'] is not None else float('nan')):>17}")
        in_time = sum(f["resolved_after_end_s"] is not None and f["resolved_after_end_s"] <= bound for f in ended)
        lines.append(f"{in_time} of {len(ended)} resolved within the clear time ({self.resolve_after_s:.0f} s) and"
                     f" {ENDING_GRACE_S:.0f} s of the fault's end")
        return lines

    def lead_lines(self) -> list[str]:
        """Per run with a checkpoint failure: the first failure, the first warning, the lead time,
        the ETA at the warning against the real time and whether its band held it, the static
        alarms' lead time; then per cause the medians."""
        if not self.lead:
            return []
        header = (f"{'run':<58} {'cause':<18} {'build-up':>8} {'failed at':>9} {'warned at':>9} {'lead':>6}"
                  f" {'ETA (band)':<18} {'error':>6} {'held':>4} {'in time':>7} | {'static lead':>11}")
        lines = [header, "-" * len(header)]
        baseline = {r.job_id: r for r in self.baseline_lead}
        starts = {t["job_id"]: t.get("start_ts") for t in self.truths}
        for run in self.lead:
            start = starts.get(run.job_id) or run.first_failure_ts
            base = baseline.get(run.job_id)
            lines.append(
                f"{fit(run.run, 58)} {fit(run.cause, 18)} {_ms(run.build_up_ms):>8} {_ms(run.first_failure_ts - start):>9}"
                f" {_ms(None if run.warning_ts is None else run.warning_ts - start):>9} {_ms(run.lead_ms):>6}"
                f" {fit(_eta(run), 18)} {_ratio(run.eta_error):>6} {_yes(run.band_held):>4} {_yes(run.warned_in_time):>7}"
                f" | {_ms(base.lead_ms if base else None):>11}")
        lines += ["", f"{'cause':<19} {'runs':>4} {'warned':>6} {'median lead':>11} {'median |ETA error|':>18}"
                      f" {'band held':>9} {'build-ups warned in time':>24} | {'static: median lead':>19}"]
        for cause in sorted({r.cause for r in self.lead}) + [None]:
            m, b = lead_time.summary(self.lead, cause), lead_time.summary(self.baseline_lead, cause)
            in_time = f"{m['warned_in_time']:.0f} of {m['build_ups']:.0f}"
            lines.append(f"{cause or 'all':<19} {m['runs']:>4.0f} {m['warned']:>6.0f} {_sec(m['lead_s_median']):>11}"
                         f" {_pct(m['eta_error_median']):>18} {_pct(m['band_held']):>9} {in_time:>24}"
                         f" | {_sec(b['lead_s_median']):>19}")
        return lines

    def unfailing_warning_lines(self) -> list[str]:
        """Per run whose checkpoints never failed but were forecast to (within the warning
        horizon): the first warning, and whether a warning's band passed while the run went on
        (overdue); then how many healthy and faulty runs were warned."""
        unfailing = [t for t in self.truths if not lead_time.fails(t)]
        healthy = sum(not t.get("faults") for t in unfailing)
        warned = self.unfailing_warned
        header = f"{'run':<58} {'run is':<8} {'warned at':>9} {'by':<14} {'ETA':>6} {'overdue':>7} metric"
        lines = [header, "-" * len(header)] if warned else []
        starts = {t["job_id"]: t.get("start_ts") for t in self.truths}
        for w in warned:
            start = starts.get(w.job_id) or w.warning_ts
            lines.append(f"{fit(w.run, 58)} {'healthy' if w.healthy else 'faulty':<8} {_ms(w.warning_ts - start):>9}"
                         f" {fit(w.family, 14)} {_ms(w.eta_ms):>6} {_yes(w.overdue):>7} {w.metric}")
        on_healthy = [w for w in warned if w.healthy]
        on_faulty = [w for w in warned if not w.healthy]
        lines.append(f"healthy runs warned: {len(on_healthy)} of {healthy} (overdue {sum(w.overdue for w in on_healthy)});"
                     f" faulty runs whose checkpoints never failed, warned: {len(on_faulty)} of"
                     f" {len(unfailing) - healthy} (overdue {sum(w.overdue for w in on_faulty)})")
        return lines

    def stratum_lines(self) -> list[str]:
        """A line per Flink version, job kind and run length (the dataset manifest's), the
        champions next to the static alarms; none when the runs carry no such labels."""
        if not self.strata:
            return []
        header = (f"{'runs':<30} {'n':>3} {'faults found':>12} {'false (healthy)':>15} {'false families':>14}"
                  f" {'median delay':>12} | {'static: found':>13} {'false (healthy)':>15} {'false families':>14}"
                  f" {'median delay':>12}")
        lines = [header, "-" * len(header)]
        for stratum, (_, m, b) in self.stratum_metrics().items():
            lines.append(f"{fit(stratum, 30)} {m['runs']:>3.0f} {_of(m):>12} {m['false_incidents_on_healthy']:>15.0f}"
                         f" {m['false_families_on_faulty']:>14.0f} {_sec(m['delay_s_median']):>12} | {_of(b):>13}"
                         f" {b['false_incidents_on_healthy']:>15.0f} {b['false_families_on_faulty']:>14.0f}"
                         f" {_sec(b['delay_s_median']):>12}")
        return lines

    def stratum_metrics(self) -> dict[str, tuple[list[str], dict, dict]]:
        """Each stratum's runs and metrics, the champions' and the static alarms', in table order."""
        result = {}
        for stratum in sorted(set(self.strata.values()), key=_stratum_order):
            runs = sorted(run for run, s in self.strata.items() if s == stratum)
            result[stratum] = (runs, Comparison([r for r in self.comparison.runs if r.run in runs]).metrics(),
                               Comparison([r for r in self.baseline.runs if r.run in runs]).metrics())
        return result

    def run_lines(self) -> list[str]:
        """A line per run; its names made printable and fitted to their columns."""
        header = (f"{'run':<58} {'expected':<34} {'found (delay s)':<40} {'false':<28} {'vertex':<7}"
                  f" | {'static alarms: found':<28} false")
        lines = [header, "-" * len(header)]
        baseline = {r.job_id: r for r in self.baseline.runs}
        for run in self.comparison.runs:
            base = baseline[run.job_id]
            lines.append(f"{fit(run.run, 58)} {fit(', '.join(run.expected) or 'healthy', 34)} {fit(_found(run), 40)} "
                         f"{fit(_false(run), 28)} {_localised(run):<7} | {fit(_found(base), 28)} {len(base.false)}")
        return lines

    def family_lines(self) -> list[str]:
        header = (f"{'family':<19} {'faults':>6} {'found':>6} {'recall':>7} {'on vertex':>9} {'median delay':>12}"
                  f" {'false':>6} | {'static: found':>13} {'recall':>7} {'median delay':>12} {'false':>6}")
        lines = [header, "-" * len(header)]
        for family in (*FAMILIES, None):
            m, b = self.comparison.metrics(family), self.baseline.metrics(family)
            if family is not None and not m["faults"] and not m["false_incidents"] and not b["false_incidents"]:
                continue
            lines.append(f"{family or 'all':<19} {m['faults']:>6.0f} {m['faults_found']:>6.0f} {_pct(m['fault_recall']):>7}"
                         f" {_pct(m['localised']):>9} {_sec(m['delay_s_median']):>12} {m['false_incidents']:>6.0f} |"
                         f" {b['faults_found']:>13.0f} {_pct(b['fault_recall']):>7} {_sec(b['delay_s_median']):>12}"
                         f" {b['false_incidents']:>6.0f}")
        m, b = self.comparison.metrics(), self.baseline.metrics()
        lines.append(f"healthy runs: {m['healthy_runs']:.0f}; false incidents per healthy run {_num(m['false_incidents_per_healthy_run'])}"
                     f" (static alarms {_num(b['false_incidents_per_healthy_run'])}); false families on faulty runs "
                     f"{m['false_families_on_faulty']:.0f} (static alarms {b['false_families_on_faulty']:.0f})")
        return lines


def _of(metrics: dict) -> str:
    return f"{metrics['faults_found']:.0f} of {metrics['faults']:.0f}"


def _stratum_order(stratum: str) -> tuple:
    version = stratum.split(" ")[1] if stratum.startswith("Flink ") else ""
    return (tuple(-int(p) for p in version.split(".") if p.isdigit()), stratum)


def run_strata(dataset: Path) -> dict[str, str]:
    """Each run's stratum from the dataset's manifest (``Flink 2.3.0 datastream short``); runs
    the manifest does not describe (the simulator's) have none."""
    path = Path(dataset) / "manifest.json"
    runs = json.loads(path.read_text()).get("runs", {}) if path.is_file() else {}
    return {run: f"Flink {entry['flink_version']} {entry.get('job_kind', 'datastream')} {entry.get('length', 'short')}"
            for run, entry in runs.items() if entry.get("flink_version")}


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0%}"


def _sec(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value / 1000:.0f}s"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def _eta(run: lead_time.LeadTime) -> str:
    if run.eta_ms is None:
        return "-" if run.warning_ts is None else "no forecast"
    high = "?" if run.eta_high_ms is None else f"{run.eta_high_ms / 1000:.0f}"
    return f"{run.eta_ms / 1000:.0f}s ({(run.eta_low_ms or 0) / 1000:.0f}-{high})"


def _num(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _found(run: RunOutcome) -> str:
    found = [f"{f['family']}{'*' if f['as_symptom'] else ''} {f['delay_s']:.0f}" for f in run.found]
    missed = [f"MISSED {m['family']}" for m in run.missed]
    return ", ".join(found + missed) or "-"


def _false(run: RunOutcome) -> str:
    return ", ".join(f"{i['family']}@{i.get('vertex_name') or 'job'}" for i in run.false) or "-"


def _localised(run: RunOutcome) -> str:
    if not run.found:
        return "-"
    return "yes" if all(f["localised"] for f in run.found) else "NO"


def config_with_truth_overrides(config: SentinelConfig, truths: Sequence[dict]) -> SentinelConfig:
    """The config plus the operator knowledge a dataset declares per job (its ground truth's
    warm-up horizons), tried before the configured overrides."""
    declared = [JobOverrideConfig(job_name=o.job_name, warmup_horizon_s=o.warmup_horizon_s)
                for o in truth_overrides(truths)]
    if not declared:
        return config
    copy = config.model_copy(deep=True)
    copy.detection.job_overrides = declared + list(config.detection.job_overrides)
    return copy


def evaluate_dataset(config: SentinelConfig, dataset: Path, split: str,
                     models: dict[str, LoadedDetector]) -> Evaluation:
    """Replay one split of a dataset with ``models`` and with the static alarms; judge both."""
    from pipelines.detection.flink_job import replay

    events, truth_files = dataset_files(dataset, (split,))
    if not events:
        raise FileNotFoundError(f"{dataset} has no {split} split")
    truths = read_truths(truth_files)
    config = config_with_truth_overrides(config, truths)
    result = replay(config, events, models)
    settings = PolicySettings.from_config(config)
    # The static alarms as operators use them: no forecast opens an incident.
    baseline_incidents = (replay_incidents(result.rows, static_alarms(), settings.without_predictions())
                          if len(result.rows) else [])
    strata = run_strata(dataset)
    named = {t.get("run_id") or t["job_name"] for t in truths}

    def horizon_ms(job_name: str) -> float:
        return settings.for_job(job_name).warning_horizon_s * 1000

    return Evaluation(split, compare(truths, result.incidents), compare(truths, baseline_incidents), result.rows,
                      result.incidents, baseline_incidents, {f: m.version for f, m in models.items()}, truths,
                      {run: s for run, s in strata.items() if run in named},
                      lead_time.lead_times(truths, result.incidents, horizon_ms),
                      lead_time.lead_times(truths, baseline_incidents, horizon_ms, with_forecasts=False),
                      settings.resolve_after_ms / 1000.0,
                      lead_time.warnings_without_failure(truths, result.incidents, horizon_ms))


def write_report(evaluation: Evaluation, directory: Path, title: str) -> Path:
    """``index.md`` with the tables, ``results.json`` with every run's outcome, ``plots/*.png``,
    and the incident events of the champions and of the static alarms as JSON lines."""
    directory = Path(directory)
    (directory / "plots").mkdir(parents=True, exist_ok=True)
    sections = [f"# {title}", "",
                f"Split `{evaluation.split}`, {len(evaluation.comparison.runs)} runs; models: "
                + ", ".join(f"{f} v{v}" for f, v in sorted(evaluation.versions.items())), "",
                "## Per family (the champions | the static alarms, through the same policy)", "", "```",
                *evaluation.family_lines(), "```", "",
                *(["## Per Flink version, job kind and run length (the champions | the static alarms)", "", "```",
                   *evaluation.stratum_lines(), "```", ""] if evaluation.strata else []),
                "## Per run (`*`: found as a symptom of its cause's incident; delay from the labelled onset)", "",
                "```", *evaluation.run_lines(), "```", "",
                *(["## Before the first failed checkpoint (lead time: from the first warning to the first failure)",
                   "", "```", *evaluation.lead_lines(), "```", ""] if evaluation.lead else []),
                "## Warnings on runs whose checkpoints never failed", "", "```",
                *evaluation.unfailing_warning_lines(), "```", "",
                *(["## Faults that end (a fixed leak: its incident resolves)", "", "```", *evaluation.ending_lines(),
                   "```", ""] if evaluation.comparison.ended else []),
                "## Runs", ""]
    for run in evaluation.comparison.runs:
        path = _plot_run(evaluation, run, directory / "plots")
        sections += [f"### {run.run}", "", f"expected: {', '.join(run.expected) or 'healthy'}; found: {_found(run)};"
                     f" false: {_false(run)}", "", f"![{run.run}](plots/{path.name})", ""]
    (directory / "index.md").write_text("\n".join(sections) + "\n")
    results = {"split": evaluation.split, "versions": evaluation.versions,
               "metrics": {f or "all": evaluation.comparison.metrics(f) for f in (*FAMILIES, None)},
               "baseline_metrics": {f or "all": evaluation.baseline.metrics(f) for f in (*FAMILIES, None)},
               "strata": {stratum: {"runs": runs, "metrics": m, "baseline_metrics": b}
                          for stratum, (runs, m, b) in evaluation.stratum_metrics().items()},
               "lead_times": [_lead(r) for r in evaluation.lead],
               "baseline_lead_times": [_lead(r) for r in evaluation.baseline_lead],
               "warnings_without_failure": [asdict(w) for w in evaluation.unfailing_warned],
               "ended": evaluation.comparison.ended, "baseline_ended": evaluation.baseline.ended,
               "resolve_after_s": evaluation.resolve_after_s,
               "runs": [{"run": r.run, "job_id": r.job_id, "expected": r.expected, "found": r.found,
                         "missed": r.missed, "false": [_brief(i) for i in r.false], "false_families": r.false_families}
                        for r in evaluation.comparison.runs]}
    (directory / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    # Every incident event of both replays, as the topic would carry them, for a closer look.
    for name, incidents in (("incidents.jsonl", evaluation.incidents),
                            ("static_alarm_incidents.jsonl", evaluation.baseline_incidents)):
        (directory / name).write_text("".join(json.dumps(i, sort_keys=True, default=str) + "\n" for i in incidents))
    return directory / "index.md"


def _lead(run: lead_time.LeadTime) -> dict:
    return {**{k: getattr(run, k) for k in ("run", "job_id", "cause", "first_failure_ts", "build_up_ms", "warning_ts",
                                            "warning_family", "eta_ms", "eta_low_ms", "eta_high_ms", "metric")},
            "lead_ms": run.lead_ms, "eta_error": run.eta_error, "band_held": run.band_held,
            "warned_in_time": run.warned_in_time}


def _brief(incident: dict) -> dict:
    return {k: incident.get(k) for k in ("incident_id", "family", "vertex_name", "opened_at", "summary")}


def _plot_run(evaluation: Evaluation, run: RunOutcome, directory: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = evaluation.rows[evaluation.rows["job_id"] == run.job_id]
    family = BY_NAME.get(run.expected[0]) if run.expected else None
    plot = (family.decisive_plot if family else None) or HEALTHY_PLOT
    column, label = plot.column, plot.label
    fault_vertex = next((f.get("vertex_name") for f in run.found + run.missed if f.get("vertex_name")), None)
    if column.startswith(("vertex_", "others_", "records_in")) and fault_vertex:
        series = rows[rows["vertex_name"] == fault_vertex]
    elif column.startswith(("vertex_", "others_", "records_in")):
        series = rows[rows["vertex_id"].notna()].sort_values(column).groupby("ts", as_index=False).last()
    else:
        series = rows[rows["vertex_id"].isna()]
    series = series.sort_values("ts")
    start = rows["ts"].min() if len(rows) else 0
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.plot((series["ts"] - start) / 1000.0, series[column], color="black", linewidth=1, label=label)
    ax.set_xlabel("seconds since the job was first seen")
    ax.set_ylabel(label)
    ax.set_title(f"{run.run} ({', '.join(run.expected) or 'healthy'})", fontsize=9)
    truth = next(t for t in evaluation.truths if t["job_id"] == run.job_id)
    for onset in sorted({f["onset_ts"] for f in truth.get("faults") or []}):
        ax.axvline((onset - start) / 1000.0, color="green", linestyle="--", linewidth=1)
    for incidents, style in ((evaluation.incidents, "-"), (evaluation.baseline_incidents, ":")):
        for incident in incidents:
            if incident["job_id"] == run.job_id and incident["event"] == "opened":
                ax.axvline((incident["opened_at"] - start) / 1000.0, color=_colour(incident["family"]),
                           linestyle=style, linewidth=1.5 if style == "-" else 1)
    ax.text(0.01, 0.95, "green --: onset; solid: incident opened (colour = family); dotted: static alarm",
            transform=ax.transAxes, fontsize=7, va="top")
    fig.tight_layout()
    path = directory / f"{run.run.replace('/', '_')}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _colour(family: str) -> str:
    return BY_NAME[family].colour if family in BY_NAME else UNKNOWN_COLOUR
