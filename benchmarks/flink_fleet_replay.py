"""A fleet of Flink jobs behind one REST address, made from a real job's recorded answers.

The lab's recording of its ``skew`` job on Flink 2.3 (``tests/pipelines/collector/fixtures/skew.json.gz``:
eight vertices at parallelism 2, every answer the collector asked for) is served for ``--jobs``
synthetic jobs. Each job has its own id and checkpoints that advance with the clock: a checkpoint
every ``--checkpoint-interval`` seconds (the jobs' phases spread over the interval), the last 10
in the history as Flink keeps them by default, each with the recorded answers of the
per-vertex details (the id, timestamps and sizes its own); vertex metrics move with the clock.
Metric queries are answered as Flink does: the requested ids it has. ``/jobmanager/config``
lists a few keys, ``metrics.fetcher.update-interval`` only when ``--metrics-refresh`` sets it (as
on a cluster left at Flink's default of 10 s).

Serving is a plain asyncio protocol (keep-alive HTTP/1.1, GET only), so that thousands of
requests a second cost the machine little beside the collector under test; ``--processes``
runs several on one port (SO_REUSEPORT). Every process computes the same fleet from ``--epoch``.

    .venv/bin/python -m benchmarks.flink_fleet_replay --jobs 2000 --port 18999 [--checkpoint-interval 60]

On SIGTERM each process prints one JSON line: the requests it answered and its CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gzip
import hashlib
import json
import math
import os
import signal
import socket
import sys
import time
import urllib.parse
from pathlib import Path

import orjson

RECORDING = Path(__file__).resolve().parent.parent / "tests/pipelines/collector/fixtures/skew.json.gz"
HISTORY = 10  # Flink's web.checkpoints.history default
SETTLED_FOR_MS = 10 * 60_000  # the jobs' tasks last changed state this long before the epoch


def job_id(index: int) -> str:
    return hashlib.md5(f"fleet-job-{index}".encode()).hexdigest()


class Fleet:
    """The answers of ``jobs`` jobs at any time, from one recorded job's."""

    def __init__(self, jobs: int, checkpoint_interval_s: float, epoch_ms: int, metrics_refresh: str | None = None):
        with gzip.open(RECORDING, "rt") as recorded:
            polls = json.load(recorded)["polls"]
        first, running = polls[0], polls[1]
        template_job = running["/jobs/overview"]["jobs"][0]
        self.recorded_id = template_job["jid"]
        rid = self.recorded_id
        self.epoch_ms = epoch_ms
        self.interval_ms = int(checkpoint_interval_s * 1000)
        self.ids = [job_id(i) for i in range(jobs)]
        self.index = {jid: i for i, jid in enumerate(self.ids)}
        self.job_entry = {**template_job, "last-modification": epoch_ms - SETTLED_FOR_MS,
                          "start-time": epoch_ms - SETTLED_FOR_MS - 5000}
        self.details = running[f"/jobs/{rid}"]
        self.vertex_ids = [v["id"] for v in self.details["vertices"]]
        checkpoints = running[f"/jobs/{rid}/checkpoints"]
        self.counts = checkpoints["counts"]
        self.entry = next(c for c in checkpoints["history"] if c["status"] == "COMPLETED")
        self.summary = checkpoints["summary"]
        self.config = orjson.dumps({**first[f"/jobs/{rid}/checkpoints/config"],
                                    "interval": self.interval_ms})
        self.jm = orjson.dumps(running[next(p for p in running if p.startswith("/jobmanager/metrics"))])
        self.restarts = orjson.dumps([{"id": "numRestarts", "value": "0"}])
        # /jobmanager/config as Flink lists it: the keys the cluster's configuration sets.
        settings = {"web.checkpoints.history": str(HISTORY), "parallelism.default": "1",
                    "taskmanager.numberOfTaskSlots": "8", "rest.port": "8081"}
        if metrics_refresh is not None:
            settings["metrics.fetcher.update-interval"] = metrics_refresh
        self.jm_config = orjson.dumps([{"key": key, "value": value} for key, value in settings.items()])
        # One recorded checkpoint's answer per vertex, and every metric id recorded per vertex.
        recorded_cid = next(int(p.split("/")[5]) for p in running if "/subtasks/" in p)
        self.subtasks = {vid: running[f"/jobs/{rid}/checkpoints/details/{recorded_cid}/subtasks/{vid}"]
                         for vid in self.vertex_ids}
        self.metrics: dict[str, dict[str, str]] = {}
        for path, answer in running.items():
            if "/vertices/" in path:
                vid = path.split("/")[4]
                self.metrics.setdefault(vid, {}).update({item["id"]: item["value"] for item in answer})
        self._details_bodies = {}
        self._overview: tuple[int, bytes] = (-1, b"")

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def _latest(self, index: int, now_ms: int) -> int:
        """The id of job ``index``'s latest finished checkpoint at ``now_ms`` (0: none yet)."""
        phase = index * self.interval_ms // max(1, len(self.ids))
        return max(0, (now_ms - self.epoch_ms + SETTLED_FOR_MS - phase) // self.interval_ms)

    def _trigger_ms(self, index: int, cid: int) -> int:
        phase = index * self.interval_ms // max(1, len(self.ids))
        return self.epoch_ms - SETTLED_FOR_MS + phase + cid * self.interval_ms

    def _growth(self, cid: int) -> float:
        return 1.0 + 0.002 * cid  # state grows slowly, as a healthy job's warm-up

    def overview(self) -> bytes:
        second = self.now_ms() // 1000
        if self._overview[0] != second:
            jobs = [{**self.job_entry, "jid": jid, "name": f"fleet-{i}",
                     "duration": self.now_ms() - self.job_entry["start-time"]} for i, jid in enumerate(self.ids)]
            self._overview = (second, orjson.dumps({"jobs": jobs}))
        return self._overview[1]

    def job(self, jid: str) -> bytes:
        body = self._details_bodies.get(jid)
        if body is None:
            body = self._details_bodies[jid] = orjson.dumps({**self.details, "jid": jid, "name": f"fleet-{self.index[jid]}"})
        return body

    def _entry(self, index: int, jid: str, cid: int) -> dict:
        trigger = self._trigger_ms(index, cid)
        duration = self.entry["end_to_end_duration"]
        size = int(self.entry["state_size"] * self._growth(cid))
        return {**self.entry, "id": cid, "trigger_timestamp": trigger, "latest_ack_timestamp": trigger + duration,
                "state_size": size, "checkpointed_size": size,
                "external_path": f"file:/checkpoints/{jid}/chk-{cid}"}

    def checkpoints(self, jid: str) -> bytes:
        index = self.index[jid]
        latest = self._latest(index, self.now_ms())
        history = [self._entry(index, jid, cid) for cid in range(latest, max(0, latest - HISTORY), -1)]
        counts = {**self.counts, "completed": latest, "failed": 0, "in_progress": 0, "total": latest}
        latest_entry = history[0] if history else None
        return orjson.dumps({"counts": counts, "history": history, "summary": self.summary,
                             "latest": {"completed": latest_entry, "failed": None, "restored": None, "savepoint": None}})

    def checkpoint_subtasks(self, jid: str, cid: int, vid: str) -> bytes | None:
        index = self.index[jid]
        if not 0 < cid <= self._latest(index, self.now_ms()) or vid not in self.subtasks:
            return None
        answer = copy.deepcopy(self.subtasks[vid])
        shift = self._trigger_ms(index, cid) - (answer["latest_ack_timestamp"] - answer["end_to_end_duration"])
        growth = self._growth(cid)
        answer["id"] = cid
        answer["latest_ack_timestamp"] += shift
        answer["state_size"] = int(answer["state_size"] * growth)
        answer["checkpointed_size"] = int(answer["checkpointed_size"] * growth)
        for subtask in answer.get("subtasks") or []:
            if "ack_timestamp" in subtask:
                subtask["ack_timestamp"] += shift
            for key in ("state_size", "checkpointed_size"):
                if key in subtask:
                    subtask[key] = int(subtask[key] * growth)
        return orjson.dumps(answer)

    def vertex_metrics(self, jid: str, vid: str, asked: list[str]) -> bytes:
        known = self.metrics.get(vid, {})
        wave = 1.0 + 0.1 * math.sin(self.now_ms() / 20_000 + self.index[jid])
        out = []
        for name in asked:
            value = known.get(name)
            if value is None:
                continue
            try:
                number = float(value)
                value = str(number * wave) if math.isfinite(number) else value
            except ValueError:
                pass
            out.append({"id": name, "value": value})
        return orjson.dumps(out)

    def answer(self, target: str) -> tuple[int, bytes]:
        path, _, query = target.partition("?")
        parts = path.strip("/").split("/")
        not_found = (404, orjson.dumps({"errors": [f"Not found: {path}"]}))
        if path == "/jobs/overview":
            return 200, self.overview()
        if path == "/jobmanager/metrics":
            return 200, self.jm
        if path == "/jobmanager/config":
            return 200, self.jm_config
        if len(parts) < 2 or parts[0] != "jobs" or parts[1] not in self.index:
            return not_found
        jid = parts[1]
        rest = parts[2:]
        if not rest:
            return 200, self.job(jid)
        if rest == ["checkpoints"]:
            return 200, self.checkpoints(jid)
        if rest == ["checkpoints", "config"]:
            return 200, self.config
        if rest == ["metrics"]:
            return 200, self.restarts
        if len(rest) == 3 and rest[0] == "vertices" and rest[2] == "metrics":
            asked = urllib.parse.parse_qs(query).get("get", [""])[0].split(",")
            return 200, self.vertex_metrics(jid, rest[1], asked)
        if len(rest) == 5 and rest[:2] == ["checkpoints", "details"] and rest[3] == "subtasks" and rest[2].isdigit():
            body = self.checkpoint_subtasks(jid, int(rest[2]), rest[4])
            return (200, body) if body is not None else not_found
        if len(rest) == 3 and rest[:2] == ["checkpoints", "details"] and rest[2].isdigit():
            cid = int(rest[2])
            index = self.index[jid]
            if not 0 < cid <= self._latest(index, self.now_ms()):
                return not_found
            tasks = {vid: {k: v for k, v in orjson.loads(self.checkpoint_subtasks(jid, cid, vid)).items()
                           if k not in ("subtasks", "summary")} for vid in self.vertex_ids}
            return 200, orjson.dumps({**self._entry(index, jid, cid), "tasks": tasks})
        return not_found


class Served:
    requests = 0


def protocol(fleet: Fleet):
    class FlinkRest(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buffer = transport, b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while True:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head, self.buffer = self.buffer[:end], self.buffer[end + 4:]
                request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
                Served.requests += 1
                if len(request_line) < 2 or request_line[0] != "GET":
                    status, body = 405, b'{"errors":["GET only"]}'
                else:
                    try:
                        status, body = fleet.answer(request_line[1])
                    except Exception as exc:  # noqa: BLE001 - a bad request is answered, the server lives on
                        status, body = 500, orjson.dumps({"errors": [f"{type(exc).__name__}: {exc}"]})
                reason = {200: "OK", 404: "Not Found"}.get(status, "Error")
                self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json; charset=UTF-8\r\n"
                                     b"Content-Length: %d\r\nConnection: keep-alive\r\n\r\n"
                                     % (status, reason.encode(), len(body)) + body)

    return FlinkRest


async def serve(fleet: Fleet, port: int) -> None:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    server = await loop.create_server(protocol(fleet), sock=sock, backlog=1024)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print("ready", flush=True)
    await stop.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--checkpoint-interval", type=float, default=60.0)
    parser.add_argument("--epoch-ms", type=int, default=None, help="the fleet's time origin (default: now)")
    parser.add_argument("--metrics-refresh", help="metrics.fetcher.update-interval as the cluster's configuration "
                                                  "sets it, e.g. 2000 (default: not set, Flink's 10 s)")
    args = parser.parse_args()
    fleet = Fleet(args.jobs, args.checkpoint_interval, args.epoch_ms or int(time.time() * 1000), args.metrics_refresh)
    asyncio.run(serve(fleet, args.port))
    times = os.times()
    print(json.dumps({"requests": Served.requests, "cpu_s": round(times.user + times.system, 2)}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
