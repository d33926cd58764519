"""Every package of the library maps its modules in its docstring: each module and
subpackage it holds is named there (``:mod:`.name``` or its full dotted name), and every
``:mod:`.name``` there is one it holds. A module added without a line in its package's map,
or renamed without its line, fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import jobcore

LIB = Path(jobcore.__file__).parent


def _packages() -> list[tuple[str, Path]]:
    found = []
    for init in sorted(LIB.rglob("__init__.py")):
        if "__pycache__" in init.parts:
            continue
        relative = init.parent.relative_to(LIB).parts
        found.append((".".join(("jobcore", *relative)), init.parent))
    return found


def _children(path: Path) -> list[str]:
    modules = [p.stem for p in path.glob("*.py") if p.stem not in ("__init__", "__main__")]
    packages = [p.name for p in path.iterdir() if (p / "__init__.py").is_file()]
    return sorted(modules + packages)


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse((path / "__init__.py").read_text())) or ""


def _named(doc: str, package: str, child: str) -> bool:
    relative = rf":mod:`~?\.{child}`"
    dotted = rf"(?<![\w.]){re.escape(package)}\.{child}(?!\w)"
    return re.search(relative, doc) is not None or re.search(dotted, doc) is not None


PACKAGES = _packages()


def test_the_library_has_its_packages() -> None:
    # A guard for the walk itself: it sees the layout, not an empty directory.
    names = {name for name, _ in PACKAGES}
    assert {"jobcore", "jobcore.kernel", "jobcore.database.store", "jobcore.usecases"} <= names


@pytest.mark.parametrize(("package", "path"), PACKAGES, ids=[name for name, _ in PACKAGES])
def test_the_package_docstring_names_every_module(package: str, path: Path) -> None:
    doc = _docstring(path)
    missing = [child for child in _children(path) if not _named(doc, package, child)]
    assert not missing, f"{package}/__init__.py's docstring does not map {missing}"


@pytest.mark.parametrize(("package", "path"), PACKAGES, ids=[name for name, _ in PACKAGES])
def test_the_package_docstring_names_only_modules_it_holds(package: str, path: Path) -> None:
    named = re.findall(r":mod:`~?\.(\w+)`", _docstring(path))
    unknown = sorted(set(named) - set(_children(path)))
    assert not unknown, f"{package}/__init__.py's docstring maps modules it lacks: {unknown}"


def test_a_module_left_out_of_the_map_is_seen() -> None:
    doc = ":mod:`.kernel`: the kernel; and ``jobcore.database``."
    assert _named(doc, "jobcore", "kernel")
    assert _named(doc, "jobcore", "database")
    assert not _named(doc, "jobcore", "telemetry")
    assert not _named(":mod:`.kernels`", "jobcore", "kernel")
