"""Text shown to people: names from Flink jobs and the incident topic made safe to print.

Anything in a name that would move the cursor, end a line or reorder the text around it is shown
escaped instead (:func:`printable`), and columns are padded by the cells a terminal gives each
character (:func:`fit`). Every table, page and message that shows such a name uses these.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime, timezone

# C0 and C1 controls (newline, carriage return, tab and ESC among them), DEL, the line and
# paragraph separators, the bidirectional embeddings, overrides and isolates, and lone surrogates
# (JSON can carry them; no UTF-8 output can).
UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(value: object) -> str:
    """``value`` as text that stays on its line and in its order: each control, separator and
    bidi character becomes its Python escape (a newline shows as ``\\n``, ESC as ``\\x1b``)."""
    return UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(value))


def cells(text: str) -> int:
    """The terminal cells ``text`` takes: two for a wide character (CJK, most emoji), none for a
    combining mark or a format character."""
    return sum(0 if unicodedata.combining(c) or unicodedata.category(c) == "Cf"
               else 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


def fit(value: object, width: int) -> str:
    """``value`` made printable, cut to ``width`` cells and padded to them: one table column."""
    text, used, out = printable(value), 0, []
    for c in text:
        wide = cells(c)
        if used + wide > width:
            break
        out.append(c)
        used += wide
    return "".join(out) + " " * (width - used)


def utc_time(ms: int | float | None) -> str:
    """An event time (epoch ms) as UTC date and time; ``-`` for none."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
