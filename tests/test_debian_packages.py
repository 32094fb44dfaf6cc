"""The Debian packages the tests need are there before any test process starts (tests/debian.py)."""

from __future__ import annotations

import shutil

import pytest

from tests import debian


def test_every_test_binary_is_installed_before_the_tests_run():
    # pytest_configure installed them in the controller; lazily installing workers raced for dpkg's lock.
    assert {name: shutil.which(name) for name in debian.TEST_BINARIES if shutil.which(name) is None} == {}


def test_a_package_apt_cannot_install_stops_with_the_command_to_run():
    with pytest.raises(debian.DebianPackagesMissing) as raised:
        debian.install({"sentinel-no-such-binary": "sentinel-no-such-package"})
    message = str(raised.value)
    assert "apt-get install --no-install-recommends sentinel-no-such-package" in message
    assert "exited 100" in message
