"""The collector's only way to talk to Flink: GET a REST path, with timeouts, retries and backoff.

Flink's REST API answers JSON; errors come as ``{"errors": [...]}`` with a 4xx or 5xx status.
Server errors, timeouts and refused connections are retried with exponential backoff (a
JobManager that is failing over comes back); client errors are not (a checkpoint that fell out of
the history stays a 404). Long metric lists are split over several requests, because Flink's
HTTP server rejects request lines longer than 4096 bytes.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

# Flink's Netty HTTP codec refuses longer request lines; leave room for the path and host.
MAX_QUERY_CHARS = 3000


class FlinkRestError(RuntimeError):
    """A REST request that failed for good (after retries, or a client error)."""

    def __init__(self, url: str, reason: str, status: int | None = None):
        super().__init__(f"GET {url}: {reason}")
        self.url, self.reason, self.status = url, reason, status

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status >= 500 or self.status == 429


class FlinkRestClient:
    """GET JSON from one Flink cluster's REST API."""

    def __init__(self, base_url: str, timeout_s: float = 5.0, retries: int = 3, backoff_s: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep):
        self.base_url = base_url.rstrip("/")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.sleep = sleep
        self.requests = 0  # for the collector's own metrics and the benchmarks
        self._latencies: list[float] = []
        # When a dict, every answer is kept by path and query: how the test fixtures were recorded.
        self.recording: dict[str, Any] | None = None

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = self.base_url + path + ("?" + urllib.parse.urlencode(params, safe=",") if params else "")
        for attempt in range(self.retries + 1):
            try:
                return self._get_once(url)
            except FlinkRestError as exc:
                if not exc.retryable or attempt == self.retries:
                    raise
                wait = self.backoff_s * 2 ** attempt
                log.info("%s; retry %d of %d in %.1fs", exc, attempt + 1, self.retries, wait)
                self.sleep(wait)
        raise AssertionError("unreachable")

    def take_latencies(self) -> list[float]:
        """The durations of the requests made since the last call, in seconds."""
        taken, self._latencies = self._latencies, []
        return taken

    def _get_once(self, url: str) -> Any:
        self.requests += 1
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise FlinkRestError(url, f"HTTP {exc.code} {_flink_errors(exc)}", exc.code) from None
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise FlinkRestError(url, f"unreachable ({reason})") from None
        finally:
            self._latencies.append(time.monotonic() - started)
        try:
            answer = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # A proxy's HTML error page or a cut-off body: worth another try.
            raise FlinkRestError(url, f"not JSON ({exc}): {body[:120]!r}") from None
        if self.recording is not None:
            self.recording[url[len(self.base_url):]] = answer
        return answer

    def metrics(self, path: str, names: Iterable[str]) -> dict[str, str]:
        """``{metric id: value}`` for the requested ids Flink knows; unknown ids are simply absent."""
        values: dict[str, str] = {}
        for chunk in _chunks(list(names), MAX_QUERY_CHARS):
            for item in self.get(path, {"get": ",".join(chunk)}) or []:
                if isinstance(item, dict) and "id" in item:
                    values[item["id"]] = item.get("value")
        return values


def _chunks(names: list[str], max_chars: int) -> Iterable[list[str]]:
    chunk: list[str] = []
    length = 0
    for name in names:
        if chunk and length + len(name) + 1 > max_chars:
            yield chunk
            chunk, length = [], 0
        chunk.append(name)
        length += len(name) + 1
    if chunk:
        yield chunk


def _flink_errors(exc: urllib.error.HTTPError) -> str:
    try:
        errors = json.loads(exc.read()).get("errors") or []
        return "; ".join(str(e).splitlines()[0] for e in errors)[:300]
    except Exception:  # noqa: BLE001 - the status alone still says enough
        return exc.reason or ""
