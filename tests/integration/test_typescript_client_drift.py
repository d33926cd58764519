"""The TypeScript client's generated files are what the API's OpenAPI document generates
today: scripts/ts_client.sh (`make ts-client`) runs into a temporary folder, and every file
must equal its committed copy under clients/typescript/src/generated/. A route, parameter or
schema changed without `make ts-client` fails here, with the first differing lines."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

from tests.support.typescript import GENERATED, ROOT, require_packages

GENERATE_TIMEOUT = 120.0


def test_generated_client_matches_the_openapi_document(tmp_path: Path) -> None:
    require_packages()
    done = subprocess.run(
        [ROOT / "scripts" / "ts_client.sh", tmp_path],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=GENERATE_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"scripts/ts_client.sh failed:\n{done.stdout}{done.stderr}"
    fresh = sorted(path.name for path in tmp_path.iterdir())
    committed = sorted(path.name for path in GENERATED.iterdir())
    assert fresh == committed, "run `make ts-client`"
    for name in fresh:
        new = (tmp_path / name).read_text().splitlines()
        old = (GENERATED / name).read_text().splitlines()
        diff = difflib.unified_diff(old, new, f"committed/{name}", f"generated/{name}", lineterm="")
        first = "\n".join(list(diff)[:40])
        assert not first, f"the generated client is stale: run `make ts-client`\n{first}"
