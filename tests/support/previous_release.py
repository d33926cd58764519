"""The previous release, installed from the git history in a virtual environment of its own.

Its commit comes from the release record (jobcore.database.release_history), not from a tag: CI's
fresh clone may carry none. `git archive` of that commit, `python -m build --wheel`, and a
venv with the wheel, cached under var/previous-release/<commit>/ so reruns are fast (CI's
fresh clone builds it every run). Its dependencies are its own requirements.lock's pins:
the venv reuses the current venv's site-packages (a .pth line; the current venv's own .pth
files, the editable jobcore among them, are not read from there) for every pin that is
what the current venv has installed, and pip installs the others into the venv itself,
ahead of that line on sys.path. The lock pins every dependency, so the venv then holds
exactly its pins; a lock with one pin moved no longer means installing all of them.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import shutil
import site
import subprocess
import sys
from pathlib import Path

from jobcore.database.release_history import Release

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "var" / "previous-release"


def _run(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> bytes:
    result = subprocess.run(args, cwd=cwd, input=stdin, capture_output=True, check=False)
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({result.returncode}):\n"
            f"{result.stderr.decode(errors='replace')[-3000:]}"
        )
    return result.stdout


def _pins(lock: str) -> dict[str, str]:
    pins = {}
    for line in lock.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and not line.startswith("#"):
            pins[name.lower().replace("_", "-")] = version
    return pins


def _lock_digest() -> str:
    return hashlib.sha256((REPO / "requirements.lock").read_bytes()).hexdigest()[:16]


def _installed_here() -> dict[str, str]:
    return {
        (dist.metadata["Name"] or "").lower().replace("_", "-"): dist.version
        for dist in importlib.metadata.distributions()
    }


def venv(release: Release) -> Path:
    """The bin/ directory of a venv with ``release`` installed (built once per commit)."""
    target = CACHE / release.commit
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{release.commit}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # one builder at a time; the others reuse it
        # The venv may lean on the current venv's packages: rebuilt when its lock changes.
        stamp = f"{release.version} {release.commit} {_lock_digest()}\n"
        done = target / "complete"
        if not done.exists() or done.read_text() != stamp:
            _build(release, target)
            done.write_text(stamp)
    return target / "venv" / "bin"


def _build(release: Release, target: Path) -> None:
    has_commit = subprocess.run(
        ["git", "cat-file", "-e", f"{release.commit}^{{commit}}"], cwd=REPO, check=False
    )
    if has_commit.returncode != 0:
        raise AssertionError(
            f"release {release.version}'s commit {release.commit} is not in this clone's "
            "history (a shallow clone?): fetch it with `git fetch --unshallow`"
        )
    # Built where it stays: a venv's scripts name their interpreter by its path.
    shutil.rmtree(target, ignore_errors=True)
    source = target / "source"
    source.mkdir(parents=True)
    archive = _run("git", "archive", "--format=tar", release.commit, cwd=REPO)
    _run("tar", "-x", "-C", str(source), stdin=archive)
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", str(target / "dist"), str(source))
    [wheel] = (target / "dist").glob("jobcore-*.whl")
    _run(sys.executable, "-m", "venv", str(target / "venv"))
    pip = [str(target / "venv" / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    lock = (source / "requirements.lock").read_text()
    here = _installed_here()
    moved = [
        f"{name}=={version}" for name, version in _pins(lock).items() if here.get(name) != version
    ]
    _run(*pip, "install", "--quiet", "--no-deps", str(wheel), *moved)
    [site_dir] = (target / "venv" / "lib").glob("python*/site-packages")
    (site_dir / "_current_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
