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


# --- measured figures come from `jobcore bench`, never typed (issue 34) -----------------

# A measurement as prose types it: a rate, a cost per unit of work, a ratio, a percentile.
# A setting ("`JOBCORE_...=2`", "every 50 ms") matches none of these; a target states its
# bar with ≥ or ≤ and its line is left alone.
MEASURED_FIGURE = re.compile(
    r"""
      \d[\d,.]*\s?(?:jobs|req|requests|rows|msg|messages|enqueues)/s\b
    | \d[\d.]*\s?(?:ms|µs)(?:/job|/request|/message|\s(?:a|per)\s(?:job|request|message)\b)
    | \d\.\d+\s?×
    | \bp(?:50|99)\s+(?:of\s+)?\d[\d.]*\s?m?s\b
    """,
    re.VERBOSE,
)
PROSE_PAGES = sorted(
    [
        README,
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "docs" / "explanation").glob("*.md"),
        *(ROOT / "docs" / "how-to").glob("*.md"),
        ROOT / "docs" / "bench" / "measurements.md",
    ]
)


def typed_figures(text: str) -> list[str]:
    """Measured figures in a page's prose: outside code blocks and generated markers (which
    the build replaces with a report's own lines), on lines that state no ≥ / ≤ target."""
    found = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced or line.startswith("<!-- generated:") or "≥" in line or "≤" in line:
            continue
        found += [f"{number}: {match[0]!r}" for match in MEASURED_FIGURE.finditer(line)]
    return found


def test_the_figure_pattern_tells_measurements_from_settings_and_targets() -> None:
    measured = [
        "Its last run showed 589 jobs/s against Celery's 1,145.",
        "the relay at 31 µs a message against 289 µs",
        "0.51× Celery's rate",
        "idle enqueue→start p50 8.5 ms",
        "the API answered 273 req/s",
        "drained 10 300 jobs/s",
    ]
    kept = [
        "`JOBCORE_DB_CONNECT_TIMEOUT=2` and a poll every 50 ms",
        "the target is p50 ≤ 5 ms, p99 ≤ 20 ms",
        "relay throughput at the largest step ≥ 0.8× at the smallest",
        "```\njobcore bench peers --jobs 20000  # 589 jobs/s\n```",
        "<!-- generated: bench-report docs/bench/peers -->",
        "a batch of 1,000 items, retries due within 10 ms",
    ]
    assert all(typed_figures(text) for text in measured)
    assert not [text for text in kept if typed_figures(text)]


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_page_types_a_measured_figure(page: Path) -> None:
    name = page.relative_to(ROOT).as_posix()
    figures = typed_figures(page.read_text(encoding="utf-8"))
    assert not figures, (
        f"{name} types measured figures (embed the report with "
        f"`<!-- generated: bench-report docs/bench/FOLDER -->` or link it): {figures}"
    )


# --- the bench-report marker ------------------------------------------------------------


def _hooks():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Page:
    class file:  # mkdocs' attribute name
        src_path = "explanation/benchmarks.md"


def test_a_bench_report_marker_embeds_the_reports_own_rows_and_plot() -> None:
    hooks = _hooks()
    report = (ROOT / "docs" / "bench" / "peers" / "report.md").read_text(encoding="utf-8")
    rows = [line for line in report.splitlines() if line.startswith("| peers |")]
    rendered = hooks.on_page_markdown("<!-- generated: bench-report docs/bench/peers -->", _Page)
    assert rows
    assert all(row in rendered for row in rows)
    assert "](../bench/peers/peers.png)" in rendered
    assert "](../bench/peers/report.md)" in rendered


def test_a_scenario_of_the_full_report_embeds_that_scenarios_rows_only() -> None:
    rendered = _hooks().on_page_markdown("<!-- generated: bench-report docs/bench relay -->", _Page)
    rows = [line for line in rendered.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["relay"] * (len(rows) - 1)
    assert len(rows) > 1
    assert "](../bench/relay.png)" in rendered


@pytest.mark.parametrize(
    "marker",
    [
        "<!-- generated: bench-report docs/bench/no-such-run -->",
        "<!-- generated: bench-report docs/bench no_such_scenario -->",
        "<!-- generated: bench-report ../etc -->",
        "<!-- generated: bench-report -->",
        "<!--generated: bench -->",
        "<!-- generated: no-such-table -->",
    ],
)
def test_a_marker_that_cannot_be_generated_fails_the_build(marker: str) -> None:
    hooks = _hooks()
    with pytest.raises(hooks.GeneratedReferenceError):
        hooks.on_page_markdown(f"text\n{marker}\nmore\n", _Page)
