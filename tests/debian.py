"""The Debian packages `make test` needs beyond the virtualenv, installed once per run.

pytest-xdist's workers start after the controller's ``pytest_configure``: installing there, in one
``apt-get`` for every missing package, keeps two workers from racing for dpkg's lock. A worker
that still finds a binary missing installs under an exclusive file lock, so two never overlap.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

# binary -> the Debian package that ships it
TEST_BINARIES = {
    "openssl": "openssl",
    "stunnel4": "stunnel4",
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
    "chromium": "chromium",
    "pg_ctlcluster": "postgresql",
}
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
LOCK = Path(os.environ.get("TMPDIR", "/tmp")) / "checkpoint-sentinel-apt.lock"


class DebianPackagesMissing(RuntimeError):
    """The tests need Debian packages this machine lacks and apt-get could not install."""


def missing_packages(binaries: dict[str, str]) -> list[str]:
    return sorted({package for binary, package in binaries.items() if shutil.which(binary) is None})


@contextmanager
def _apt_lock():
    with open(LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _apt_get(*args: str, timeout_s: float) -> None:
    try:
        # Another apt (a developer's, unattended-upgrades) may hold dpkg's lock: wait for it.
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=600", *args], check=True, capture_output=True, text=True, env=APT_ENV, timeout=timeout_s)
    except FileNotFoundError:
        raise DebianPackagesMissing("apt-get is not on this machine") from None
    except subprocess.TimeoutExpired:
        raise DebianPackagesMissing(f"`apt-get {' '.join(args)}` did not finish in {timeout_s:.0f} s") from None
    except subprocess.CalledProcessError as exc:
        said = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
        raise DebianPackagesMissing(f"`apt-get {' '.join(args)}` exited {exc.returncode}: {' | '.join(said)}") from None


def install(binaries: dict[str, str] = TEST_BINARIES) -> list[str]:
    """Install, in one apt-get, the packages of the binaries not on the PATH; returns those installed.
    Raises :class:`DebianPackagesMissing` with what to run by hand when that fails."""
    with _apt_lock():
        missing = missing_packages(binaries)
        if not missing:
            return []
        try:
            _apt_get("update", "-qq", timeout_s=600)
            _apt_get("install", "-y", "-qq", "--no-install-recommends", *missing, timeout_s=1800)
        except DebianPackagesMissing as exc:
            raise DebianPackagesMissing(
                f"the tests need Debian packages {', '.join(missing)} and installing them failed ({exc}); "
                f"install them as root with `apt-get install --no-install-recommends {' '.join(missing)}` "
                "and run `make test` again") from None
        still = missing_packages(binaries)
        if still:
            raise DebianPackagesMissing(f"after installing, the Debian packages {', '.join(still)} still do not "
                                        "put their binaries on the PATH")
        return missing


def binary(name: str) -> str:
    """The path of test binary ``name`` (a key of :data:`TEST_BINARIES`), installed if missing."""
    found = shutil.which(name)
    if found is None:
        install({name: TEST_BINARIES[name]})
        found = shutil.which(name)
    assert found, f"{name} is not on the PATH after installing Debian's {TEST_BINARIES[name]}"
    return found
