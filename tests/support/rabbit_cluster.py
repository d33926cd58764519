"""The three-node RabbitMQ cluster of scripts/rabbit_cluster.sh, seen from the tests.

CI starts it early (.ci/run); :func:`ensure_cluster` starts it when it does not run, so
the tests that need it also work on their own (`make test` on a fresh machine). Nodes
are numbered 1-3 (jcrN@localhost, AMQP port 5680+N); the machine's own node is never
touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "rabbit_cluster.sh"
NODES = (1, 2, 3)
# Three nodes booting and joining take 30-90 s on 2 busy cores.
START_TIMEOUT = 420.0


def node_name(n: int) -> str:
    return f"jcr{n}@localhost"


def node_number(name: str) -> int:
    return int(name.removeprefix("jcr").split("@", 1)[0])


def _script(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@dataclass(frozen=True)
class Cluster:
    urls: str  # the JOBCORE_AMQP_URL listing the three nodes

    def pid(self, n: int) -> int | None:
        """The OS pid of node ``n``'s Erlang VM, None if it does not run."""
        out = _script("pid", str(n))
        return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None

    def kill(self, n: int) -> None:
        """SIGKILL node ``n``'s Erlang VM: no shutdown, no goodbye to its peers."""
        pid = self.pid(n)
        assert pid is not None, f"{node_name(n)} is not running"
        os.kill(pid, signal.SIGKILL)

    def start_node(self, n: int) -> None:
        """Start node ``n`` again (its data says which cluster it belongs to)."""
        out = _script("start-node", str(n), timeout=START_TIMEOUT)
        assert out.returncode == 0, f"{node_name(n)} did not start again: {out.stderr[-2000:]}"

    def queues(self, via: int) -> dict[str, dict[str, Any]]:
        """Every queue by name with its type, leader, members and online members, as node
        ``via`` sees them."""
        out = _script(
            "ctl", str(via), "list_queues", "name", "type", "leader", "members", "online",
            "--formatter", "json",
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"list_queues on {node_name(via)}: {out.stderr.strip()[-500:]}")
        return {row["name"]: row for row in json.loads(out.stdout or "[]")}


def ensure_cluster() -> Cluster:
    """The running cluster, started first if needed; RuntimeError saying why it cannot be."""
    if _script("status").returncode != 0:
        started = time.monotonic()
        out = _script("start", timeout=START_TIMEOUT)
        if out.returncode != 0:
            raise RuntimeError(
                f"scripts/rabbit_cluster.sh start failed after {time.monotonic() - started:.0f}s"
                f" (it needs Debian's rabbitmq-server): {out.stderr.strip()[-2000:]}"
            )
    urls = _script("urls").stdout.strip()
    if not urls:
        raise RuntimeError("scripts/rabbit_cluster.sh urls printed nothing")
    return Cluster(urls)
