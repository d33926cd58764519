"""Measure the lock footprint of an enqueue in a long application transaction, for each
admission (jobcore.kernel.quotas.Admission), with the deployment's default quotas.

Per round, on a scratch database: two application transactions of one tenant each write
a row of their own and enqueue (``jobcore.enqueue_in``), then stay open ``--hold``
seconds; meanwhile a third enqueue of the tenant, from a connection of its own, is timed
from its call to its commit. Before the third, what the first holds: the relations it
writes (``RowExclusiveLock`` in ``pg_locks``), and whether the tenant's ``tenant_usage``
row, the job, outbox row and usage deltas it wrote are locked (a ``FOR UPDATE NOWAIT``
probe from another connection on each; ``pg_locks`` does not list row locks). The tenant
has enqueued before (its usage row exists). Prints one JSON line per admission, and first
a baseline (the same third enqueue with no transaction of its tenant open): the third
enqueue's latency (median, p95, max over the rounds) and the locks.

    .venv/bin/python scripts/measure_lock_footprint.py [--rounds 10] [--hold 2]

127.0.0.1 only; the scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import psycopg

import jobcore.testing.jobtypes  # noqa: F401 (registers "echo")
from jobcore import enqueue_in
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.scratch import database_url, scratch

BASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
APP_TABLE = "CREATE TABLE IF NOT EXISTS app_orders (id uuid PRIMARY KEY, tenant text)"
# A third enqueue that waits longer than this for a lock gives up (it is then timed as
# having waited this long, and counted).
THIRD_LOCK_TIMEOUT = "30s"


async def holder(url: str, tenant: str, admission: str, settings: Settings) -> Any:
    conn = await psycopg.AsyncConnection.connect(url)
    await conn.execute("INSERT INTO app_orders VALUES (%s, %s)", (uuid.uuid4(), tenant))
    result = await enqueue_in(
        conn,
        default_registry,
        "echo",
        {"text": "held"},
        tenant=tenant,
        settings=settings,
        admission=admission,
    )
    return conn, result.job_id


async def third(url: str, tenant: str, admission: str, settings: Settings) -> float:
    """Seconds from the third enqueue's call to its commit (its connection made before)."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute(f"SET lock_timeout = '{THIRD_LOCK_TIMEOUT}'")
        await conn.commit()
        started = time.perf_counter()
        await enqueue_in(
            conn,
            default_registry,
            "echo",
            {"text": "third"},
            tenant=tenant,
            settings=settings,
            admission=admission,
        )
        await conn.commit()
    return time.perf_counter() - started


async def footprint(url: str, pid: int, tenant: str, job_id: uuid.UUID) -> dict[str, Any]:
    """What the open transaction of ``pid`` holds, seen from another connection."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT locktype, coalesce(relation::regclass::text, '') AS relation, mode"
            " FROM pg_locks WHERE pid = %s AND granted AND locktype = 'relation'"
            " ORDER BY 2, 3",
            (pid,),
        )
        locks = [r for r in await cur.fetchall() if not r[1].startswith("pg_")]
        # RowExclusiveLock: the tables it writes; the rest are AccessShareLock (reads),
        # which conflict with DDL only.
        relations = sorted({r[1] for r in locks if r[2] == "RowExclusiveLock"})
        reads = len({r[1] for r in locks if r[2] == "AccessShareLock"})
        rows: dict[str, str] = {}
        probes = {
            "tenant_usage row": ("SELECT 1 FROM jobcore.tenant_usage WHERE tenant = %s", tenant),
            "job row": ("SELECT 1 FROM jobcore.jobs WHERE id = %s", job_id),
            "outbox row": ("SELECT 1 FROM jobcore.outbox WHERE job_id = %s", job_id),
            "usage deltas": ("SELECT 1 FROM jobcore.tenant_usage_deltas WHERE tenant = %s", tenant),
        }
        for name, (query, key) in probes.items():
            try:
                async with conn.transaction():
                    cur = await conn.execute(query + " FOR UPDATE NOWAIT", (key,))
                    found = await cur.fetchall()
                rows[name] = "visible, not locked" if found else "not visible to others"
            except psycopg.errors.LockNotAvailable:
                rows[name] = "locked"
    return {"written_relations": relations, "read_relations": reads, "rows": rows}


async def round_of(url: str, admission: str, settings: Settings, hold: float) -> dict[str, Any]:
    tenant = f"lockfp-{uuid.uuid4().hex[:8]}"
    # A tenant that has enqueued before: its usage row exists, committed.
    earlier, _ = await holder(url, tenant, "exact", settings)
    await earlier.commit()
    await earlier.close()
    first, first_job = await holder(url, tenant, admission, settings)
    try:
        seen = await footprint(url, first.info.backend_pid, tenant, first_job)
        second_enqueued = asyncio.Event()

        async def second_holds() -> None:
            # Under an exact admission, its enqueue itself waits for the first's commit.
            second, _ = await holder(url, tenant, admission, settings)
            try:
                second_enqueued.set()
                await asyncio.sleep(hold)  # the scenario: open this long after its enqueue
                await second.commit()
            finally:
                await second.close()

        async def first_holds() -> None:
            await asyncio.sleep(hold)  # the scenario: open this long after its enqueue
            await first.commit()

        tasks = [asyncio.create_task(second_holds()), asyncio.create_task(first_holds())]
        # The second's enqueue goes first when it can (it cannot under an exact admission).
        await asyncio.wait([asyncio.create_task(second_enqueued.wait())], timeout=hold / 4)
        latency = await third(url, tenant, admission, settings)
        await asyncio.gather(*tasks)
    finally:
        await first.close()
    return {"third_seconds": latency, **seen}


async def alone(url: str, settings: Settings) -> float:
    """The baseline: the same third enqueue with no transaction of its tenant open."""
    tenant = f"lockfp-{uuid.uuid4().hex[:8]}"
    earlier, _ = await holder(url, tenant, "exact", settings)
    await earlier.commit()
    await earlier.close()
    return await third(url, tenant, "approximate", settings)


def milliseconds(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return {
        "median": round(1000 * statistics.median(ordered), 1),
        "p95": round(1000 * p95, 1),
        "max": round(1000 * ordered[-1], 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--hold", type=float, default=2.0)
    args = parser.parse_args()
    if not 1 <= args.rounds <= 100 or not 0.1 <= args.hold <= 30:
        raise SystemExit("--rounds 1..100, --hold 0.1..30")
    name = f"jobcore_lockfp_{uuid.uuid4().hex[:8]}"
    config = Settings(environment="test", database_url=database_url(BASE_URL, name))
    async with scratch(config):
        async with await psycopg.AsyncConnection.connect(config.database_url) as conn:
            await conn.execute(APP_TABLE)
            await conn.commit()
        baseline = [await alone(config.database_url, config) for _ in range(args.rounds)]
        print(json.dumps({"admission": "none open (baseline)", "third_ms": milliseconds(baseline)}))
        for admission in ("approximate", "exact"):
            rounds = [
                await round_of(config.database_url, admission, config, args.hold)
                for _ in range(args.rounds)
            ]
            print(
                json.dumps(
                    {
                        "admission": admission,
                        "quotas": {
                            "rate": config.quota_enqueue_rate,
                            "burst": config.quota_enqueue_burst,
                            "max_unfinished": config.quota_max_unfinished,
                        },
                        "hold_seconds": args.hold,
                        "rounds": args.rounds,
                        "third_ms": milliseconds([r["third_seconds"] for r in rounds]),
                        "held_by_first": {
                            "written_relations": rounds[-1]["written_relations"],
                            "read_relations": rounds[-1]["read_relations"],
                            "rows": rounds[-1]["rows"],
                        },
                    }
                )
            )


if __name__ == "__main__":
    asyncio.run(main())
