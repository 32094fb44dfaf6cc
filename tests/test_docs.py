"""The docs a user reads: README.md, BENCHMARKS.md and docs/*.md link only to what exists, and the README stays short."""

import re
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

README_MAX_LINES = 260
DOCS = [PROJECT_ROOT / "README.md", PROJECT_ROOT / "BENCHMARKS.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def github_anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return "".join(ch for ch in text if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    for line in FENCE.sub("", markdown).splitlines():
        if match := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            anchor = github_anchor(match.group(1))
            unique, n = anchor, 0
            while unique in found:
                n += 1
                unique = f"{anchor}-{n}"
            found.add(unique)
    return found


def relative_links(markdown: str) -> list[str]:
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return [target for target in LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def broken_links(page: Path) -> list[str]:
    problems = []
    for target in relative_links(page.read_text()):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            problems.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            problems.append(f"{target}: no heading with that anchor in {linked.name}")
    return problems


@pytest.mark.parametrize("page", DOCS, ids=lambda page: page.name)
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_readme_stays_short():
    lines = (PROJECT_ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move the details into docs/"


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## A `key` (and more)\n\n```\n## not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-key-and-more) [gone](missing.md) [bad](other.md#not-a-heading) "
                    "[self](#here) `[code](missing.md)` [web](https://example.com/x)\n\n## Here\n")
    assert broken_links(page) == ["missing.md: no such file",
                                  "other.md#not-a-heading: no heading with that anchor in other.md"]
    assert github_anchor("The collector against a fleet (`benchmarks/collector.py`)") == \
        "the-collector-against-a-fleet-benchmarkscollectorpy"
