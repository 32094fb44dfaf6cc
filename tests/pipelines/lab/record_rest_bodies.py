"""Record one raw Flink REST answer per endpoint the collector reads, for one Flink version (run
by hand against a running lab cluster; not a test).

    .venv/bin/python -m tests.pipelines.lab.record_rest_bodies --rest-url http://127.0.0.1:18081 [--job JOB_ID]

Asks the cluster what the collector asks (GET only: the jobs are left alone) once a running job
has a completed checkpoint, and writes ``rest_bodies/<flink version>/<endpoint>.json`` with the body
as Flink sent it, and ``index.json`` with the path each came from.
"""

import argparse
import json
import re
import time
import urllib.request
from pathlib import Path

from pipelines.collector import mapping

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


def get(rest_url: str, path: str):
    with urllib.request.urlopen(rest_url + path, timeout=10) as response:
        return json.loads(response.read())


def fetch(rest_url: str, job_id: str) -> tuple[dict[str, str], dict[str, object]] | None:
    """The path and answer of each endpoint about ``job_id`` (its widest vertex with an input, its
    latest completed checkpoint), asked the way the collector asks; None until it has a
    completed checkpoint."""
    job = get(rest_url, f"/jobs/{job_id}")
    checkpoints = get(rest_url, f"/jobs/{job_id}/checkpoints")
    completed = [c for c in checkpoints.get("history") or [] if c.get("status") == "COMPLETED"]
    if not completed or not job.get("vertices"):
        return None
    checkpoint_id = max(c["id"] for c in completed)
    # The widest vertex with an input (a source has no input buffers and, on datagen, no busy time).
    vertex = max(job["vertices"], key=lambda v: (not v["name"].startswith("Source"), v.get("parallelism") or 1, v["name"]))
    names = mapping.subtask_metric_names(int(vertex.get("parallelism") or 1))
    paths = {"jobs_overview": "/jobs/overview", "job": f"/jobs/{job_id}",
             "job_checkpoints": f"/jobs/{job_id}/checkpoints",
             "checkpoint_config": f"/jobs/{job_id}/checkpoints/config",
             "checkpoint_details": f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}",
             "checkpoint_subtasks": f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{vertex['id']}",
             "vertex_metrics": f"/jobs/{job_id}/vertices/{vertex['id']}/metrics?get={','.join(names)}",
             "job_metrics": f"/jobs/{job_id}/metrics?get={','.join(mapping.JOB_METRICS)}",
             "jobmanager_metrics": f"/jobmanager/metrics?get={','.join(mapping.JM_HEAP_METRICS)}"}
    assert all(ENDPOINTS[e].match(p) for e, p in paths.items())
    answers = {endpoint: get(rest_url, path) for endpoint, path in paths.items()}
    answers["job"], answers["job_checkpoints"] = job, checkpoints  # the ones the checkpoint was chosen from
    return paths, answers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rest-url", required=True)
    parser.add_argument("--job", help="the job to record (default: the first running one)")
    parser.add_argument("--tries", type=int, default=20)
    args = parser.parse_args()
    version = get(args.rest_url, "/config")["flink-version"]
    for _ in range(args.tries):
        running = [j["jid"] for j in get(args.rest_url, "/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
        job_id = args.job or (running[0] if running else None)
        found = fetch(args.rest_url, job_id) if job_id else None
        if found:
            paths, answers = found
            folder = BODIES / version
            folder.mkdir(parents=True, exist_ok=True)
            for endpoint, answer in answers.items():
                (folder / f"{endpoint}.json").write_text(json.dumps(answer, indent=1, sort_keys=True) + "\n")
            (folder / "index.json").write_text(json.dumps({"flink_version": version, "job_id": job_id, "paths": paths},
                                                          indent=1, sort_keys=True) + "\n")
            print(f"recorded {len(paths)} bodies of job {job_id} (Flink {version}) in {folder}")
            return
        time.sleep(5)
    raise SystemExit("no running job with a completed checkpoint")


if __name__ == "__main__":
    main()
