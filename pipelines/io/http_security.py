"""TLS and authentication for the sentinel's HTTP clients (Flink's REST API, Alertmanager), from
an :class:`~pipelines.config.HttpClientSecurity`, and what to tell the user when a server refuses.

A refusal names the config key that fixes it (``collector.security.cert_file``, ...), because
what the client sees is rarely clear by itself: a server that requires a client certificate
ends the TLS handshake with an alert, an untrusted certificate is a verification error, missing
credentials are a 401.
"""

from __future__ import annotations

import base64
import ssl

from pipelines.config import HttpClientSecurity


def ssl_context(security: HttpClientSecurity, section: str) -> ssl.SSLContext:
    """The context an https:// client of ``section`` (``collector``, ``alert``) connects with: the
    configured CAs (else the system's), the client certificate when one is set."""
    context = ssl.create_default_context(cafile=str(security.ca_file) if security.ca_file else None)
    context.check_hostname = security.check_hostname
    if security.cert_file is not None:
        try:
            context.load_cert_chain(str(security.cert_file), str(security.key_file) if security.key_file else None)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"{section}.security.cert_file: cannot load {security.cert_file}"
                             f"{' with ' + str(security.key_file) if security.key_file else ''} ({exc})") from None
    return context


def authorization(security: HttpClientSecurity, section: str) -> dict[str, str]:
    """The ``Authorization`` header (basic or bearer) to send, or none. Secrets from files are read
    here, each time a client is made."""
    if security.username is not None:
        password = security.secret("password", section) or ""
        token = base64.b64encode(f"{security.username}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}
    bearer = security.secret("bearer_token", section)
    return {"Authorization": f"Bearer {bearer}"} if bearer else {}


def refusal_hint(error: BaseException | str, status: int | None, security: HttpClientSecurity, section: str) -> str:
    """What to set when a server refused this client ("" when the error is not a refusal): an
    HTTP status or a TLS error. Its wording names ``section``'s keys.

    >>> from pipelines.config import HttpClientSecurity
    >>> refusal_hint("", 401, HttpClientSecurity(), "alert")
    'the server requires authentication: set alert.security.username and alert.security.password (or password_file), or alert.security.bearer_token'
    >>> refusal_hint("[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required", None,
    ...              HttpClientSecurity(), "collector")
    'the server requires a client certificate: set collector.security.cert_file (and key_file)'
    """
    keys = f"{section}.security"
    text = str(error)
    if status in (401, 403):
        if security.username is None and security.bearer_token is None and security.bearer_token_file is None:
            return (f"the server requires authentication: set {keys}.username and {keys}.password (or "
                    f"password_file), or {keys}.bearer_token")
        return f"the server refused the credentials of {keys} (HTTP {status}): check them"
    lowered = text.lower().replace("_", " ")  # OpenSSL's reason codes (SSLV3_ALERT_BAD_CERTIFICATE) too
    if "certificate required" in lowered or "handshake failure" in lowered or "bad certificate" in lowered:
        if security.cert_file is None:
            return f"the server requires a client certificate: set {keys}.cert_file (and key_file)"
        return f"the server refused the client certificate {security.cert_file} ({keys}.cert_file)"
    if "certificate verify failed" in lowered:
        if "hostname" in lowered or "ip address mismatch" in lowered:
            return (f"the server's certificate does not name the host connected to: use the name it carries, "
                    f"or set {keys}.check_hostname: false")
        return f"the server's certificate is not trusted: set {keys}.ca_file to the CA that signed it"
    if "wrong version number" in lowered or "record layer failure" in lowered or "packet length too long" in lowered:
        return "the server does not speak TLS there: use an http:// URL, or the server's TLS port"
    return ""
