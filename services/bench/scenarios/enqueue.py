"""enqueue: HTTP enqueue requests/s from ``wrk`` against a minimal FastAPI + psycopg app.

The baseline (:mod:`services.bench.minimal_app`) is one uvicorn process (uvloop,
httptools) with a pool of 8 that inserts a job row and an outbox row in one transaction,
into trigger-free copies of jobcore's tables (same columns and indexes): no key, no
idempotency, no quotas, no NOTIFY. It once wrote jobcore's own tables, whose
quota trigger made it queue on one ``tenant_usage`` row at 64 clients, and the ratio read
1.00× where a hand-run wrk read 0.5×. jobcore answers the same ``POST /jobs/noop`` with
every feature on: an API key, a fresh ``Idempotency-Key`` per request, the tenant's quotas
(:data:`QUOTAS`: checked on every request, limits far above the rate), the accepted event,
NOTIFY and the tracing hooks. Both run on the same scratch
database, one after the other: jobcore, baseline, jobcore, baseline (ABAB), so a change in
the machine's load between runs falls on both.

At the largest client count (16 or more) jobcore also runs with two API processes (``jobcore api
--workers 2``) against the same one-process baseline: the scaling figure.

``wrk`` is the load generator (:mod:`services.bench.wrk`). Its CPU is reported next to
the servers' (from rusage and /proc), which shows it is not what limits the figure.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import free_port
from jobcore.testing.processes import ROOT, settings_env
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from jobcore.usecases.enqueue.wakeups import RelayWakeups
from services.bench.harness import Bench, Options, analyze, pids
from services.bench.http import run_clients
from services.bench.measure import CpuMeter
from services.bench.pgstats import Statements
from services.bench.report import Figure, Section
from services.bench.wrk import WrkResult, post_load

TITLE = "HTTP enqueue (wrk) vs a minimal FastAPI + psycopg app"
BASELINE = "minimal FastAPI+psycopg app, 1 process, no triggers"
# What every case's label says about jobcore's tenant quotas: the bench stacks check them
# on every request (jobcore.testing.pipeline.LOAD_QUOTAS) with limits no run reaches.
QUOTAS = "quotas on"
PATH = "/jobs/noop"
WARMUP_SECONDS = 2
TWO_PROCESS_CLIENTS = 16
READY_TIMEOUT = 60.0


async def raw_transactions(
    db: Database, topology: Topology, clients: int, total: int
) -> tuple[list[float], float, int]:
    """``total`` job + outbox insert transactions from this process (the scale scenario's
    enqueue): no HTTP, no authentication.

    Each goes as the API sends it: one statement on a session, committing on its own. In a
    unit of work the tenant's usage row stayed locked from the statement until this
    process, on a busy machine, got round to sending COMMIT; every other connection of the
    tenant waited behind that round trip (on 2 cores: 211 enqueues/s beside one relay and
    one worker, 149/s beside four of each: the scenario measured this convoy, not them)."""
    noop = load_job_modules(("jobcore.examples.jobtypes",)).get("noop")

    wakeups = RelayWakeups(db)

    async def one(_: None) -> bool:
        async with db.session() as session:
            await enqueue(
                session,
                topology,
                EnqueueRequest(tenant="raw", job_type=noop, payload=NoopPayload()),
                wakeups=wakeups,
            )
        return True

    async def no_state() -> None:
        return None

    try:
        return await run_clients(clients, total, no_state, one)
    finally:
        await wakeups.close()


def api_processes(options: Options, clients: int) -> tuple[int, ...]:
    """API processes measured at ``clients``: two as well at the largest client count, if
    it is enough to keep two busy (not in the smoke test's few-client runs)."""
    return (1, 2) if clients == max(options.clients) and clients >= TWO_PROCESS_CLIENTS else (1,)


def steps(options: Options) -> int:
    return sum(len(api_processes(options, c)) for c in options.clients) * options.runs


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's supervisor and its server processes)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo += _children(current)
    return pids


def _start_minimal(config: Settings, log_path: Path) -> tuple[int, subprocess.Popen[bytes]]:
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        *(sys.executable, "-m", "uvicorn", "--factory"),
        "services.bench.minimal_app:app_from_environment",
        *("--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop"),
        *("--http", "httptools", "--no-access-log", "--log-level", "warning"),
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env=settings_env(config), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
    return port, proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.asynccontextmanager
async def minimal_app(config: Settings, log_dir: Path) -> AsyncIterator[tuple[int, int]]:
    """The baseline app as a process on a free port: (port, pid)."""
    log_path = log_dir / "minimal-app.log"
    port, proc = _start_minimal(config, log_path)
    try:

        async def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the minimal app exited; see {log_path}")
            try:
                async with httpx.AsyncClient(timeout=2) as client:
                    answer = await client.post(f"http://127.0.0.1:{port}{PATH}", json={})
                    return answer.status_code == 202
            except httpx.HTTPError:
                return False

        await eventually(ready, timeout=READY_TIMEOUT, interval=0.1, what="the minimal app")
        yield port, proc.pid
    finally:
        _stop(proc)


async def settle(port: int, auth: str | None) -> None:
    """Until the requests wrk left in flight when it stopped are served: one more request,
    queued behind them (for the pool, first come first served), and its answer. Else they
    would run during the next measurement, of the other app."""
    headers = {"Authorization": auth} if auth else {}
    async with httpx.AsyncClient(timeout=READY_TIMEOUT) as client:
        answer = await client.post(f"http://127.0.0.1:{port}{PATH}", json={}, headers=headers)
    if answer.status_code != 202:
        raise RuntimeError(f"{PATH} answered {answer.status_code}: {answer.text[:300]}")


async def measure(
    port: int, server_pid: int, clients: int, seconds: float, auth: str | None
) -> tuple[WrkResult, dict[str, float]]:
    """One wrk run; the CPU of wrk, of the server's processes and of PostgreSQL."""
    server = tree(server_pid)
    meter = CpuMeter()
    meter.groups = {"postgres": meter.groups["postgres"], "server": lambda: server}
    meter.start()
    result = await post_load(
        port, PATH, connections=clients, seconds=seconds, prefix=uuid.uuid4().hex[:12], auth=auth
    )
    used = meter.stop()
    await settle(port, auth)
    if result.status_errors or result.socket_errors or not result.requests:
        raise RuntimeError(
            f"{result.command}: {result.status_errors} bad answers, {result.socket_errors} "
            f"socket errors in {result.requests} requests"
        )
    used["wrk"] = result.cpu_pct
    return result, used


async def run(bench: Bench) -> Section:
    options = bench.options
    seconds = options.duration
    section = Section(
        "enqueue",
        TITLE,
        f"`POST {PATH}` from `wrk -t1 -c<clients> -d{seconds:g}s` (a fresh Idempotency-Key "
        "per request, made in its Lua) against jobcore's API (API key, idempotency, tenant "
        "quotas on (checked on every request, limits far above the rate), events, NOTIFY, "
        f"tracing hooks all on) and against the {BASELINE} (uvloop, httptools, a pool of 8, "
        "one transaction inserting a job row and an outbox row into trigger-free copies of "
        f"jobcore's tables: same columns and indexes); {options.runs} runs each, interleaved "
        "ABAB on the same database. CPU: `server` is the measured app's processes, `wrk` "
        "the load generator. By hand: scripts/enqueue_probe.sh.",
    )
    # Shorter for short runs (the smoke test's): a warm-up only has to open everything.
    warmup = max(1.0, min(WARMUP_SECONDS, seconds / 2))
    load: list[tuple[float, ...]] = [os.getloadavg()]
    pairs: dict[str, list[float]] = defaultdict(list)
    tables: list[dict[str, Any]] = []
    commands: set[str] = set()
    async with (
        bench.scratch("enqueue") as config,
        minimal_app(config, bench.log_dir / "enqueue") as (base_port, base_pid),
    ):
        for processes in sorted({n for c in options.clients for n in api_processes(options, c)}):
            args = ("--workers", str(processes)) if processes > 1 else ()
            async with bench.stack(
                config, f"enqueue-{processes}p", relays=0, workers=0, api_args=args
            ) as stack:
                assert stack.api is not None
                auth = f"Bearer {stack.api_key}"
                api_pid = stack.api.pid
                # Warm-up: connections, pools, every server process's first requests.
                await post_load(
                    stack.api_port, PATH, connections=64, seconds=warmup,
                    prefix="warmup-" + uuid.uuid4().hex[:8], auth=auth,
                )  # fmt: skip
                await post_load(base_port, PATH, connections=64, seconds=warmup, prefix="warmup")
                await analyze(config)
                for clients in options.clients:
                    if processes not in api_processes(options, clients):
                        continue
                    case = (
                        f"{clients} clients, {processes} API process{'es' * (processes > 1)}, "
                        f"{QUOTAS}"
                    )
                    rates: dict[str, list[float]] = defaultdict(list)
                    lat: dict[str, list[float]] = defaultdict(list)
                    cpu: dict[str, list[dict[str, float]]] = defaultdict(list)
                    for run_number in range(options.runs):
                        bench.step(f"enqueue: {case}, run {run_number + 1}")
                        last = run_number == options.runs - 1
                        # --pg-stats: each side's statements per request, last run.
                        counted = last and bool(options.pg_stats_url)
                        ours_stats = Statements(config.database_url)
                        if counted:
                            await ours_stats.start()
                        async with bench.profiled(
                            section, f"{clients}c{processes}p", pids(stack) if last else {}
                        ):
                            ours, ours_cpu = await measure(
                                stack.api_port, api_pid, clients, seconds, auth
                            )
                        theirs_stats = Statements(config.database_url)
                        if counted:
                            await ours_stats.stop()
                            await theirs_stats.start()
                        theirs, theirs_cpu = await measure(
                            base_port, base_pid, clients, seconds, None
                        )
                        if counted:
                            await theirs_stats.stop()
                            for who, stats, result in (
                                ("jobcore", ours_stats, ours),
                                ("baseline", theirs_stats, theirs),
                            ):
                                # + 1: settle()'s request, served inside the window.
                                tables.append(
                                    stats.table(
                                        f"enqueue, {case}, {who}: statements per request",
                                        result.requests + 1,
                                        f"One wrk run of {seconds:g} s; load average "
                                        f"{os.getloadavg()[0]:.2f}.",
                                    )
                                )
                        commands.add(ours.command)
                        for name, result, used in (
                            ("jobcore", ours, ours_cpu),
                            ("baseline", theirs, theirs_cpu),
                        ):
                            rates[name].append(result.rate)
                            # CPU per request: what a loaded, shared machine distorts least.
                            lat[f"{name} cpu"].append(round(1e4 * used["server"] / result.rate, 1))
                            lat[f"{name} p50"].append(result.p50_ms)
                            lat[f"{name} p99"].append(result.p99_ms)
                            cpu[name].append(used)
                        pairs[case].append(round(ours.rate / theirs.rate, 3))
                        load.append(os.getloadavg())
                    section.add(
                        Figure(case, "requests/s", rates["jobcore"], BASELINE, rates["baseline"])
                    )
                    section.add(
                        Figure(
                            case,
                            "server CPU µs/request",
                            lat["jobcore cpu"],
                            "baseline CPU µs/request",
                            lat["baseline cpu"],
                            better="lower",
                        )
                    )
                    for q in ("p50", "p99"):
                        section.add(
                            Figure(
                                case,
                                f"{q} ms",
                                lat[f"jobcore {q}"],
                                f"baseline {q}",
                                lat[f"baseline {q}"],
                                better="lower",
                            )
                        )
                    for name, samples in cpu.items():
                        section.cpu_pct[f"{case}, {name}"] = {
                            k: round(statistics.median(s[k] for s in samples), 1)
                            for k in sorted(samples[0])
                        }
    section.details = {
        "ratio_per_abab_pair": dict(pairs),
        "load_average_1_5_15": [[round(x, 2) for x in sample] for sample in load],
        "wrk": sorted(commands),
        "quotas": QUOTAS,
        "baseline_tables": "own",
    }
    if tables:
        section.details["tables"] = tables
    return section
