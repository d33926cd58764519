"""HTTP load from ``wrk``, a C load generator: a few percent of a core where the servers
it measures take a whole one, so it is not what limits the figure.

Every request is a ``POST`` of the same small JSON body with a fresh ``Idempotency-Key``
(``<run prefix>-<thread>-<counter>``, made in wrk's Lua), so jobcore stores a new job each
time instead of answering a replay. The ``Authorization`` value comes from the
environment (``JOBCORE_BENCH_AUTH``), never the command line. wrk's own CPU time is read
from its rusage when it ends; its figures from the JSON its Lua ``done`` hook prints.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

INSTALL_HINT = "wrk is not installed: run scripts/install_tools.sh (Debian package wrk)"
_MARK = "JOBCORE-WRK-RESULT "

SCRIPT = """
local counter = 0
local threads = 0
local path, body, prefix
local auth = os.getenv("JOBCORE_BENCH_AUTH")

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

function init(args)
  path, body, prefix = args[1], args[2], args[3]
end

function request()
  counter = counter + 1
  local headers = {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = prefix .. "-" .. (tid or 1) .. "-" .. counter,
  }
  if auth ~= nil and auth ~= "" then
    headers["Authorization"] = auth
  end
  return wrk.format("POST", path, headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "%s{\\"requests\\": %d, \\"duration_us\\": %d, \\"status_errors\\": %d, " ..
    "\\"socket_errors\\": %d, \\"p50_us\\": %d, \\"p99_us\\": %d, \\"max_us\\": %d}\\n",
    "%MARK%", summary.requests, summary.duration, e.status,
    e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
""".replace("%MARK%", _MARK)


def wrk_path() -> str | None:
    return shutil.which("wrk")


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    # Answers outside 2xx/3xx, and connect/read/write/timeout errors.
    status_errors: int
    socket_errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    # wrk's own CPU (user + system) over the run, as a percentage of one core.
    cpu_pct: float
    command: str

    @property
    def rate(self) -> float:
        return round(self.requests / self.seconds, 1) if self.seconds else 0.0


def _run(command: list[str], env: dict[str, str]) -> tuple[str, str, float]:
    """Run wrk to the end; its stdout, its stderr and its CPU seconds (rusage)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited with {proc.returncode}: {stderr.strip()[-500:]}")
    return stdout, stderr, usage.ru_utime + usage.ru_stime


async def post_load(
    port: int,
    path: str,
    *,
    connections: int,
    seconds: float,
    prefix: str,
    auth: str | None = None,
    body: bytes = b"{}",
    threads: int = 1,
) -> WrkResult:
    """``seconds`` of POSTs to ``path`` over ``connections`` keep-alive connections."""
    wrk = wrk_path()
    if wrk is None:
        raise RuntimeError(INSTALL_HINT)
    with tempfile.TemporaryDirectory(prefix="jobcore-wrk-") as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(SCRIPT)
        command = [
            *(wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s"),
            *("--timeout", "10s", "-s", str(script)),
            f"http://127.0.0.1:{port}{path}",
            *("--", path, body.decode(), prefix),
        ]
        env = {**os.environ, "JOBCORE_BENCH_AUTH": auth or ""}
        stdout, _, cpu = await asyncio.to_thread(_run, command, env)
    line = next((x for x in stdout.splitlines() if x.startswith(_MARK)), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result: {stdout.strip()[-500:]}")
    data = orjson.loads(line[len(_MARK) :])
    elapsed = data["duration_us"] / 1e6
    # The flags as a reader would retype them (no temporary path, no port).
    shown = " ".join(["wrk", *command[1:4], "-s", "post.lua"])
    return WrkResult(
        requests=data["requests"],
        seconds=elapsed,
        status_errors=data["status_errors"],
        socket_errors=data["socket_errors"],
        p50_ms=round(data["p50_us"] / 1000, 2),
        p99_ms=round(data["p99_us"] / 1000, 2),
        max_ms=round(data["max_us"] / 1000, 2),
        cpu_pct=round(100 * cpu / elapsed, 1) if elapsed else 0.0,
        command=shown,
    )
