"""The product's modules as the structural tests read them (the import layers, family branching)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipelines", "models", "feature_store")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))}


def parse(source: str) -> ast.Module:
    """``ast.parse``, once more if CPython 3.11 fails it spuriously: its AST constructor counts
    recursion in state the threads share (cpython gh-106905), so a traceback another thread
    formats at that moment (3.11 parses the source line for its carets) fails this parse with a
    "recursion depth mismatch" SystemError."""
    try:
        return ast.parse(source)
    except SystemError as error:
        if "recursion depth mismatch" not in str(error):
            raise
        return ast.parse(source)
