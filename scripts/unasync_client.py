"""Generate the blocking client (libs/jobcore/client/sync.py) from the asyncio one (aio.py).

`python scripts/unasync_client.py` writes it; `--check` exits 1 if the file on disk is
not what this would write. unasync drops ``async`` and ``await`` and renames the tokens
below; the module docstring is the blocking client's own.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import unasync

CLIENT = Path(__file__).resolve().parents[1] / "libs" / "jobcore" / "client"
SOURCE = CLIENT / "aio.py"
TARGET = CLIENT / "sync.py"

RENAMES = {
    # Ours: the asyncio names and their blocking twins.
    "AsyncClient": "Client",  # and httpx's
    "AsyncResultStream": "ResultStream",
    "async_sleep": "sleep",
    "async_write": "write",
    # httpx's asyncio methods.
    "aclose": "close",
    "aread": "read",
    "aiter_bytes": "iter_bytes",
}

DOCSTRING = '''"""The blocking client: :class:`Client`, with the calls of
:class:`~jobcore.client.AsyncClient`.

Generated from :mod:`jobcore.client.aio` by ``scripts/unasync_client.py``: do not edit."""'''


def generated() -> str:
    """What sync.py should hold."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "_async" / "client.py"
        source.parent.mkdir()
        source.write_text(SOURCE.read_text(encoding="utf-8"), encoding="utf-8")
        unasync.unasync_files([str(source)], [unasync.Rule("/_async/", "/_sync/", RENAMES)])
        text = (Path(tmp) / "_sync" / "client.py").read_text(encoding="utf-8")
    end = text.index('"""', 3) + 3
    return DOCSTRING + text[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if sync.py is stale")
    args = parser.parse_args()
    text = generated()
    if args.check:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET} is stale: run python scripts/unasync_client.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
