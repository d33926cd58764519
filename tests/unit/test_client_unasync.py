"""The blocking client is generated from the asyncio one: the module on disk must be what
scripts/unasync_client.py writes today, so a change to aio.py reaches both clients."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_blocking_client_is_generated_from_the_asyncio_one() -> None:
    spec = importlib.util.spec_from_file_location(
        "unasync_client", ROOT / "scripts/unasync_client.py"
    )
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    on_disk = (ROOT / "libs/jobcore/client/sync.py").read_text(encoding="utf-8")
    assert script.generated() == on_disk, "stale: run python scripts/unasync_client.py"
    # Generated, not merely alike: no asyncio call survives the translation.
    assert "await " not in on_disk
    assert "async " not in on_disk
