"""Alertmanager's v2 API, at one or more URLs: readiness, and posting alerts, with what each URL
answered; the errors that tell the relay to retry (:class:`AlertmanagerUnavailable`) or to split
the batch (:class:`AlertsRefused`).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Sequence

from pipelines.config import HttpClientSecurity
from pipelines.errors import SetupError
from pipelines.io import http_security

log = logging.getLogger(__name__)

REFUSED_STATUSES = (400, 422)  # Alertmanager refuses the content: another try would be refused again


class AlertmanagerUnavailable(SetupError, RuntimeError):
    """No Alertmanager accepted the alerts; the message says which failed and why."""


class AlertsRefused(RuntimeError):
    """No Alertmanager accepted the alerts and at least one refused their content (HTTP 400/422)."""


class Alertmanagers:
    """Alertmanager's v2 API at one or more URLs (an HA pair gets every alert)."""

    def __init__(self, urls: Sequence[str], timeout_s: float = 10.0, security: HttpClientSecurity | None = None):
        if not urls:
            raise ValueError("no Alertmanager URL: pass --alertmanager URL (repeatable) or set "
                             "alert.alertmanager_urls (SENTINEL_ALERT__ALERTMANAGER_URLS)")
        self.urls = [url.rstrip("/") for url in urls]
        self.timeout_s = timeout_s
        self.security = security or HttpClientSecurity()
        # Made once: a context loads its CA and certificate files when built.
        self._tls = http_security.ssl_context(self.security, "alert") \
            if any(url.startswith("https:") for url in self.urls) else None

    def _request(self, url: str, data: bytes | None = None) -> bytes:
        # The credentials are read for each request: a rotated password file is used at once.
        headers = {"Content-Type": "application/json", **http_security.authorization(self.security, "alert")}
        request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET", headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout_s,
                                    context=self._tls if url.startswith("https:") else None) as response:
            return response.read()

    def _problem(self, exc: BaseException) -> str:
        """What went wrong, and for a refusal of this client's TLS or credentials, what to set."""
        status = exc.code if isinstance(exc, urllib.error.HTTPError) else None
        # A TLS alert read after the handshake comes as a bare SSLError, whose reason is a code.
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        said = f"HTTP {status}" if status is not None else str(reason)
        hint = http_security.refusal_hint(f"{reason} {getattr(reason, 'reason', '')}", status, self.security, "alert")
        return f"{said}: {hint}" if hint else said

    def check_reachable(self) -> None:
        """Fail when no URL answers Alertmanager's readiness endpoint (a wrong URL is a config error)."""
        problems = {}
        for url in self.urls:
            try:
                self._request(f"{url}/-/ready")
                return
            except (urllib.error.URLError, OSError) as exc:
                problems[url] = self._problem(exc)
        raise AlertmanagerUnavailable(
            "no Alertmanager is reachable (" + "; ".join(f"{u}: {p}" for u, p in problems.items()) + "). Check "
            "--alertmanager / alert.alertmanager_urls (the base URL, e.g. http://alertmanager:9093) and that it runs.")

    def post(self, alerts: Sequence[dict]) -> list[str]:
        """Post ``alerts`` to every URL; the URLs that accepted them. Raises :class:`AlertsRefused`
        when none accepted and one refused their content (400, 422), :class:`AlertmanagerUnavailable`
        when none answered (connection errors, timeouts, any other status)."""
        if not alerts:
            return list(self.urls)
        body = json.dumps(list(alerts)).encode()
        accepted, refused, problems = [], {}, {}
        for url in self.urls:
            try:
                self._request(f"{url}/api/v2/alerts", body)
                accepted.append(url)
            except urllib.error.HTTPError as exc:
                problem = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace').strip()}"
                if exc.code in (401, 403):  # retried: a rotated secret may fix it, and nothing is dropped
                    problem = self._problem(exc)
                (refused if exc.code in REFUSED_STATUSES else problems)[url] = problem
            except (urllib.error.URLError, OSError) as exc:
                problems[url] = self._problem(exc)
        for url, problem in {**refused, **problems}.items():
            log.warning("Alertmanager %s did not take %d alert(s): %s", url, len(alerts), problem)
        if not accepted:
            described = "; ".join(f"{u}: {p}" for u, p in {**refused, **problems}.items())
            if refused:
                raise AlertsRefused(described)
            raise AlertmanagerUnavailable("no Alertmanager accepted the alerts: " + described)
        return accepted
