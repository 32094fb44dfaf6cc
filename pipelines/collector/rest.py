"""The collector's only way to talk to Flink: GET a REST path, with timeouts, retries and backoff.

Requests go over a pool of kept-alive connections (aiohttp), at most ``concurrency`` at a time
per cluster: a poll of hundreds of jobs overlaps its requests instead of paying one round trip
and one TCP handshake after another, and the JobManager never sees more than that many at once.
(aiohttp over httpx and urllib3 by measurement: BENCHMARKS.md, "The collector against a fleet".)

Flink's REST API answers JSON; errors come as ``{"errors": [...]}`` with a 4xx or 5xx status.
Server errors, timeouts and refused connections are retried with exponential backoff (a
JobManager that is failing over comes back); client errors are not (a checkpoint that fell out of
the history stays a 404). Long metric lists are split over several requests, because Flink's
HTTP server rejects request lines longer than 4096 bytes.

A secured REST API (Flink's ``security.ssl.rest.*``, or a proxy in front of it) gets the
``collector.security`` TLS context and Authorization header (:mod:`pipelines.io.http_security`);
a refusal (a client certificate or credentials required, an untrusted certificate) is not
retried, and its error names the key to set.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from typing import Any, Awaitable, Callable, Iterable

import orjson

from pipelines.config import HttpClientSecurity
from pipelines.io import http_security

log = logging.getLogger(__name__)

# Flink's Netty HTTP codec refuses longer request lines; leave room for the path and host.
MAX_QUERY_CHARS = 3000


class FlinkRestError(RuntimeError):
    """A REST request that failed for good (after retries, or a client error)."""

    def __init__(self, url: str, reason: str, status: int | None = None, refused: bool = False):
        super().__init__(f"GET {url}: {reason}")
        self.url, self.reason, self.status, self.refused = url, reason, status, refused

    @property
    def retryable(self) -> bool:
        # A refusal of this client's TLS or credentials is the same on the next try.
        return not self.refused and (self.status is None or self.status >= 500 or self.status == 429)


class FlinkRestClient:
    """GET JSON from one Flink cluster's REST API (coroutines; one event loop per client)."""

    def __init__(self, base_url: str, timeout_s: float = 5.0, retries: int = 3, backoff_s: float = 0.5,
                 concurrency: int = 16, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 security: HttpClientSecurity | None = None):
        self.base_url = base_url.rstrip("/")
        self.security = security or HttpClientSecurity()
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.concurrency = concurrency
        self.sleep = sleep
        self.requests = 0  # for the collector's own metrics and the benchmarks
        self._latencies: list[float] = []
        self._session = None
        self._slots: asyncio.Semaphore | None = None
        # When a dict, every answer is kept by path and query: how the test fixtures were recorded.
        self.recording: dict[str, Any] | None = None

    def _open(self):
        if self._session is None:
            import aiohttp

            # The pool holds as many connections as requests may be under way, so a request never
            # waits for a connection inside its own timeout; idle ones are kept between polls.
            tls = http_security.ssl_context(self.security, "collector") if self.base_url.startswith("https:") else None
            connector = aiohttp.TCPConnector(limit=self.concurrency, keepalive_timeout=60, enable_cleanup_closed=True,
                                             ssl=tls if tls is not None else True)
            headers = {"Accept": "application/json", **http_security.authorization(self.security, "collector")}
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                                  headers=headers, auto_decompress=True)
            self._slots = asyncio.Semaphore(self.concurrency)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = self.base_url + path + ("?" + urllib.parse.urlencode(params, safe=",") if params else "")
        for attempt in range(self.retries + 1):
            try:
                return await self._get_once(url)
            except FlinkRestError as exc:
                if not exc.retryable or attempt == self.retries:
                    raise
                wait = self.backoff_s * 2 ** attempt
                log.info("%s; retry %d of %d in %.1fs", exc, attempt + 1, self.retries, wait)
                await self.sleep(wait)
        raise AssertionError("unreachable")

    def take_latencies(self) -> list[float]:
        """The durations of the requests made since the last call, in seconds."""
        taken, self._latencies = self._latencies, []
        return taken

    async def _get_once(self, url: str) -> Any:
        import aiohttp
        from yarl import URL

        session = self._open()
        async with self._slots:
            self.requests += 1
            started = time.monotonic()
            try:
                # encoded=True: the query is sent as built (commas unescaped, as Flink's docs write it).
                async with session.get(URL(url, encoded=True), allow_redirects=False) as response:
                    status, body = response.status, await response.read()
            except asyncio.TimeoutError:
                raise FlinkRestError(url, f"unreachable (timed out after {self.timeout_s:g}s)") from None
            except (aiohttp.ClientError, OSError) as exc:
                said = str(exc) or type(exc).__name__
                hint = http_security.refusal_hint(said, None, self.security, "collector")
                if not hint and url.startswith("http:") and isinstance(exc, aiohttp.ServerDisconnectedError):
                    hint = ("if the REST API has TLS on (Flink's security.ssl.rest.enabled), use an https:// "
                            "rest_url")
                if hint:
                    raise FlinkRestError(url, f"refused ({said}): {hint}", refused=True) from None
                raise FlinkRestError(url, f"unreachable ({said})") from None
            finally:
                self._latencies.append(time.monotonic() - started)
        if status in (401, 403):
            raise FlinkRestError(url, f"HTTP {status}: " + http_security.refusal_hint("", status, self.security,
                                                                                      "collector"), status, refused=True)
        if status >= 400:
            raise FlinkRestError(url, f"HTTP {status} {_flink_errors(body)}", status)
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if not body and url.startswith("http:"):  # what Flink's TLS-only REST port answers plain HTTP with
                raise FlinkRestError(url, "an empty answer: if the REST API has TLS on (Flink's "
                                          "security.ssl.rest.enabled), use an https:// rest_url") from None
            # A proxy's HTML error page or a cut-off body: worth another try.
            raise FlinkRestError(url, f"not JSON ({exc}): {body[:120]!r}") from None
        if self.recording is not None:
            self.recording[url[len(self.base_url):]] = answer
        return answer

    async def metrics(self, path: str, names: Iterable[str]) -> dict[str, str]:
        """``{metric id: value}`` for the requested ids Flink knows; unknown ids are simply absent."""
        chunks = list(_chunks(list(names), MAX_QUERY_CHARS))
        if len(chunks) == 1:
            answers = [await self.get(path, {"get": ",".join(chunks[0])})]
        else:
            answers = await asyncio.gather(*(self.get(path, {"get": ",".join(chunk)}) for chunk in chunks))
        values: dict[str, str] = {}
        for answer in answers:
            for item in answer or []:
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


def _flink_errors(body: bytes) -> str:
    try:
        errors = orjson.loads(body).get("errors") or []
        return "; ".join(str(e).splitlines()[0] for e in errors)[:300]
    except Exception:  # noqa: BLE001 - the status alone still says enough
        return body[:120].decode("utf-8", "replace")
