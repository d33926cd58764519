"""How long the compactor locks a realistically bloated ``jobs`` table, and how long an
enqueue waits meanwhile: ``.venv/bin/python scripts/compaction_hold.py``.

On a scratch database cloned from the migrated template (the server of
``JOBCORE_DATABASE_URL``): ``--live`` jobs are added and analyzed (the working set of a
steady rate with a short retention: 25,000 is 200 jobs/s kept about two minutes). Then,
for each run, a connection pins the xmin horizon (an XID, idle in transaction) while new
jobs are added and the oldest deleted, 5,000 at a time (the live set stays the same size,
spread over the file), until the table and its indexes reach ``--target-mib``;
the pin ends, the table is vacuumed as autovacuum would, and the compactor's own
compaction (:meth:`jobcore.maintenance.compactor.Compactor.compact`) runs while another
connection inserts one job after another and times each insert. Prints, per run, the
table's bytes before and after, the estimate of what its live rows need, the lock's wait
and hold, and the slowest insert; then the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobcore.database.store import database_store
from jobcore.kernel.settings import load_settings
from jobcore.maintenance.compactor import Candidate, Compactor, CompactorConfig, need_bytes
from jobcore.testing import scratch

MIB = 1024 * 1024
ADD_JOBS = """
    INSERT INTO jobs (id, tenant, type, queue, payload)
    SELECT gen_random_uuid(), %(tenant)s, 'noop', 'default',
           jsonb_build_object('text', repeat('x', %(width)s), 'n', n)
    FROM generate_series(1, %(n)s) AS n
"""
SIZE = "SELECT pg_total_relation_size('jobs')"


async def size(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute(SIZE)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


# The oldest live jobs go as new ones come, as retention prunes them: the live rows end
# up spread over the whole file, so VACUUM cannot simply cut an empty tail off.
PRUNE_OLDEST = """
    DELETE FROM jobs WHERE id IN (
        SELECT id FROM jobs WHERE tenant = 'live' ORDER BY created_at, id LIMIT %(n)s)
"""


async def bloat(conn: psycopg.AsyncConnection[Any], url: str, target: int, width: int) -> None:
    async with await psycopg.AsyncConnection.connect(url) as pin:
        await pin.execute("SELECT txid_current()")
        while await size(conn) < target:
            await conn.execute(ADD_JOBS, {"tenant": "live", "n": 5000, "width": width})
            await conn.execute(PRUNE_OLDEST, {"n": 5000})
        await pin.rollback()
    await conn.execute("VACUUM ANALYZE jobs")  # as autovacuum would once the pin ended


async def candidate(url: str) -> Candidate:
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row) as conn:
        rows = await database_store.compaction_tables(conn, {"tables": ["jobs"]})
    row = rows[0]
    need = need_bytes(row)
    assert need is not None, "jobs was never analyzed"
    return Candidate(
        "jobs",
        int(row["heap_bytes"]) + int(row["index_bytes"]),
        int(row["total_bytes"]),
        need,
        row["key_index"],
        row["clustered_index"],
    )


async def probe(url: str, stop: asyncio.Event, latencies: list[float]) -> None:
    """One enqueue-sized insert after another, each timed, until ``stop``."""
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, options="-c search_path=jobcore"
    ) as conn:
        while not stop.is_set():
            started = time.monotonic()
            await conn.execute(ADD_JOBS, {"tenant": "probe", "n": 1, "width": 200})
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.005)  # pacing: about 200 inserts a second


async def one_run(url: str, compactor: Compactor, args: argparse.Namespace) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, options="-c search_path=jobcore"
    ) as conn:
        await bloat(conn, url, args.target_mib * MIB, args.width)
        bloated = await size(conn)
        table = await candidate(url)
        stop = asyncio.Event()
        latencies: list[float] = []
        prober = asyncio.ensure_future(probe(url, stop, latencies))
        await asyncio.sleep(0.5)  # the prober's steady pace before the compaction
        done = await compactor.compact(table)
        await asyncio.sleep(0.5)
        stop.set()
        await prober
        await conn.execute("DELETE FROM jobs WHERE tenant = 'probe'")
    return {
        "outcome": done.outcome,
        "mib_bloated": round(bloated / MIB, 1),
        "mib_before": round(done.bytes_before / MIB, 1),
        "mib_after": round(done.bytes_after / MIB, 1),
        "mib_needed_estimate": round(table.need / MIB, 1),
        "lock_wait_ms": round(done.lock_wait * 1000, 1),
        "lock_held_ms": round(done.lock_held * 1000, 1),
        "insert_max_ms": round(max(latencies) * 1000, 1),
        "insert_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "inserts": len(latencies),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=25_000, help="live jobs kept")
    parser.add_argument("--target-mib", type=int, default=100, help="jobs bloated to (MiB)")
    parser.add_argument("--width", type=int, default=200, help="payload text length")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=10.0, help="the hold's bound")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    settings = load_settings()
    template = scratch.ensure_template(settings)
    url = scratch.clone_database(settings, template, prefix="jobcore_compact_")
    name = url.rsplit("/", 1)[1]
    compactor = Compactor(
        CompactorConfig(max_seconds=args.max_seconds),
        settings=settings.model_copy(update={"database_url": url}),
        metrics=None,
    )
    runs: list[dict[str, Any]] = []
    try:
        async with await psycopg.AsyncConnection.connect(
            url, autocommit=True, options="-c search_path=jobcore"
        ) as conn:
            await conn.execute(ADD_JOBS, {"tenant": "live", "n": args.live, "width": args.width})
            await conn.execute("VACUUM ANALYZE jobs")
            print(f"{args.live} live jobs: {await size(conn) / MIB:.1f} MiB", flush=True)
        for _ in range(args.runs):
            result = await one_run(url, compactor, args)
            runs.append(result)
            print(json.dumps(result), flush=True)
    finally:
        with psycopg.connect(settings.maintenance_database_url(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    medians = {
        key: statistics.median(r[key] for r in runs)
        for key in runs[0]
        if isinstance(runs[0][key], float)
    }
    print("median:", json.dumps(medians))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "median": medians}, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
