"""The TypeScript client (clients/typescript) as the tests drive it: its folder, and a
clear failure when Node.js or its packages are missing (`make test` installs them through
`make ts-deps`; a test never installs anything itself)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "typescript"
GENERATED = CLIENT / "src" / "generated"
# npm ci writes it last: older than the lock file means the packages are not the locked ones.
INSTALLED = CLIENT / "node_modules" / ".package-lock.json"


def require_packages() -> None:
    """Fail unless Node.js and the client's locked packages are installed."""
    for program in ("node", "npm"):
        if shutil.which(program) is None:
            pytest.fail(f"{program} not found: the TypeScript client needs Node.js 20 or later")
    manifests = (CLIENT / "package.json", CLIENT / "package-lock.json")
    newest = max(path.stat().st_mtime for path in manifests)
    if not INSTALLED.exists() or INSTALLED.stat().st_mtime < newest:
        pytest.fail("the TypeScript client's packages are missing or stale: run `make ts-deps`")
