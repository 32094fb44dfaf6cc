"""Waiting for something a real broker, Spark query or server does in its own time."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout_s: float = 20.0, every_s: float = 2.0,
             what: str = "the condition") -> T:
    """Call ``condition`` every ``every_s`` until it returns something true, and return that; fail
    the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} ({timeout_s:.0f} s)")
        time.sleep(every_s)
