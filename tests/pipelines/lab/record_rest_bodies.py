"""Record one raw Flink REST answer per endpoint the collector reads, for one Flink version (run
by hand against a running lab cluster; not a test).

    .venv/bin/python -m tests.pipelines.lab.record_rest_bodies --rest-url http://127.0.0.1:18081 [--job JOB_ID]

Polls the cluster like the collector (GET only: the jobs are left alone) until a running job has
a completed checkpoint, then writes ``rest_bodies/<flink version>/<endpoint>.json`` with the body
as Flink sent it, and ``index.json`` with the path each came from.
"""

import argparse
import json
import re
import time
from pathlib import Path

from pipelines.collector import ClusterCollector
from pipelines.config import FlinkClusterEndpoint, load_config

BODIES = Path(__file__).parent / "rest_bodies"
ID = "[0-9a-f]{32}"
ENDPOINTS = {
    "jobs_overview": re.compile(r"^/jobs/overview$"),
    "job": re.compile(rf"^/jobs/{ID}$"),
    "job_checkpoints": re.compile(rf"^/jobs/{ID}/checkpoints$"),
    "checkpoint_config": re.compile(rf"^/jobs/{ID}/checkpoints/config$"),
    "checkpoint_details": re.compile(rf"^/jobs/{ID}/checkpoints/details/\d+$"),
    "checkpoint_subtasks": re.compile(rf"^/jobs/{ID}/checkpoints/details/\d+/subtasks/{ID}$"),
    "vertex_metrics": re.compile(rf"^/jobs/{ID}/vertices/{ID}/metrics\?"),
    "job_metrics": re.compile(rf"^/jobs/{ID}/metrics\?"),
    "jobmanager_metrics": re.compile(r"^/jobmanager/metrics\?"),
}


def choose(answers: dict, job_id: str) -> dict[str, str] | None:
    """The path of each endpoint's answer about ``job_id`` (the widest vertex, the latest
    completed checkpoint whose details were read), or None while one is missing."""
    checkpoints = answers.get(f"/jobs/{job_id}/checkpoints") or {}
    job = answers.get(f"/jobs/{job_id}") or {}
    detailed = [c for c in checkpoints.get("history") or [] if c.get("status") == "COMPLETED"
                and f"/jobs/{job_id}/checkpoints/details/{c['id']}" in answers]
    if not detailed or not job.get("vertices"):
        return None
    checkpoint_id = max(c["id"] for c in detailed)
    # The widest vertex with an input (a source has no input buffers and, on datagen, no busy time).
    vertex = max(job["vertices"], key=lambda v: (not v["name"].startswith("Source"), v.get("parallelism") or 1, v["name"]))
    chosen = {"jobs_overview": "/jobs/overview", "job": f"/jobs/{job_id}",
              "job_checkpoints": f"/jobs/{job_id}/checkpoints",
              "checkpoint_details": f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}",
              "checkpoint_subtasks": f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{vertex['id']}"}
    for endpoint, prefix in (("checkpoint_config", f"/jobs/{job_id}/checkpoints/config"),
                             ("vertex_metrics", f"/jobs/{job_id}/vertices/{vertex['id']}/metrics?"),
                             ("job_metrics", f"/jobs/{job_id}/metrics?"), ("jobmanager_metrics", "/jobmanager/metrics?")):
        chosen[endpoint] = next((p for p in answers if p.startswith(prefix)), None)
    if any(path is None or path not in answers for path in chosen.values()):
        return None
    assert all(ENDPOINTS[e].match(p) for e, p in chosen.items())
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rest-url", required=True)
    parser.add_argument("--job", help="the job to record (default: the first running one)")
    parser.add_argument("--polls", type=int, default=20)
    args = parser.parse_args()
    settings = load_config().collector.model_copy(update={"state_dir": None})
    collector = ClusterCollector(FlinkClusterEndpoint(name="lab", rest_url=args.rest_url), settings,
                                 publish=lambda events: None)
    version = collector.rest.get("/config")["flink-version"]
    for _ in range(args.polls):
        # A fresh collector's first poll reads every checkpoint in the history, with its details.
        collector = ClusterCollector(FlinkClusterEndpoint(name="lab", rest_url=args.rest_url), settings,
                                     publish=lambda events: None)
        collector.rest.recording = {}
        collector.poll()
        answers = collector.rest.recording
        running = [j["jid"] for j in answers["/jobs/overview"]["jobs"] if j["state"] == "RUNNING"]
        job_id = args.job or (running[0] if running else None)
        chosen = choose(answers, job_id) if job_id else None
        if chosen:
            folder = BODIES / version
            folder.mkdir(parents=True, exist_ok=True)
            for endpoint, path in chosen.items():
                (folder / f"{endpoint}.json").write_text(json.dumps(answers[path], indent=1, sort_keys=True) + "\n")
            (folder / "index.json").write_text(json.dumps({"flink_version": version, "job_id": job_id, "paths": chosen},
                                                          indent=1, sort_keys=True) + "\n")
            print(f"recorded {len(chosen)} bodies of job {job_id} (Flink {version}) in {folder}")
            return
        time.sleep(5)
    raise SystemExit("no running job with a completed checkpoint whose details could be read")


if __name__ == "__main__":
    main()
