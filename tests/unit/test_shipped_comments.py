"""What shipped code says in its docstrings and comments points somewhere a reader can go:
no tracker issue numbers (the tracker is not shipped, and its numbers mean nothing to a
reader of the code), and every path under ``docs/`` exists in this repository (a document
elsewhere is given as a full URL)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(
    path
    for folder in ("libs", "services")
    for path in (ROOT / folder).rglob("*.py")
    if "__pycache__" not in path.parts
)

TRACKER_REFERENCE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
# A repository path: not the tail of a URL (``https://example.org/docs/x``) or of another path.
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*[\w/]")


def prose(source: str) -> list[tuple[int, str]]:
    """The docstrings and comments of a module, each with its first line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None and node.body:
                found.append((node.body[0].lineno, doc))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    return found


def problems(source: str, root: Path = ROOT) -> list[str]:
    found = []
    for line, text in prose(source):
        found += [f"{line}: tracker reference {m[0]!r}" for m in TRACKER_REFERENCE.finditer(text)]
        for match in DOCS_PATH.finditer(text):
            path = match[0].rstrip(".")
            if not (root / path).exists():
                found.append(f"{line}: {path} does not exist")
    return found


def test_the_checks_see_what_they_are_for(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("")
    source = '''"""Module docstring (docs/here.md, docs/here.md.)."""

# Fixed in Issue 12; see docs/gone.md.
def f() -> None:
    """As issue #3 said (https://opentelemetry.io/docs/specs/semconv/)."""
    text = "issue 4 in a string is data, docs/nowhere.md too"
'''
    assert problems(source, tmp_path) == [
        "5: tracker reference 'issue #3'",
        "3: tracker reference 'Issue 12'",
        "3: docs/gone.md does not exist",
    ]


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(ROOT)) for p in SHIPPED])
def test_shipped_docstrings_and_comments_cite_nothing_a_reader_cannot_reach(path: Path) -> None:
    assert not problems(path.read_text(encoding="utf-8")), problems(path.read_text())


def test_pyproject_comments_cite_no_tracker_issue() -> None:
    comments = [line for line in (ROOT / "pyproject.toml").read_text().splitlines() if "#" in line]
    assert not [line for line in comments if TRACKER_REFERENCE.search(line.split("#", 1)[1])]
