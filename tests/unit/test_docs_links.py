"""Every relative link of README.md and docs/*.md leads somewhere: to a file of the repository, and to
a heading of that page when it names one (GitHub's anchors: the heading's slug)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target) and ![alt](target), not inside code; a target is what comes before a space or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The page without its code blocks and code spans, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings; a repeated heading gets ``-1``, ``-2``, as on GitHub."""
    found: set[str] = set()
    for line in re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M).splitlines():
        if match := re.match(r"#{1,6}\s+(.*)", line):
            name = base = slug(match.group(1))
            count = 0
            while name in found:
                count += 1
                name = f"{base}-{count}"
            found.add(name)
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # https:, mailto:: not this repository's
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file, {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_slugs_are_githubs():
    assert slug("Searches: Optuna") == "searches-optuna"
    assert slug("A task of another shape: char_lm") == "a-task-of-another-shape-char_lm"
    assert slug("Sweeps: jobs on a pool of devices") == "sweeps-jobs-on-a-pool-of-devices"
    assert slug("`hydra/launcher` and `local` (the default)") == "hydralauncher-and-local-the-default"
