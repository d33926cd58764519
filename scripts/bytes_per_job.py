"""Bytes, WAL and dead tuples per job of each hot table at a steady rate, clean and with the
xmin horizon pinned: ``.venv/bin/python scripts/bytes_per_job.py --out DIR``.

A stop-gap until ``jobcore bench paced`` reports bytes per job. It reuses the pressure
scenario's pieces: a cluster of its own (scripts/pressure_cluster.sh, autovacuum on; the
name and port are its own, so a pressure run elsewhere is untouched), one API, one relay
and two workers as OS processes, and the open-loop generator POSTing ``effect`` jobs.
After a warm-up, two windows at the same rate:

- clean: nothing else;
- pinned: one connection holds an XID for the whole window, so nothing the window writes
  can be reclaimed: the tables' growth is what a job writes, whatever autovacuum does.

Per window and hot table: heap and index bytes grown, the row versions the statistics
counted (inserted, updated of which HOT, deleted: each update or delete leaves one dead
tuple), dead tuples at the end; the WAL written (``pg_current_wal_lsn`` difference), all
divided by the jobs inserted in the window; and the slowest statements
(pg_stat_statements) with their blocks per call. Prints a markdown table and writes
``bytes_per_job.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobcore.schema import HOT_TABLES
from jobcore.settings import load_settings
from jobcore.testing.pipeline import archive_pruned
from services.bench.harness import Bench, Options, relays_ready
from services.bench.pressure_load import OpenLoad, connect
from services.bench.scenarios import pressure

TABLE_STATS = """
SELECT relname AS table, pg_relation_size(relid) AS heap, pg_indexes_size(relid) AS indexes,
       n_tup_ins AS inserted, n_tup_upd AS updated, n_tup_hot_upd AS hot_updated,
       n_tup_del AS deleted, n_dead_tup AS dead
FROM pg_stat_user_tables WHERE relname = ANY(%(tables)s)
"""
STATEMENTS = """
SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 100) AS query, calls,
       total_exec_time / calls AS mean_ms,
       (shared_blks_hit + shared_blks_read)::float8 / calls AS blocks_per_call
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND calls >= 20
ORDER BY total_exec_time DESC LIMIT 12
"""
RESET = (
    "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
    " WHERE datname = current_database()), 0)"
)


async def snapshot(url: str) -> dict[str, Any]:
    async with await connect(url, autocommit=True) as conn:
        # The statistics collector's counters lag by up to its flush period.
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await asyncio.sleep(1.5)
        cur = await conn.execute(TABLE_STATS, {"tables": list(HOT_TABLES)})
        columns = [c.name for c in cur.description or []]
        tables = {row[0]: dict(zip(columns, row, strict=True)) for row in await cur.fetchall()}
        cur = await conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        row = await cur.fetchone()
        assert row is not None
        return {"at": time.time(), "wal": int(row[0]), "tables": tables}


async def statements(url: str, reset: bool) -> list[dict[str, Any]]:
    async with await connect(url, autocommit=True) as conn:
        cur = await conn.execute(STATEMENTS)
        columns = [c.name for c in cur.description or []]
        rows = [dict(zip(columns, r, strict=True)) for r in await cur.fetchall()]
        if reset:
            await conn.execute(RESET)
        return rows


def per_job(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    jobs = after["tables"]["jobs"]["inserted"] - before["tables"]["jobs"]["inserted"]
    out: dict[str, Any] = {"jobs": jobs, "seconds": round(after["at"] - before["at"], 1)}
    out["wal_bytes_per_job"] = round((after["wal"] - before["wal"]) / max(jobs, 1), 1)
    tables = {}
    for name in HOT_TABLES:
        a, b = after["tables"].get(name), before["tables"].get(name)
        if a is None or b is None:
            continue
        grown = {k: a[k] - b[k] for k in ("heap", "indexes", "inserted", "updated", "deleted")}
        hot = a["hot_updated"] - b["hot_updated"]
        tables[name] = {
            "heap_bytes_per_job": round(grown["heap"] / max(jobs, 1), 1),
            "index_bytes_per_job": round(grown["indexes"] / max(jobs, 1), 1),
            "inserts_per_job": round(grown["inserted"] / max(jobs, 1), 3),
            "updates_per_job": round(grown["updated"] / max(jobs, 1), 3),
            "hot_updates_per_job": round(hot / max(jobs, 1), 3),
            "deletes_per_job": round(grown["deleted"] / max(jobs, 1), 3),
            "dead_versions_per_job": round((grown["updated"] + grown["deleted"]) / max(jobs, 1), 3),
            "dead_at_end": a["dead"],
            "heap_bytes_at_end": a["heap"],
            "index_bytes_at_end": a["indexes"],
        }
    out["tables"] = tables
    return out


async def pinned(url: str, ready: asyncio.Event, stop: asyncio.Event) -> None:
    async with await connect(url) as conn:
        await conn.execute("SELECT txid_current()")
        ready.set()
        await stop.wait()
        await conn.rollback()


async def window(url: str, seconds: float, pin: bool) -> dict[str, Any]:
    stop, ready = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(pinned(url, ready, stop)) if pin else None
    if holder is not None:
        await ready.wait()
    await statements(url, reset=True)
    load = os.getloadavg()
    before = await snapshot(url)
    await asyncio.sleep(seconds)
    after = await snapshot(url)
    top = await statements(url, reset=False)
    stop.set()
    if holder is not None:
        await holder
    result = per_job(before, after)
    result["load_average_at_start"] = [round(x, 2) for x in load]
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["statements"] = top
    return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    options = Options(pressure_port=args.port)
    server = await asyncio.to_thread(pressure.start_cluster, args.port)
    out = Path(args.out)
    bench = Bench(options, load_settings(database_url=server), out)
    result: dict[str, Any] = {"rate": args.rate, "uptime_at_start": await _uptime()}
    async with bench.scratch("bytes", pressure.JOB_MODULES) as config:
        url = config.database_url
        async with await connect(url, autocommit=True) as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        env = pressure.STACK_ENV
        async with bench.stack(config, "bytes", relays=1, workers=2, env=env) as stack:
            await relays_ready(stack)
            await archive_pruned(stack.db)
            load = OpenLoad(stack.api_port, stack.api_key, args.rate)
            planned = args.warmup + 2 * args.seconds + 60
            loading = asyncio.create_task(load.run(time.time() + planned))
            try:
                await asyncio.sleep(args.warmup)
                result["clean"] = await window(url, args.seconds, pin=False)
                result["pinned"] = await window(url, args.seconds, pin=True)
            finally:
                load.stop()
                await loading
            result["offered"] = {k: vars(v) for k, v in load.windows.items()}
    result["uptime_at_end"] = await _uptime()
    return result


async def _uptime() -> str:
    proc = await asyncio.create_subprocess_exec("uptime", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return out.decode().strip()


def markdown(result: dict[str, Any]) -> str:
    lines = []
    for name in ("clean", "pinned"):
        w = result[name]
        lines.append(
            f"\n**{name}**: {w['jobs']} jobs in {w['seconds']} s, WAL {w['wal_bytes_per_job']}"
            f" bytes/job, load {w['load_average_at_start']} → {w['load_average_at_end']}\n"
        )
        lines.append("| table | heap B/job | index B/job | ins | upd (HOT) | del | dead/job |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for table, t in w["tables"].items():
            lines.append(
                f"| {table} | {t['heap_bytes_per_job']} | {t['index_bytes_per_job']} "
                f"| {t['inserts_per_job']} | {t['updates_per_job']} ({t['hot_updates_per_job']})"
                f" | {t['deletes_per_job']} | {t['dead_versions_per_job']} |"
            )
        lines.append("\n| statement | calls | mean ms | blocks/call |\n|---|---:|---:|---:|")
        for s in w["statements"]:
            lines.append(
                f"| {s['query']} | {s['calls']} | {s['mean_ms']:.3f} | {s['blocks_per_call']:.0f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--port", type=int, default=5467)
    args = parser.parse_args()
    os.environ.setdefault("PRESSURE_CLUSTER", "bytes_per_job")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    measured = asyncio.run(main(args))
    (out / "bytes_per_job.json").write_text(json.dumps(measured, indent=2, default=str))
    print(markdown(measured))
