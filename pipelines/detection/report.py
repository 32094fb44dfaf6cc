"""Injected faults against incidents: detected, missed, false, and the delays (demo, tests, replay).

A labelled fault counts as *detected* when an incident of its family opened on its job (and on
its vertex, for localised families when the incident names one); the delay is from the labelled
onset to ``opened_at``, negative when the incident came first (gradual faults show before the
simulator's onset). Every opened incident that matches no
fault is *false*. Anomaly incidents explain nothing by definition: they are listed, never false.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

LOCALISED = ("state_leak", "backpressure", "skew")


@dataclass
class Comparison:
    detected: list[dict] = field(default_factory=list)  # {job_name, family, vertex_name, delay_s}
    missed: list[dict] = field(default_factory=list)
    false: list[dict] = field(default_factory=list)  # the opened incidents
    anomalies: list[dict] = field(default_factory=list)

    def lines(self) -> list[str]:
        delays = sorted(d["delay_s"] for d in self.detected)
        median = delays[len(delays) // 2] if delays else None
        out = [f"injected faults: {len(self.detected) + len(self.missed)}   detected: {len(self.detected)}   "
               f"missed: {len(self.missed)}   false incidents: {len(self.false)}   "
               f"unexplained (anomaly): {len(self.anomalies)}"
               + (f"   median delay: {median:.0f}s" if median is not None else "")]
        for d in self.detected:
            when = f"after {d['delay_s']:.0f}s" if d["delay_s"] >= 0 else f"{-d['delay_s']:.0f}s before the onset"
            out.append(f"  detected {d['family']:<18} {d['job_name']:<22} {d.get('vertex_name') or '':<40.40} {when}")
        for m in self.missed:
            out.append(f"  MISSED   {m['family']:<18} {m['job_name']:<22} {m.get('vertex_name') or '':<40.40}")
        for f in self.false:
            out.append(f"  FALSE    {f['family']:<18} {f['job_name']:<22} {f.get('vertex_name') or '':<40.40} "
                       f"{f['summary'][:60]}")
        return out


def compare(truths: Iterable[dict], incidents: Sequence[dict]) -> Comparison:
    """``truths``: ground-truth lines (one per job, as the simulator and the lab write them)."""
    opened = [i for i in incidents if i["event"] == "opened"]
    used: set[str] = set()
    result = Comparison(anomalies=[i for i in opened if i["family"] == "anomaly"])
    for truth in truths:
        for fault in truth.get("faults") or []:
            match = None
            for incident in sorted(opened, key=lambda i: i["opened_at"]):
                if (incident["job_id"] == truth["job_id"] and incident["cluster"] == truth["cluster"]
                        and incident["family"] == fault["family"] and _same_place(incident, fault)):
                    match = incident
                    break
            info = {"family": fault["family"], "job_name": truth["job_name"], "vertex_name": fault.get("vertex_name")}
            if match is None:
                result.missed.append(info)
            else:
                used.update(i["incident_id"] for i in opened if i["job_id"] == truth["job_id"]
                            and i["family"] == fault["family"] and _same_place(i, fault))
                result.detected.append({**info, "delay_s": (match["opened_at"] - fault["onset_ts"]) / 1000.0,
                                        "incident_id": match["incident_id"]})
    result.false = [i for i in opened if i["family"] != "anomaly" and i["incident_id"] not in used]
    return result


def _same_place(incident: dict, fault: dict) -> bool:
    if fault["family"] not in LOCALISED or not fault.get("vertex_id") or not incident.get("vertex_id"):
        return True
    return incident["vertex_id"] == fault["vertex_id"]
