"""One duration syntax for every time option and key: ``30s``, ``5m``, ``1h30m``, ``500ms``, and a
plain number read as seconds (``90``, ``2.5``).

Imports nothing but ``re``: ``sentinel collect`` and ``sentinel alert`` parse their intervals
without importing the simulator.

>>> parse_duration("1h30m"), parse_duration("90"), seconds("500ms")
(5400000, 90000, 0.5)
"""

from __future__ import annotations

import re

from pipelines.errors import UsageError

UNITS_MS = {"h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
_NUMBER = r"\d+(?:\.\d+)?"
_WITH_UNITS = re.compile(rf"\s*(?:{_NUMBER}(?:ms|h|m|s)\s*)+")
_PLAIN = re.compile(rf"\s*{_NUMBER}\s*")


class DurationError(UsageError):
    """A duration that is not like ``30s``, ``5m``, ``1h30m`` or a number of seconds."""


def parse_duration(text: str | float | int) -> int:
    """A positive duration in milliseconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        total = float(text) * 1000
    elif isinstance(text, str) and _PLAIN.fullmatch(text):
        total = float(text) * 1000
    elif isinstance(text, str) and _WITH_UNITS.fullmatch(text):
        total = sum(float(n) * UNITS_MS[u] for n, u in re.findall(rf"({_NUMBER})(ms|h|m|s)", text))
    else:
        raise DurationError(f"duration {text!r} is not like 30s, 5m, 1h30m, 500ms or a number of seconds")
    if total <= 0:
        raise DurationError(f"duration {text!r} must be positive")
    return int(total)


def seconds(text: str | float | int) -> float:
    """The duration in seconds; also argparse's ``type`` for a time option."""
    return parse_duration(text) / 1000


def format_seconds(value: float) -> str:
    """The shortest of ``90s``, ``5m``, ``2h``, ``1h30m`` that says ``value`` exactly.

    >>> format_seconds(90), format_seconds(300), format_seconds(5400), format_seconds(0.5)
    ('90s', '5m', '1h30m', '500ms')
    """
    ms = round(value * 1000)
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    if s < 60 or (s % 60 and s < 3600):
        return f"{s}s" if s < 60 or s % 60 else f"{s // 60}m"
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if sec:
        return f"{s}s"
    return (f"{h}h" if h else "") + (f"{m}m" if m else "")
