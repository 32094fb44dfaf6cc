"""The product's modules are sized for a reader: a package's ``__init__.py`` says what its layer is
and re-exports, and a module over :data:`MAX_MODULE_LINES` lines says in its opening docstring
why it is one piece (a line beginning "One piece:"), as issue 56 asks.

Reads every module of ``pipelines/``, ``models/`` and ``feature_store/`` as the import-layer test
does.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.modules import PACKAGES, ROOT, parse, product_modules

MAX_INIT_LINES = 40
MAX_MODULE_LINES = 500


def defined_and_re_exported(source: str) -> tuple[int, int]:
    """(names the module's top level defines, names it imports from the product's packages):
    functions, classes and assigned names count as defined, except ``__all__``; an import of the
    standard library or a third party is the module's own code, not a re-export."""
    defined = re_exported = 0
    for node in parse(source).body:
        if isinstance(node, ast.ImportFrom):
            if node.level or (node.module or "").split(".")[0] in PACKAGES:
                re_exported += len(node.names)
        elif isinstance(node, ast.Import):
            re_exported += sum(1 for alias in node.names if alias.name.split(".")[0] in PACKAGES)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined += 1
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined += sum(1 for t in targets if not (isinstance(t, ast.Name) and t.id == "__all__"))
    return defined, re_exported


def says_it_is_one_piece(source: str) -> bool:
    """Whether the opening docstring has a line beginning "One piece:" (the reason follows)."""
    docstring = ast.get_docstring(parse(source)) or ""
    return any(line.strip().lower().startswith("one piece:") for line in docstring.splitlines())


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_no_init_over_40_lines_defines_more_than_it_re_exports():
    problems = []
    for path in product_modules().values():
        if path.name != "__init__.py":
            continue
        source = path.read_text()
        lines = len(source.splitlines())
        defined, re_exported = defined_and_re_exported(source)
        if lines > MAX_INIT_LINES and defined > re_exported:
            problems.append(f"{_relative(path)}: {lines} lines, defines {defined} names, re-exports {re_exported}")
    assert not problems, ("an __init__.py says what its layer is and re-exports; move the code to a named "
                          "module:\n" + "\n".join(problems))


def test_a_module_over_500_lines_says_why_it_is_one_piece():
    problems = []
    for path in product_modules().values():
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES and not says_it_is_one_piece(source):
            problems.append(f"{_relative(path)}: {lines} lines")
    assert not problems, ("split these by what they do, or say in the opening docstring why each is one piece "
                          "(a line beginning 'One piece:' and the reason):\n" + "\n".join(problems))


def test_the_checks_read_definitions_re_exports_and_the_reason():
    init = ('"""A layer."""\nfrom __future__ import annotations\nimport json\nfrom pipelines.a import b, c\n'
            'from .d import e\nimport models.f\n__all__ = ["b"]\nX = 1\n')
    assert defined_and_re_exported(init) == (1, 4)
    assert defined_and_re_exported("import json\ndef f():\n    pass\nclass C:\n    pass\nY: int = 2\n") == (3, 0)
    assert says_it_is_one_piece('"""A model.\n\nOne piece: its parts read one another at every tick.\n"""\n')
    assert not says_it_is_one_piece('"""A model of one piece: nothing says why."""\n')
    assert not says_it_is_one_piece("x = 1\n")
