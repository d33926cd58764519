"""Start a service the suite owns through the repo's own script (scripts/*.sh start)."""

from __future__ import annotations

import subprocess
from pathlib import Path

PATH = "/usr/sbin:/usr/bin:/bin"


def start_with_script(script: Path, env: dict[str, str], *, timeout: float) -> None:
    """Run ``script start`` (a no-op when the service runs); raise with its own words if it
    cannot start the service."""
    try:
        result = subprocess.run(
            [str(script), "start"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"PATH": PATH, **env},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{script} start did not finish in {timeout:g}s") from None
    if result.returncode != 0:
        raise RuntimeError(
            f"{script} start failed ({result.returncode}): "
            f"{(result.stderr or result.stdout).strip()}"
        )
