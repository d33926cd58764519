"""The testing kit's example (docs/how-to/test-handlers.md) is the test the suite runs, word for
word."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "integration" / "testing_kit" / "test_readme_example.py"


def test_the_docs_show_the_example_test_as_it_is() -> None:
    page = (ROOT / "docs" / "how-to" / "test-handlers.md").read_text()
    assert f"```python\n{EXAMPLE.read_text()}```\n" in page
