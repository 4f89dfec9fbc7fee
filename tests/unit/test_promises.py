"""The promise table of docs/testing.md matches the pages it quotes and the tests it names: every quote
is on its page, every test exists, every test a page cites exists, and every promise of README.md
has a row (the rule is in docs/testing.md, "Promises and the tests that prove them")."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO

TESTING_PAGE = REPO / "docs" / "testing.md"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# `tests/unit/test_x.py::test_name`, or `test_x.py::test_name` (a file the page named before).
CITED_TEST = re.compile(r"(?P<file>(?:tests/[\w/]+/)?test_\w+\.py)::(?P<name>\w+)")


@dataclass(frozen=True)
class Promise:
    claim: str
    page: str
    tests: tuple[str, ...]


def marked(text: str, name: str) -> str:
    """What lies between ``<!-- name -->`` and ``<!-- /name -->``."""
    match = re.search(rf"<!-- {name} -->\n(.*?)<!-- /{name} -->", text, re.S)
    assert match, f"docs/testing.md has no <!-- {name} --> block"
    return match.group(1)


def promise_table() -> list[Promise]:
    rows = [
        line for line in marked(TESTING_PAGE.read_text(), "promises").splitlines() if line.startswith("|")
    ]
    promises = []
    for row in rows[2:]:  # the header and its rule
        claim, page, tests = (cell.strip() for cell in row.strip().strip("|").split("|"))
        promises.append(Promise(claim, page, tuple(t.strip() for t in tests.split("<br>") if t.strip())))
    return promises


def not_promises() -> list[str]:
    lines = marked(TESTING_PAGE.read_text(), "not-promises").splitlines()
    return [line.removeprefix("- ").strip() for line in lines if line.startswith("- ")]


def flat(text: str) -> str:
    """Text as a reader sees it: line breaks and runs of spaces made single spaces, and links without
    their targets (a link quoted in docs/testing.md points from docs/; tests/unit/test_docs_links.py
    checks where every link leads)."""
    return " ".join(re.sub(r"\]\([^)\s]*\)", "]", text).split())


def readme_clauses(text: str) -> list[str]:
    """README.md's prose as clauses: sentences (bullet items on their own) split at ``; ``.

    Left out: code blocks, HTML comments, headings, tables and images (commands are run by
    tests/integration/test_readme.py and checked by test_container.py, not listed here).
    """
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    items = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in paragraph.splitlines() if line.strip()]
        if not lines or lines[0].startswith(("#", "|", "![")):
            continue
        if lines[0].startswith("- "):
            for line in lines:
                if line.startswith("- "):
                    items.append(line[2:])
                else:
                    items[-1] += " " + line
        else:
            items.append(" ".join(lines))
    sentences = [s for item in items for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`\[*(])", flat(item))]
    return [clause.strip() for sentence in sentences for clause in sentence.split("; ") if clause.strip()]


@cache
def defined_functions(path: Path) -> frozenset[str]:
    """Names of the functions a test file defines (at module level or in a class)."""
    tree = ast.parse(path.read_text())
    return frozenset(
        node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    )


def cited_file(name: str) -> Path | None:
    """The test file a citation names: a path from the repository root, or a file name under tests/."""
    if "/" in name:
        return REPO / name if (REPO / name).is_file() else None
    found = sorted((REPO / "tests").rglob(name))
    return found[0] if len(found) == 1 else None


def test_every_quoted_promise_is_word_for_word_on_its_page():
    promises = promise_table()
    assert promises, "docs/testing.md's promise table is empty"
    missing = [
        f"{p.page}: {p.claim!r}"
        for p in promises
        if not (REPO / p.page).is_file() or flat(p.claim) not in flat((REPO / p.page).read_text())
    ]
    assert missing == [], "quoted in docs/testing.md but not on the page:\n" + "\n".join(missing)


def test_every_promise_names_tests_that_exist():
    wrong = []
    for promise in promise_table():
        if not promise.tests:
            wrong.append(f"{promise.claim!r}: no test")
        for test in promise.tests:
            file, _, name = test.partition("::")
            path = REPO / file
            if not (file.startswith("tests/") and path.is_file() and name.startswith("test_")):
                wrong.append(f"{promise.claim!r}: {test} is not tests/...py::test_name of an existing file")
            elif name not in defined_functions(path):
                wrong.append(f"{promise.claim!r}: {file} defines no {name}")
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_test_a_page_cites_exists(page):
    wrong = []
    for match in CITED_TEST.finditer(page.read_text()):
        path = cited_file(match["file"])
        if path is None:
            wrong.append(f"{match[0]}: no such test file (or more than one)")
        elif match["name"] not in defined_functions(path):
            wrong.append(f"{match[0]}: {path.relative_to(REPO)} defines no {match['name']}")
    assert wrong == [], f"{page.name} cites tests that do not exist:\n" + "\n".join(wrong)


def test_every_readme_promise_is_in_the_table():
    quotes = [flat(p.claim) for p in promise_table() if p.page == "README.md"]
    listed = quotes + [flat(s) for s in not_promises()]
    clauses = readme_clauses((REPO / "README.md").read_text())
    assert len(clauses) > 20, clauses  # the README's prose was found, not skipped as code
    unlisted = [c for c in clauses if not any(q in c or c in q for q in listed)]
    assert unlisted == [], (
        "README.md clauses neither in docs/testing.md's promise table nor listed as promising "
        "nothing testable:\n" + "\n".join(unlisted)
    )


def test_the_readme_rule_finds_clauses_bullets_and_skips_code():
    text = (
        "# Title\n\nFirst sentence. Second one; its clause.\n\n```bash\nnot = prose\n```\n\n"
        "<!-- a comment. -->\n- An item\n  wrapped.\n- Another.\n\n| a | table. |\n"
    )
    assert readme_clauses(text) == [
        "First sentence.",
        "Second one",
        "its clause.",
        "An item wrapped.",
        "Another.",
    ]
