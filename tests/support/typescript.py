"""The TypeScript client (clients/typescript) and the Node example of the SQL enqueue
(clients/sql-examples/node) as the tests drive them: their folders, and a
clear failure when Node.js or their packages are missing (`make test` installs them through
`make ts-deps`; a test never installs anything itself)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "typescript"
GENERATED = CLIENT / "src" / "generated"
SQL_NODE = ROOT / "clients" / "sql-examples" / "node"


def require_packages(folder: Path = CLIENT) -> None:
    """Fail unless Node.js and the locked packages of ``folder`` are installed."""
    for program in ("node", "npm"):
        if shutil.which(program) is None:
            pytest.fail(f"{program} not found: {folder.name} needs Node.js 20 or later")
    manifests = (folder / "package.json", folder / "package-lock.json")
    newest = max(path.stat().st_mtime for path in manifests)
    # npm ci writes it last: older than the lock file means the packages are not the locked ones.
    installed = folder / "node_modules" / ".package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < newest:
        pytest.fail(f"the packages of {folder} are missing or stale: run `make ts-deps`")
