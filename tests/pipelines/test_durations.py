"""One duration syntax for every time option: units, a plain number of seconds, clear refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipelines.durations import DurationError, format_seconds, parse_duration, seconds
from pipelines.errors import UsageError
from tests.conftest import PROJECT_ROOT


def test_units_and_plain_seconds():
    assert parse_duration("2h") == 7_200_000
    assert parse_duration("1h30m") == 5_400_000
    assert parse_duration("90s") == 90_000
    assert parse_duration("500ms") == 500
    assert parse_duration("90") == 90_000
    assert parse_duration("2.5") == 2_500
    assert parse_duration(15) == 15_000
    assert seconds("5m") == 300.0


@pytest.mark.parametrize("bad", ["2x", "", "h", "0s", "0", "-5", "5 minutes", "1h-30m"])
def test_what_is_not_a_duration_is_a_usage_error_that_shows_the_syntax(bad):
    with pytest.raises(DurationError, match="not like 30s, 5m|must be positive") as caught:
        parse_duration(bad)
    assert isinstance(caught.value, UsageError)


def test_formatting_reads_back_as_the_same_duration():
    for value in (0.5, 1, 59, 60, 90, 300, 3600, 5400, 3601, 86400):
        assert seconds(format_seconds(value)) == value


def test_the_module_imports_nothing_heavy():
    code = ("import sys; import pipelines.durations; "
            "print(sorted(m for m in sys.modules if m.startswith(('pipelines.simulator', 'pydantic', 'numpy'))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr
