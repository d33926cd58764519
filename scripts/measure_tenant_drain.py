"""Measure a multi-tenant drain: deadlocks and throughput of the paths that end jobs.

Fills a scratch database (and a broker prefix of its own) with ``--jobs`` pending noop
jobs of ``--tenants`` tenants, enqueued round-robin so that every batch a worker commits
ends jobs of several tenants, then starts ``--workers`` workers and ``--relays`` relays
(separate processes, 127.0.0.1 only) and times the drain until every job is terminal.
Prints, per round, the drain rate (whole drain, and between 10 % and 90 % of the jobs
done, which leaves out the processes' start), ``pg_stat_database.deadlocks`` of the
scratch database before and after, the log lines of the services that mention a
deadlock or a retried outcome, and whether every job succeeded and every tenant's count
of unfinished jobs came back to 0 (when the checkout has ``tenant_usage``).

It runs the code it is imported from, so the same file measures another checkout:

    .venv/bin/python scripts/measure_tenant_drain.py [--rounds 3]
    PYTHONPATH=/tmp/base:/tmp/base/libs .venv/bin/python scripts/measure_tenant_drain.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import FAST_ENV, Process, free_port
from jobcore.testing.processes import ROOT, settings_env
from jobcore.testing.scratch import database_url, scratch
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue

BASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
FILL_CHUNK = 200
DRAIN_LIMIT = 600.0  # seconds: a drain that takes longer is reported as failed
WORDS = ("deadlock", "retrying", "could not record")


async def fill(config: Settings, tenants: int, jobs: int) -> None:
    topology = Topology(config.amqp_prefix, config.amqp_delivery_limit)
    noop = load_job_modules(config.job_modules).get("noop")
    async with Database(config, min_size=1, max_size=1) as db:
        for start in range(0, jobs, FILL_CHUNK):
            async with db.unit_of_work() as uow:
                for n in range(start, min(jobs, start + FILL_CHUNK)):
                    await enqueue(
                        uow,
                        topology,
                        EnqueueRequest(
                            tenant=f"t{n % tenants}", job_type=noop, payload=NoopPayload()
                        ),
                    )
                await uow.commit()


def scalar(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def deadlocks(name: str) -> int:
    with psycopg.connect(BASE_URL, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(scalar(conn, "SELECT deadlocks FROM pg_stat_database WHERE datname = %s", name))


async def settled_deadlocks(name: str) -> int:
    """The counter once the exited backends' statistics reached it (it stops moving)."""
    seen: list[int] = []

    async def stable() -> tuple[int] | None:  # a tuple: 0 deadlocks is an answer too
        seen.append(deadlocks(name))
        return (seen[-1],) if len(seen) >= 4 and len(set(seen[-4:])) == 1 else None

    settled = await eventually(stable, timeout=30, interval=0.5, what="deadlocks to settle")
    assert settled is not None
    return settled[0]


async def one_round(args: argparse.Namespace, number: int) -> dict[str, Any]:
    name = f"jobcore_measure_drain_{os.getpid()}_{number}"
    config = Settings(
        database_url=database_url(BASE_URL, name),
        amqp_url=AMQP_URL,
        amqp_prefix=f"measuredrain{os.getpid()}n{number}",
        job_modules=("jobcore.examples.jobtypes",),
    )
    async with scratch(config):
        await fill(config, args.tenants, args.jobs)
        before = await settled_deadlocks(name)
        log_dir = Path(tempfile.mkdtemp(prefix="tenant-drain-"))
        env = settings_env(config, **FAST_ENV, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'libs'}")
        workers = [Process(f"worker-{i}", ("worker",), env, log_dir) for i in range(args.workers)]
        relays = [Process(f"relay-{i}", ("relay",), env, log_dir) for i in range(args.relays)]
        points: list[tuple[float, int]] = []
        try:
            for worker in workers:
                worker.start(JOBCORE_WORKER_HEALTH_PORT=str(free_port()))
            for worker in workers:
                await eventually(
                    lambda w=worker: _consuming(w), timeout=120, interval=0.1, what="consuming"
                )
            started = time.monotonic()
            for relay in relays:
                relay.start()
            with psycopg.connect(config.database_url, autocommit=True) as conn:
                while True:
                    done = int(
                        scalar(
                            conn,
                            "SELECT count(*) FROM jobcore.jobs "
                            "WHERE status IN ('succeeded', 'failed', 'cancelled')",
                        )
                    )
                    points.append((time.monotonic() - started, done))
                    if done >= args.jobs or points[-1][0] > DRAIN_LIMIT:
                        break
                    await asyncio.sleep(0.1)  # the sampling period of the drain curve
                statuses = dict(
                    conn.execute("SELECT status, count(*) FROM jobcore.jobs GROUP BY 1")
                )
                unfinished = _unfinished(conn)
        finally:
            for process in (*relays, *workers):
                await process.stop(10.0)
        after = await settled_deadlocks(name)
        lines = {
            process.name: [
                line[:300]
                for line in process.all_logs().splitlines()
                if any(word in line.lower() for word in WORDS)
            ]
            for process in (*relays, *workers)
        }
    return {
        "round": number,
        "jobs": args.jobs,
        "tenants": args.tenants,
        "seconds": round(points[-1][0], 2),
        "jobs_per_s": round(points[-1][1] / points[-1][0], 1),
        "jobs_per_s_10_90": round(_middle_rate(points, args.jobs), 1),
        "deadlocks": after - before,
        "log_lines": {k: v for k, v in lines.items() if v},
        "statuses": statuses,
        "unfinished": unfinished,
        "logs": str(log_dir),
    }


def _unfinished(conn: psycopg.Connection[Any]) -> dict[str, int] | None:
    """Each tenant's count of unfinished jobs, as the checkout keeps it (None: it does not)."""
    if not scalar(conn, "SELECT to_regclass('jobcore.tenant_usage') IS NOT NULL"):
        return None
    deltas = (
        "(SELECT coalesce(sum(delta), 0) FROM jobcore.tenant_usage_deltas d"
        " WHERE d.tenant = u.tenant)"
    )
    if not scalar(conn, "SELECT to_regclass('jobcore.tenant_usage_deltas') IS NOT NULL"):
        deltas = "0"
    query = f"SELECT tenant, unfinished + {deltas} FROM jobcore.tenant_usage AS u ORDER BY 1"
    return {tenant: int(n) for tenant, n in conn.execute(query)}


async def _consuming(worker: Process) -> bool:
    if not worker.alive:
        raise RuntimeError(f"{worker.name} exited:\n{worker.all_logs()[-3000:]}")
    return bool(worker.logged("worker consuming"))


def _at(points: list[tuple[float, int]], target: float) -> float:
    for t, done in points:
        if done >= target:
            return t
    return points[-1][0]


def _middle_rate(points: list[tuple[float, int]], total: int) -> float:
    low, high = _at(points, 0.1 * total), _at(points, 0.9 * total)
    return 0.8 * total / max(1e-9, high - low)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--relays", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps({"checkout": str(ROOT)}))
    for number in range(1, args.rounds + 1):
        print(json.dumps(await one_round(args, number)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
