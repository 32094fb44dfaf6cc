"""The product's layers hold: no module of pipelines/, models/ or feature_store/ imports a layer above its own.

Read the modules' source (every import statement, those inside functions too), so a layer
broken by a lazy import fails here as well as one at the top of a file. The layers, lowest first,
are :data:`LAYERS`; docs/DEVELOPING.md draws the same map. A module of the same layer may be
imported (the runtimes use each other's parts); a new package or top-level module must be given
a layer here before the test passes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.modules import PACKAGES, ROOT, parse, product_modules

# Lowest first. A module belongs to the longest prefix listed (pipelines.detection.job to
# pipelines.detection). Each layer may import its own and the ones before it, never one after it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation: names, config, contracts, I/O, text", (
        "pipelines", "pipelines.errors", "pipelines.durations", "pipelines.families", "pipelines.config",
        "pipelines.config_reference", "pipelines.contracts",
        "pipelines.io", "pipelines.datasets", "pipelines.telemetry", "pipelines.display", "pipelines.spark_session")),
    ("features", ("feature_store",)),
    ("scorable models", ("models", "models.detectors", "models.post_rule", "models.registry", "models.baseline",
                         "models.validation")),
    ("incident domain", ("pipelines.incidents",)),
    ("model workflows", ("models.training", "models.evaluation", "models.feedback")),
    ("runtimes and reports", ("pipelines.detection", "pipelines.collector", "pipelines.simulator", "pipelines.lab",
                              "pipelines.alerting", "pipelines.reports", "pipelines.feedback", "pipelines.selfcheck")),
    ("command line", ("pipelines.cli",)),
)


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module`` (by its longest listed prefix); None if unlisted."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def imported(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) of every import of the product's packages in ``source``; ``from a import b``
    counts as ``a.b`` (``b`` may be a module), relative imports resolved against ``module``."""
    found = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in PACKAGES]


def broken_rules(root: Path = ROOT) -> list[str]:
    """One line per import that runs up the layers, and per module that has no layer."""
    problems = []
    for module, path in product_modules(root).items():
        own = layer_of(module)
        if own is None:
            problems.append(f"{module} ({path.relative_to(root)}) has no layer: add it to LAYERS in {Path(__file__).name}")
            continue
        for line, target in imported(path.read_text(), module, path.name == "__init__.py"):
            theirs = layer_of(target)
            if theirs is not None and theirs > own:
                problems.append(f"{path.relative_to(root)}:{line}: {module} (layer {own + 1}, {LAYERS[own][0]}) imports "
                                f"{target} (layer {theirs + 1}, {LAYERS[theirs][0]})")
    return problems


def test_no_module_imports_a_layer_above_its_own():
    problems = broken_rules()
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


def test_the_check_sees_an_upward_import_inside_a_function(tmp_path):
    """The rule as it reads on a small tree: a lazy import up the layers is found, the same import
    down the layers and one within a layer are not."""
    (tmp_path / "models").mkdir()
    (tmp_path / "pipelines" / "detection").mkdir(parents=True)
    for package in ("models", "pipelines", "pipelines/detection", "feature_store"):
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "models" / "evaluation.py").write_text(
        "from models import detectors\n\ndef replay():\n    from pipelines.detection import policy\n")
    (tmp_path / "models" / "detectors.py").write_text("from pipelines.families import FAMILIES\n")
    (tmp_path / "pipelines" / "detection" / "job.py").write_text(
        "from models.evaluation import replay\nfrom . import processor\nfrom pipelines.collector import rest\n")
    (tmp_path / "pipelines" / "families.py").write_text("")
    assert broken_rules(tmp_path) == [
        "models/evaluation.py:4: models.evaluation (layer 5, model workflows) imports pipelines.detection.policy "
        "(layer 6, runtimes and reports)"]


@pytest.mark.parametrize("module, layer", [("pipelines.detection.job", "runtimes and reports"),
                                           ("pipelines.incidents.policy", "incident domain"),
                                           ("models.registry", "scorable models"),
                                           ("pipelines.families", "foundation: names, config, contracts, I/O, text"),
                                           ("pipelines.cli", "command line")])
def test_a_module_takes_the_layer_of_its_longest_listed_prefix(module, layer):
    assert LAYERS[layer_of(module)][0] == layer
