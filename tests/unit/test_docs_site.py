"""The documentation site's promises that no link checker sees: the README fits on two
screens and starts with its two commands, and every citation of the old operators' guide
(the page and a quoted section title, in code comments, messages and deploy files) names a
section that docs/operations.md still maps to its new page."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"
# `docs/operations.md, "Retention"`, `docs/operations.md ("Queue arguments"`,
# `[`docs/operations.md`](docs/operations.md), "Object storage"`, across a line break too.
CITATION = re.compile(r"docs/operations\.md`?\)?(?:,|\s\()\s*(?:#\s*)?\"([^\"]+)\"")


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / name for name in listed if not name.endswith((".png", ".lock"))]


def citations() -> list[tuple[str, str]]:
    found = []
    for path in tracked_files():
        if not path.is_file() or path == OPERATIONS:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for title in CITATION.findall(text):
            # A title wrapped over two comment lines: the comment marker is not in it.
            words = [word for word in title.split() if word not in {"#", "//"}]
            found.append((str(path.relative_to(ROOT)), " ".join(words)))
    return sorted(set(found))


def mapped_sections() -> set[str]:
    rows = re.findall(r"^\| (.+?) \| \[", OPERATIONS.read_text(encoding="utf-8"), re.MULTILINE)
    return set(rows)


def test_the_citations_were_found() -> None:
    # A pattern that finds nothing would pass the test below.
    cited = {title for _, title in citations()}
    assert {"PgBouncer", "Retention", "Upgrades"} <= cited


@pytest.mark.parametrize(("path", "section"), citations(), ids=lambda value: str(value))
def test_every_cited_section_of_the_old_guide_is_mapped(path: str, section: str) -> None:
    assert section in mapped_sections(), f"{path} cites docs/operations.md, {section!r}"


def test_the_readme_fits_on_two_screens_and_starts_with_its_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in first_block.splitlines()] == [
        ["make", "demo"],
        ["make", "test"],
    ]


def test_the_readmes_handler_is_the_tutorials_which_the_suite_runs() -> None:
    # The README's ten lines are cut from docs/tutorial.md's greetings.py, which
    # tests/e2e/test_tutorial.py runs against the real services.
    handler = README.read_text(encoding="utf-8").split("```python\n", 1)[1].split("```", 1)[0]
    tutorial = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
    greetings = tutorial.split('```python title="greetings.py"\n', 1)[1].split("```", 1)[0]
    assert handler.strip()
    assert handler in greetings
