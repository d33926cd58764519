"""The layout block (docs/reference/layout.md) and the README's "Where things go" paragraph
name files, folders and modules that exist: a module moved or renamed fails here until the
documentation follows."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from jobcore.kernel.settings import RelayOptions, Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
LAYOUT = (ROOT / "docs" / "reference" / "layout.md").read_text(encoding="utf-8")


def _where_things_go() -> str:
    start = README.index("**Where things go.**")
    return README[start : README.index("\n\n", start)]


def _layout_block() -> str:
    start = LAYOUT.index("# Layout")
    opening = LAYOUT.index("```\n", start) + 4
    return LAYOUT[opening : LAYOUT.index("```", opening)]


def _paths(text: str) -> set[str]:
    """Repository paths in backquotes (``libs/jobcore/kernel/settings.py``, ``services/cli/``)."""
    quoted = re.findall(r"`([^`\s]+)`", text)
    return {q for q in quoted if "/" in q and not q.startswith(("JOBCORE_", "http"))} | {
        q for q in quoted if re.fullmatch(r"[\w.-]+\.(py|toml|md)", q)
    }


def _modules(text: str) -> set[str]:
    """Dotted module names in backquotes (``jobcore.execution.registry``, ``services.cli``)."""
    return {
        q for q in re.findall(r"`([\w.]+)`", text) if q.split(".")[0] in ("jobcore", "services")
    }


def _layout_paths() -> set[str]:
    # The left column; `tests/{unit,integration}/` stands for each of those folders.
    paths = set()
    for line in _layout_block().splitlines():
        if not line or line[0] == " ":
            continue
        path = line.split()[0]
        if braces := re.fullmatch(r"(.*)\{([^}]*)\}(.*)", path):
            paths |= {f"{braces[1]}{part}{braces[3]}" for part in braces[2].split(",")}
        else:
            paths.add(path)
    return paths


WHERE_PATHS = sorted(_paths(_where_things_go()))
WHERE_MODULES = sorted(_modules(_where_things_go()))
LAYOUT_PATHS = sorted(_layout_paths())


def test_the_paragraph_and_the_block_were_found() -> None:
    # A parser that finds nothing would pass everything below.
    assert {"libs/jobcore/kernel/settings.py", "services/cli/__init__.py"} <= set(WHERE_PATHS)
    assert {"jobcore.execution.registry", "services.cli", "services.bench"} <= set(WHERE_MODULES)
    assert {"services/entry.py", "libs/jobcore/usecases/", "tests/unit/"} <= set(LAYOUT_PATHS)


@pytest.mark.parametrize("path", sorted({*WHERE_PATHS, *LAYOUT_PATHS}))
def test_every_path_named_exists(path: str) -> None:
    target = ROOT / path
    assert target.is_dir() if path.endswith("/") else target.is_file(), path


@pytest.mark.parametrize("module", WHERE_MODULES)
def test_every_module_named_exists(module: str) -> None:
    assert importlib.util.find_spec(module) is not None, module


def test_relay_settings_are_where_the_paragraph_says() -> None:
    assert "A *relay setting* is a field of `RelayOptions`" in README
    fields = RelayOptions.model_fields
    assert {"batch_size", "poll_interval", "max_publish_attempts", "health_port"} <= set(fields)
    assert not {name for name in Settings.model_fields if name.startswith("relay_")}
