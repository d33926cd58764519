"""startup: how long each jobcore process takes from its start to ready, against the
smallest FastAPI app that answers an enqueue and against the interpreter alone.

Rolling restarts and autoscaling pay this on every start. Per run, each process is started
on its own (a scratch database already migrated, the broker up), and the clock runs from
just before the process is spawned to the first 200 of its ``/readyz`` (the API: database
connected and schema checked; the relay: database and broker connected; the worker:
consuming), polled every 10 ms. The baselines are measured the same way in the same run:
the interpreter starting and exiting (``python -c pass``), the floor of any Python
process, and :mod:`services.bench.minimal_app` until its first ``202``.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import free_port
from jobcore.testing.processes import ROOT, jobcore_command, settings_env
from services.bench.harness import Bench, Options
from services.bench.report import Figure, Section

TITLE = "Process start to ready: API, relay and worker against a minimal FastAPI app"
PROCESSES = ("api", "relay", "worker")
# A process not ready in this time fails the run: a start that slow is a bug to look at.
READY_TIMEOUT = 60.0
POLL = 0.01


def steps(options: Options) -> int:
    return options.runs


def _command(process: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The command line and the extra environment of ``process`` serving ``port``."""
    if process == "api":
        return jobcore_command("api", "--port", str(port)), {}
    if process == "relay":
        return jobcore_command("relay"), {"JOBCORE_RELAY_HEALTH_PORT": str(port)}
    if process == "worker":
        return jobcore_command("worker"), {"JOBCORE_WORKER_HEALTH_PORT": str(port)}
    if process == "minimal":
        return [
            *(sys.executable, "-m", "uvicorn", "--factory"),
            "services.bench.minimal_app:app_from_environment",
            *("--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop"),
            *("--http", "httptools", "--no-access-log", "--log-level", "warning"),
        ], {}
    raise ValueError(process)


def _probe(process: str, port: int) -> Callable[[httpx.AsyncClient], Awaitable[bool]]:
    async def ready(client: httpx.AsyncClient) -> bool:
        if process == "minimal":
            answer = await client.post(f"http://127.0.0.1:{port}/jobs/noop", json={})
            return answer.status_code == 202
        return (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200

    return ready


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _spawn(
    command: list[str], env: dict[str, str], log_path: Path
) -> tuple[float, subprocess.Popen[bytes]]:
    """The process started, and the monotonic time just before it was."""
    with open(log_path, "ab") as log:
        started = time.monotonic()
        proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return started, proc


def with_bytecode(env: dict[str, str], cache: Path) -> dict[str, str]:
    """``env`` for a process that keeps its compiled bytecode in ``cache``, as an installed
    wheel has it: with PYTHONDONTWRITEBYTECODE set (as on a developer's machine) and the
    package installed from its sources, every start would compile each of jobcore's
    modules again, a cost no deployed replica pays."""
    env = {**env, "PYTHONPYCACHEPREFIX": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


async def time_to_ready(
    config: Settings, process: str, log_path: Path, bytecode: Path | None = None
) -> float:
    """Seconds from spawning ``process`` to its first ready answer (its bytecode kept in
    ``bytecode`` when given: :func:`with_bytecode`)."""
    port = free_port()
    command, extra = _command(process, port)
    ready = _probe(process, port)
    env = settings_env(config, **extra)
    started, proc = _spawn(
        command, env if bytecode is None else with_bytecode(env, bytecode), log_path
    )
    try:
        async with httpx.AsyncClient(timeout=1) as client:
            while time.monotonic() - started < READY_TIMEOUT:
                if proc.poll() is not None:
                    raise RuntimeError(f"{process} exited while starting; see {log_path}")
                with contextlib.suppress(httpx.HTTPError):
                    if await ready(client):
                        return time.monotonic() - started
                await asyncio.sleep(POLL)
        raise RuntimeError(f"{process} was not ready in {READY_TIMEOUT:.0f} s; see {log_path}")
    finally:
        await asyncio.to_thread(_stop, proc)


def interpreter_start() -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.monotonic() - started


async def _time_starts(
    bench: Bench, log_dir: Path, runs: dict[str, list[float]], bytecode: Path
) -> None:
    """Append to ``runs`` each process's start-to-ready seconds, ``bench.options.runs``
    times, after one untimed start of each that compiles what the timed ones then load."""
    async with bench.scratch("startup") as config:
        for name in (*PROCESSES, "minimal"):
            await time_to_ready(config, name, log_dir / f"{name}.log", bytecode)
        for run_index in range(bench.options.runs):
            bench.step(f"startup run {run_index + 1}")
            for name in (*PROCESSES, "minimal"):
                runs[name].append(
                    await time_to_ready(config, name, log_dir / f"{name}.log", bytecode)
                )
            runs["python"].append(await asyncio.to_thread(interpreter_start))


async def run(bench: Bench) -> Section:
    section = Section(
        scenario="startup",
        title=TITLE,
        method=(
            "Per run, each process started once on a migrated scratch database (the broker "
            "up), one after the other; the clock runs from just before the spawn to the "
            "first 200 of its /readyz (the minimal app: its first 202), polled every "
            f"{POLL * 1000:.0f} ms, after one untimed start of each that compiled their "
            "bytecode (kept, as an installed wheel keeps it). Baselines in the same run: "
            "`python -c pass` and the minimal FastAPI + psycopg app (services.bench.minimal_app)."
        ),
    )
    log_dir = bench.log_dir / "startup"
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[float]] = {name: [] for name in (*PROCESSES, "minimal", "python")}
    # Outside the log folder: the report's folder is committed, the bytecode (20 MB) is not.
    with tempfile.TemporaryDirectory(prefix="jobcore-startup-bytecode-") as cache:
        await _time_starts(bench, log_dir, runs, Path(cache))
    for name in PROCESSES:
        section.figures.append(
            Figure(
                case=f"{name} start to ready",
                metric="s",
                runs=runs[name],
                baseline="minimal FastAPI app",
                baseline_runs=runs["minimal"],
                better="lower",
            )
        )
    section.details["interpreter_start_s"] = runs["python"]
    return section
