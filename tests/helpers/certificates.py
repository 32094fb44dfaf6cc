"""A test CA with a server certificate for 127.0.0.1 and a client certificate it signed, made with
OpenSSL; PKCS12 key and trust stores of them for the JVM servers (Flink), made with keytool."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import debian_binary

STORE_PASSWORD = "sentinel-test-store"


@dataclass(frozen=True)
class Certificates:
    folder: Path

    def path(self, name: str) -> Path:
        """``ca.pem``, ``server.pem``, ``server.key``, ``client.pem``, ``client.key``, ``other.pem``."""
        path = self.folder / name
        assert path.is_file(), f"no {name} in {self.folder}"
        return path


def make_certificates(folder: Path) -> Certificates:
    """``ca.pem`` signs ``server.pem`` (localhost, 127.0.0.1) and ``client.pem`` (keys unencrypted
    beside them); ``other.pem`` is a CA that signed neither."""
    openssl = debian_binary("openssl", "openssl")
    folder.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True, timeout=60)

    for ca in ("ca", "other"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
            "-subj", f"/CN=sentinel-test-{ca}")
    (folder / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, subject in (("server", "/CN=localhost"), ("client", "/CN=checkpoint-sentinel")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        extra = ["-extfile", "server.ext"] if name == "server" else []
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", *extra)
    return Certificates(folder)


def java_stores(certificates: Certificates) -> tuple[Path, Path]:
    """``server.p12`` (the server's key and certificate) and ``truststore.p12`` (the CA), both
    with :data:`STORE_PASSWORD`, for a JVM server that requires client certificates."""
    folder = certificates.folder
    openssl = debian_binary("openssl", "openssl")
    subprocess.run([openssl, "pkcs12", "-export", "-in", "server.pem", "-inkey", "server.key", "-certfile", "ca.pem",
                    "-name", "server", "-out", "server.p12", "-passout", f"pass:{STORE_PASSWORD}"],
                   cwd=folder, check=True, capture_output=True, timeout=60)
    keytool = shutil.which("keytool")
    assert keytool, "keytool (the JDK's) is not on the PATH"
    # keytool, not OpenSSL: a JVM trusts a PKCS12 certificate entry only with Java's trust attribute.
    subprocess.run([keytool, "-importcert", "-noprompt", "-alias", "sentinel-test-ca", "-file", "ca.pem",
                    "-keystore", "truststore.p12", "-storetype", "PKCS12", "-storepass", STORE_PASSWORD],
                   cwd=folder, check=True, capture_output=True, timeout=60)
    return folder / "server.p12", folder / "truststore.p12"
