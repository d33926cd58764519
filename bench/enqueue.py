"""Enqueue throughput and latency of `jobcore api`, next to two baselines in the same run.

1. Raw transactions: ``jobcore.enqueue.enqueue`` (job + outbox row + NOTIFY, one
   statement) committed in a unit of work, ``--clients`` concurrent tasks on a pool of
   ``--pool-size`` connections, straight from this process: the database's share.
2. No-op POST: the same `jobcore api` process (uvicorn, FastAPI, body reading, an
   orjson answer) on a hidden route that neither authenticates nor touches the database
   (served because JOBCORE_BENCH_NOOP=1): the framework's share.
3. Enqueue: ``POST /jobs/noop`` with an API key, ``--clients`` keep-alive connections.

Requests are sent by a minimal asyncio HTTP/1.1 client (cheaper per request than httpx,
so the load generator takes less of the machine). It still runs on the same cores as the
server and PostgreSQL: the figures are a lower bound of what the server alone could do.
CPU seconds per process are read from /proc around each phase. Everything runs against a
fresh database, dropped afterwards.

    .venv/bin/python -m bench.enqueue --clients 64 --requests 5000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql

from jobcore import apikeys, migrate
from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.enqueue import enqueue
from jobcore.jobtypes import NoopPayload
from jobcore.registry import load_job_modules
from jobcore.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
HOST = "127.0.0.1"


# -- CPU accounting ----------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _pids_named(name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class CpuMeter:
    """CPU used by this process, the API and PostgreSQL between start() and stop(), as
    a percentage of one core. PostgreSQL's backends come and go (a pool opening is one),
    so its processes are looked up again at the end; a backend that ended in between is
    missed, which undercounts PostgreSQL a little."""

    def __init__(self, api_pid: int | None = None) -> None:
        self.fixed: dict[str, int] = {"loadgen": os.getpid()}
        if api_pid is not None:
            self.fixed["api"] = api_pid

    def _postgres(self) -> dict[int, float]:
        return {pid: _cpu_seconds(pid) for pid in _pids_named("postgres")}

    def start(self) -> None:
        self._start = {name: _cpu_seconds(pid) for name, pid in self.fixed.items()}
        self._start_pg = self._postgres()
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._t0
        used = {name: _cpu_seconds(pid) - self._start[name] for name, pid in self.fixed.items()}
        used["postgres"] = sum(
            cpu - self._start_pg.get(pid, 0.0) for pid, cpu in self._postgres().items()
        )
        return {f"{k}_cpu_pct": round(100 * v / wall, 1) for k, v in used.items()}


# -- a fresh database ----------------------------------------------------------------------


@contextmanager
def bench_settings(base: Settings, pool_size: int) -> Iterator[Settings]:
    suffix = uuid.uuid4().hex[:10]
    url = base.database_url.rsplit("/", 1)[0] + f"/jobcore_bench_enqueue_{suffix}"
    settings = base.model_copy(
        update={
            "database_url": url,
            "amqp_prefix": f"bench.{suffix}",
            "db_pool_min": pool_size,
            "db_pool_max": pool_size,
        }
    )
    migrate.create_database(settings)
    try:
        migrate.upgrade(settings)
        yield settings
    finally:
        with psycopg.connect(settings.maintenance_database_url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(settings.database_name)
                )
            )


# -- measuring -------------------------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def with_cpu_per_op(result: dict[str, Any], cpu: dict[str, float]) -> dict[str, Any]:
    """The phase's figures plus each process's CPU percentage and microseconds per op."""
    rate = next(v for k, v in result.items() if k.endswith("_per_s"))
    per_op = {
        k.replace("_cpu_pct", "_cpu_us_per_op"): round(pct / 100 / rate * 1e6)
        for k, pct in cpu.items()
    }
    return {**result, **cpu, **per_op}


def summary(name: str, latencies: list[float], seconds: float, errors: int) -> dict[str, Any]:
    return {
        f"{name}_per_s": round(len(latencies) / seconds),
        "count": len(latencies),
        "errors": errors,
        "seconds": round(seconds, 3),
        "p50_ms": round(1000 * statistics.median(latencies), 2),
        "p99_ms": round(1000 * percentile(latencies, 99), 2),
    }


async def run_clients(
    clients: int, total: int, one: Callable[[Any], Awaitable[bool]], make_state: Any
) -> tuple[list[float], float, int]:
    """``total`` calls of ``one`` spread over ``clients`` concurrent tasks."""
    latencies: list[float] = []
    errors = 0

    async def client(count: int) -> None:
        nonlocal errors
        state = await make_state()
        try:
            for _ in range(count):
                t0 = time.perf_counter()
                ok = await one(state)
                latencies.append(time.perf_counter() - t0)
                errors += not ok
        finally:
            closer = getattr(state, "close", None)
            if closer is not None:
                closer()

    shares = [total // clients + (i < total % clients) for i in range(clients)]
    started = time.perf_counter()
    await asyncio.gather(*(client(n) for n in shares if n))
    return latencies, time.perf_counter() - started, errors


async def raw_transactions(
    settings: Settings, clients: int, total: int
) -> tuple[list[float], float, int]:
    noop = load_job_modules(settings.job_modules).get("noop")
    topology = Topology(settings.amqp_prefix, settings.amqp_delivery_limit)
    db = Database(settings, name="bench-raw")
    await db.open(wait=True)

    async def one(_: Any) -> bool:
        async with db.unit_of_work() as uow:
            await enqueue(uow, topology, tenant="bench", job_type=noop, payload=NoopPayload())
            await uow.commit()
        return True

    async def no_state() -> None:
        return None

    try:
        return await run_clients(clients, total, one, no_state)
    finally:
        await db.close()


class Connection:
    """One keep-alive HTTP/1.1 connection sending the same request again and again."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()

    async def send(self, request: bytes, expect: int) -> bool:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if length:
            await self.reader.readexactly(length)
        return status == expect


def http_request(port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {HOST}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def http_load(
    port: int, request: bytes, clients: int, total: int
) -> tuple[list[float], float, int]:
    async def connect() -> Connection:
        return Connection(*await asyncio.open_connection(HOST, port))

    async def one(conn: Connection) -> bool:
        return await conn.send(request, 202)

    return await run_clients(clients, total, one, connect)


# -- the API process -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def api_env(settings: Settings, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")}
    env.update(
        {
            "JOBCORE_DATABASE_URL": settings.database_url,
            "JOBCORE_AMQP_PREFIX": settings.amqp_prefix,
            "JOBCORE_JOB_MODULES": ",".join(settings.job_modules),
            "JOBCORE_DB_POOL_MIN": str(settings.db_pool_min),
            "JOBCORE_DB_POOL_MAX": str(settings.db_pool_max),
            "JOBCORE_API_PORT": str(port),
            "JOBCORE_BENCH_NOOP": "1",
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


@contextmanager
def api_process(settings: Settings, port: int, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`jobcore api` serving the bench's database on ``port``; stopped with SIGTERM."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "api", "--host", HOST],
            env=api_env(settings, port),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jobcore api exited with {proc.returncode}; see its log")
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            await asyncio.sleep(0.1)  # the poll interval, bounded by the deadline
            continue
        writer.write(f"GET /readyz HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        if head.startswith(b"HTTP/1.1 200"):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("jobcore api did not become ready")


async def count_rows(settings: Settings) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM jobs WHERE tenant = 'bench-api'),"
            " (SELECT count(*) FROM outbox o JOIN jobs j ON j.id = o.job_id"
            "  WHERE j.tenant = 'bench-api')"
        )
        row = await cur.fetchone()
    assert row is not None
    return {"jobs": int(row[0]), "outbox": int(row[1])}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    base = load_settings()
    with bench_settings(base, args.pool_size) as settings:
        results: dict[str, Any] = {
            "clients": args.clients,
            "requests": args.requests,
            "pool_size": args.pool_size,
            "cores": os.cpu_count(),
            "note": "load generator, API and PostgreSQL share the same cores",
        }

        meter = CpuMeter()
        meter.start()
        latencies, seconds, errors = await raw_transactions(settings, args.clients, args.requests)
        results["raw_enqueue_txn"] = with_cpu_per_op(
            summary("txn", latencies, seconds, errors), meter.stop()
        )

        db = Database(settings, min_size=0, max_size=1, name="bench-keys")
        await db.open(wait=True)
        try:
            created = await apikeys.create_key(db, "bench-api", "bench")
        finally:
            await db.close()

        port = free_port()
        body = b"{}"
        noop_request = http_request(port, "/bench/noop", body, {"Content-Type": "application/json"})
        enqueue_request = http_request(
            port,
            "/jobs/noop",
            body,
            {"Content-Type": "application/json", "Authorization": f"Bearer {created.key}"},
        )
        with api_process(settings, port, Path(args.log)) as proc:
            await wait_healthy(port, proc)
            warmup = min(args.requests, max(args.clients * 4, args.requests // 10))
            await http_load(port, noop_request, args.clients, warmup)
            await http_load(port, enqueue_request, args.clients, warmup)
            for name, request in (("noop_post", noop_request), ("enqueue", enqueue_request)):
                meter = CpuMeter(proc.pid)
                meter.start()
                latencies, seconds, errors = await http_load(
                    port, request, args.clients, args.requests
                )
                results[name] = with_cpu_per_op(
                    summary("req", latencies, seconds, errors), meter.stop()
                )
        results["api_exit_code"] = proc.returncode
        results["rows_written"] = await count_rows(settings)
        enqueue_rate = results["enqueue"]["req_per_s"]
        results["ratio_enqueue_vs_raw_txn"] = round(
            enqueue_rate / results["raw_enqueue_txn"]["txn_per_s"], 3
        )
        results["ratio_enqueue_vs_noop_post"] = round(
            enqueue_rate / results["noop_post"]["req_per_s"], 3
        )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.enqueue", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients (64)")
    parser.add_argument("--requests", type=int, default=5000, help="requests per phase (5000)")
    parser.add_argument(
        "--pool-size", type=int, default=8, help="database connections, API and raw (8)"
    )
    parser.add_argument("--log", default="/tmp/jobcore-bench-enqueue.log", help="API log file")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.requests < 1 or args.pool_size < 1:
        parser.error("--clients, --requests and --pool-size must be positive")
    results = asyncio.run(run(args))
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    enq, raw, noop = results["enqueue"], results["raw_enqueue_txn"], results["noop_post"]
    print(
        f"enqueue {enq['req_per_s']} req/s (p50 {enq['p50_ms']} ms, p99 {enq['p99_ms']} ms) "
        f"at {args.clients} clients = {results['ratio_enqueue_vs_raw_txn']:.2f}x raw "
        f"job+outbox txn ({raw['txn_per_s']} txn/s), "
        f"{results['ratio_enqueue_vs_noop_post']:.2f}x no-op POST ({noop['req_per_s']} req/s)"
    )


if __name__ == "__main__":
    main()
