"""Labelled faults against incidents, run by run: found, missed, false, delays, localisation.

The one judgement every consumer uses: ``sentinel replay --truth``, ``sentinel evaluate``, the
demo's summary, the retraining gate and the tests. A *run* is one job with its ground-truth line
(the simulator's and the lab's shape). A fault is **found** by the first incident of its family
on the job, or the first incident that names its family among its ``symptoms``, opened no earlier
than ``EARLY_GRACE_MS`` before the fault became detectable (its onset, or its cause's for a
symptom whose cause the run's ground truth lists too); the delay runs from the onset to that
moment (negative when it came first). It is
**localised** when the incident names the fault's vertex (job-level families always are).

A fault that **ends** in its run (its ``end_ts``: a leak that was fixed) is judged on how its
incidents (its family at its place) ended too: how long after the fault's end the last of them
resolved (``resolved_after_end_s``), or that one never did (None: a pager that would not stop).
A fault found only as a symptom of another cause's incident is that cause's, and is not judged so.

Every other opened incident is **false**, anomalies included: on a healthy run any incident is
one too many. A **false family** is a family an incident claims on a faulty run (as its family or
a symptom) that the run does not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Iterable, Sequence

from pipelines.display import fit, printable
from pipelines.families import BY_NAME, EXPLAINED_BY, LOCALISED

EARLY_GRACE_MS = 60_000


@dataclass
class RunOutcome:
    run: str  # the lab's run id, else the job name
    job_id: str
    scenario: str
    expected: list[str]  # families of the run's faults ([] for a healthy run)
    # {family, vertex_name, delay_s, localised, incident_id, as_symptom}, and for a fault that ends:
    # {ended_at, resolved_at, resolution, resolved_after_end_s}
    found: list[dict] = field(default_factory=list)
    missed: list[dict] = field(default_factory=list)  # {family, vertex_name}
    false: list[dict] = field(default_factory=list)  # the opened incidents that match no fault
    false_families: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.expected

    @property
    def ok(self) -> bool:
        return not self.missed and not self.false and all(f["localised"] for f in self.found)


@dataclass
class Comparison:
    runs: list[RunOutcome]

    @property
    def detected(self) -> list[dict]:
        return [{**f, "job_name": r.run} for r in self.runs for f in r.found]

    @property
    def missed(self) -> list[dict]:
        return [{**m, "job_name": r.run} for r in self.runs for m in r.missed]

    @property
    def ended(self) -> list[dict]:
        """The found faults that ended in their run, each with how its incident ended."""
        return [f for f in self.detected if "ended_at" in f]

    @property
    def false(self) -> list[dict]:
        return [i for r in self.runs for i in r.false]

    @property
    def anomalies(self) -> list[dict]:
        """False incidents of the unsupervised family: what no failure family explained."""
        return [i for i in self.false if not BY_NAME[i["family"]].supervised]

    def metrics(self, family: str | None = None) -> dict[str, float]:
        """Recall of faults, false incidents and families, delays; for one family or all."""
        def of(items, key="family"):
            return [i for i in items if family is None or i[key] == family]
        found = [f for r in self.runs for f in of(r.found)]
        faults = len(found) + sum(len(of(r.missed)) for r in self.runs)
        healthy = [r for r in self.runs if r.healthy]
        delays = [f["delay_s"] for f in found]
        return {
            "runs": float(len(self.runs)), "faults": float(faults), "faults_found": float(len(found)),
            "fault_recall": len(found) / faults if faults else float("nan"),
            "localised": sum(f["localised"] for f in found) / len(found) if found else float("nan"),
            "healthy_runs": float(len(healthy)),
            "false_incidents_on_healthy": float(sum(len(of(r.false)) for r in healthy)),
            "false_incidents_per_healthy_run": (sum(len(of(r.false)) for r in healthy) / len(healthy)
                                                if healthy else float("nan")),
            "false_incidents": float(sum(len(of(r.false)) for r in self.runs)),
            "false_families_on_faulty": float(sum(len([f for f in r.false_families if family in (None, f)])
                                                  for r in self.runs if not r.healthy)),
            "delay_s_median": median(delays) if delays else float("nan"),
            "delay_s_max": max(delays) if delays else float("nan"),
        }

    def lines(self) -> list[str]:
        """The totals, then a line per fault found or missed and per false incident; names in
        columns, made printable (they come from the jobs and the ground truth)."""
        m = self.metrics()
        out = [f"injected faults: {m['faults']:.0f}   detected: {m['faults_found']:.0f}   missed: "
               f"{len(self.missed)}   false incidents: {m['false_incidents']:.0f} (on healthy jobs: "
               f"{m['false_incidents_on_healthy']:.0f})   unexplained (anomaly): {len(self.anomalies)}"
               + (f"   median delay: {m['delay_s_median']:.0f}s" if found_any(m) else "")]
        for d in self.detected:
            when = f"after {d['delay_s']:.0f}s" if d["delay_s"] >= 0 else f"{-d['delay_s']:.0f}s before the onset"
            where = printable(d.get("vertex_name") or "") + ("" if d["localised"] else " (ON ANOTHER VERTEX)")
            how = " (as a symptom)" if d["as_symptom"] else ""
            out.append(f"  detected {fit(d['family'], 18)} {fit(d['job_name'], 28)} {fit(where, 28)} {when}{how}")
        for m_ in self.missed:
            out.append(f"  MISSED   {fit(m_['family'], 18)} {fit(m_['job_name'], 28)} "
                       f"{fit(m_.get('vertex_name') or '', 28)}")
        for f in self.false:
            out.append(f"  FALSE    {fit(f['family'], 18)} {fit(f['job_name'], 28)} "
                       f"{fit(f.get('vertex_name') or '', 28)} {fit(f['summary'], 60).rstrip()}")
        return out


def found_any(metrics: dict) -> bool:
    return metrics["faults_found"] > 0


def compare(truths: Iterable[dict], incidents: Sequence[dict]) -> Comparison:
    """Judge every run of ``truths`` (ground-truth lines) against the incident events."""
    opened: dict[tuple[str, str], list[dict]] = {}
    latest: dict[str, dict] = {}
    for incident in incidents:
        latest[incident["incident_id"]] = incident  # the latest event carries every symptom
        if incident["event"] == "opened":
            opened.setdefault((incident["cluster"], incident["job_id"]), []).append(incident)
    runs = []
    for truth in truths:
        job_incidents = sorted(opened.get((truth["cluster"], truth["job_id"]), []), key=lambda i: i["opened_at"])
        runs.append(_judge(truth, job_incidents, latest))
    return Comparison(runs)


def _judge(truth: dict, incidents: list[dict], latest: dict[str, dict]) -> RunOutcome:
    faults = truth.get("faults") or []
    outcome = RunOutcome(truth.get("run_id") or truth["job_name"], truth["job_id"], truth.get("scenario", ""),
                         sorted({f["family"] for f in faults}))
    used: set[str] = set()
    for fault in faults:
        family = fault["family"]
        # A symptom is detectable from its cause's onset (checkpoints near their timeout behind
        # backpressure warn before the first one fails).
        causes = [f["onset_ts"] for f in faults if f["family"] in EXPLAINED_BY.get(family, ())]
        earliest = min([fault["onset_ts"], *causes]) - EARLY_GRACE_MS
        claims = []  # (when, localised, incident, as_symptom)
        for incident in incidents:
            place = _same_place(incident.get("vertex_id"), fault)
            if incident["family"] == family and incident["opened_at"] >= earliest:
                claims.append((incident["opened_at"], place, incident, False))
            for symptom in latest[incident["incident_id"]].get("symptoms") or []:
                if symptom["family"] == family and symptom["first_at"] >= earliest:
                    claims.append((symptom["first_at"], place, incident, True))
        if not claims:
            outcome.missed.append({"family": family, "vertex_name": fault.get("vertex_name")})
            continue
        # The right place first, then the earliest. Every incident of the fault's own family at
        # its place belongs to it (an incident that resolved and opened again is no false one).
        when, localised, incident, as_symptom = min(claims, key=lambda c: (not c[1], c[0]))
        own = {c[2]["incident_id"] for c in claims if not c[3] and c[1]}
        used.update(own)
        if not as_symptom:
            used.add(incident["incident_id"])
        found = {"family": family, "vertex_name": fault.get("vertex_name"),
                 "delay_s": (when - fault["onset_ts"]) / 1000.0, "localised": localised,
                 "incident_id": incident["incident_id"], "as_symptom": as_symptom}
        if fault.get("end_ts") is not None and not as_symptom:
            found.update(_ending(fault["end_ts"], [latest[i] for i in sorted(own | {incident["incident_id"]})]))
        outcome.found.append(found)
    outcome.false = [i for i in incidents if i["incident_id"] not in used]
    if faults:
        claimed = {i["family"] for i in incidents} | {s["family"] for i in incidents
                                                     for s in latest[i["incident_id"]].get("symptoms") or []}
        outcome.false_families = sorted(claimed - set(outcome.expected))
    return outcome


def _ending(end_ts: int, last_events: list[dict]) -> dict:
    """How the fault's own incidents (its family at its place) ended: resolved when the last of
    them did, or not at all while one is still open."""
    if any(e["event"] != "resolved" for e in last_events):
        return {"ended_at": end_ts, "resolved_at": None, "resolution": None, "resolved_after_end_s": None}
    last = max(last_events, key=lambda e: e["resolved_at"])
    return {"ended_at": end_ts, "resolved_at": last["resolved_at"], "resolution": last.get("resolution"),
            "resolved_after_end_s": (last["resolved_at"] - end_ts) / 1000.0}


def _same_place(vertex_id: str | None, fault: dict) -> bool:
    if fault["family"] not in LOCALISED or not fault.get("vertex_id"):
        return True
    return vertex_id == fault["vertex_id"]
