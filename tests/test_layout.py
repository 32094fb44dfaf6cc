"""How the tests are laid out: a test module is never another module's library."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.modules import parse

TESTS = Path(__file__).resolve().parent


def imported_modules(source: str, package: tuple[str, ...]) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every module ``source`` imports, relative imports resolved against
    ``package`` (``from x import y`` counts ``x`` and ``x.y``: ``y`` may be a module)."""
    found = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_no_module_imports_a_test_module():
    """Shared steps live in tests/helpers/ or a conftest.py: a test module imported elsewhere runs
    its module-level code in another file and hides what the importing tests depend on."""
    offending = []
    for path in sorted(TESTS.rglob("*.py")):
        package = path.relative_to(TESTS.parent).with_suffix("").parts[:-1]
        offending += [f"{path.relative_to(TESTS.parent)}:{line} imports {module}"
                      for line, module in imported_modules(path.read_text(), package)
                      if module.split(".")[0] == "tests" and module.rsplit(".", 1)[-1].startswith("test_")]
    assert offending == [], "\n".join(offending)


def test_the_check_sees_each_way_of_importing_a_test_module():
    package = ("tests", "pipelines")
    for line, module in {"from tests.pipelines.test_alerting import publish": "tests.pipelines.test_alerting",
                         "import tests.test_cli": "tests.test_cli",
                         "from tests.pipelines import test_telemetry": "tests.pipelines.test_telemetry",
                         "from .test_config import x": "tests.pipelines.test_config",
                         "from ..test_cli import run_sentinel": "tests.test_cli",
                         "def f():\n    from tests.test_cli import run_sentinel": "tests.test_cli"}.items():
        assert module in [m for _, m in imported_modules(line, package)], line
    assert [m for _, m in imported_modules("from tests.helpers.cli import run_sentinel", package)] == \
        ["tests.helpers.cli", "tests.helpers.cli.run_sentinel"]
