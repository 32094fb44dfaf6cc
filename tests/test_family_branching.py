"""No family-specific branching outside the families package: a family is one module.

Reads every product module's source (as tests/test_import_layers.py does) for a comparison of a
``family`` value with one family's name (``family == "skew"``, ``f.family != ANOMALY``,
``family in (STATE_LEAK, SKEW)``) and for a dict literal keyed by family names: both are
behaviour of a family kept outside its module. Behaviour that differs by family is asked of the
family's spec (``BY_NAME[family].severity(...)``). The lab's and the simulator's scenarios may name
the families they inject: adding a family adds a scenario there (docs/DEVELOPING.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

from pipelines.families import FAMILIES
from tests.helpers.modules import ROOT, parse, product_modules

ALLOWED = ("pipelines.families", "pipelines.lab", "pipelines.simulator")
CONSTANTS = {"STATE_LEAK", "BACKPRESSURE", "SKEW", "CHECKPOINT_FAILURE", "ANOMALY"}


def _names_a_family(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and node.value in FAMILIES:
        return True
    if isinstance(node, ast.Name) and node.id in CONSTANTS:
        return True
    if isinstance(node, ast.Attribute) and node.attr in CONSTANTS:
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_family(e) for e in node.elts)
    return False


def _is_family_value(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        name = node.slice.value if isinstance(node.slice.value, str) else None
    return bool(name) and (name == "family" or name.endswith("_family"))


def family_branches(source: str) -> list[tuple[int, str]]:
    """(line, what) of every family-specific comparison and family-keyed dict in ``source``."""
    found = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_family_value(s) for s in sides) and any(_names_a_family(s) for s in sides):
                found.append((node.lineno, "compares a family with a family's name"))
        elif isinstance(node, ast.Dict):
            if any(key is not None and _names_a_family(key) for key in node.keys):
                found.append((node.lineno, "a table keyed by family names"))
    return found


def test_the_checker_sees_each_kind_of_branch():
    source = "\n".join(['if family == "skew": pass', "x = f.family != ANOMALY", 'y = row["family"] in (STATE_LEAK,)',
                        'z = {"backpressure": 1}', "ok = BY_NAME[family].supervised", 'fine = {"job": 1}'])
    assert [line for line, _ in family_branches(source)] == [1, 2, 3, 4]


def test_no_family_specific_branching_outside_the_families_package():
    problems = []
    for module, path in product_modules().items():
        if any(module == p or module.startswith(p + ".") for p in ALLOWED):
            continue
        problems += [f"{Path(path).relative_to(ROOT)}:{line}: {what}" for line, what in family_branches(path.read_text())]
    assert not problems, ("family-specific behaviour belongs in the family's module under pipelines/families/ "
                          "(ask BY_NAME[family] instead):\n" + "\n".join(problems))
