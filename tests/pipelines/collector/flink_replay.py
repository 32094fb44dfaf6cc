"""A real HTTP server that answers like a Flink JobManager, from REST answers recorded in the lab.

The fixtures (``fixtures/*.json.gz``, written by ``record_fixtures.py``) hold one mapping per poll
from path-and-query to Flink's JSON answer. :class:`RecordedFlink` serves one poll at a time and
can be told to misbehave the way a real JobManager does: answer 5xx, hang, send a body that is
not JSON, or forget a checkpoint (404).
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def recorded_polls(name: str) -> list[dict]:
    with gzip.open(FIXTURES / f"{name}.json.gz", "rt") as answers:
        return json.load(answers)["polls"]


class RecordedFlink:
    def __init__(self, polls: list[dict]):
        self.polls = polls
        self.poll = 0
        self.requests: list[str] = []
        # path prefix (or exact path, ending in "$") -> faults for the next matching requests, in order:
        # an int (HTTP status), "hang" (longer than any client timeout) or "garbage" (not JSON).
        self.faults: dict[str, list] = {}
        self.hang_s = 3.0
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "RecordedFlink":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, path: str) -> tuple[int, bytes]:
        self.requests.append(path)
        for prefix, faults in self.faults.items():
            matches = path.partition("?")[0] == prefix[:-1] if prefix.endswith("$") else path.startswith(prefix)
            if matches and faults:
                fault = faults.pop(0)
                if fault == "hang":
                    time.sleep(self.hang_s)
                    return 200, b"{}"
                if fault == "garbage":
                    return 200, b"<html>502 Bad Gateway</html>"
                return int(fault), json.dumps({"errors": [f"injected HTTP {fault}"]}).encode()
        # The current poll's answer, else the latest earlier one: static answers (a job's checkpoint
        # configuration) were recorded only the first time the collector asked.
        base, _, query = path.partition("?")
        asked = urllib.parse.parse_qs(query).get("get", [""])[0].split(",") if base.endswith("/metrics") else None
        for answers in reversed(self.polls[:min(self.poll, len(self.polls) - 1) + 1]):
            if path in answers:
                return 200, json.dumps(answers[path]).encode()
            if asked:
                # A metric query as Flink answers it: the requested ids it has, whatever else the
                # recorded request asked for.
                recorded = [item for key, answer in answers.items() if key.partition("?")[0] == base
                            for item in answer or []]
                if recorded:
                    return 200, json.dumps([item for item in recorded if item["id"] in asked]).encode()
        return 404, json.dumps({"errors": ["Not found: " + path]}).encode()

    def _handler(self):
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # connections kept alive, as Flink's REST server does

            def do_GET(self):  # noqa: N802 - the stdlib's name
                status, body = replay._answer(self.path)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting: what a timeout test wants

            def log_message(self, *args):
                pass

        return Handler
