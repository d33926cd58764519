"""`jobcore bench --pg-stats`: what each SQL statement costs PostgreSQL per job, and what
the backends wait on, on a server with ``pg_stat_statements`` loaded.

The extension needs ``shared_preload_libraries`` (a server restart), so it runs on the
bench's own cluster (``scripts/pg_stats_cluster.sh start``: 127.0.0.1:5451, the shared
cluster's settings otherwise), never on the machine's shared one. With ``--pg-stats`` every
scenario's scratch database is created there; the e2e scenario then resets the counters of
its database before its last run and reads them after it (:class:`Statements`), samples
``pg_stat_activity`` and ungranted ``pg_locks`` every :data:`SAMPLE_INTERVAL` from a
connection of its own meanwhile (:class:`WaitSampler`), and does the same around a
pipeline drain. The tables are per job: a loaded, shared machine changes a rate a lot and
a count (calls, rows, blocks, WAL bytes) not at all.

The bench's own statements (polling for the end of a run, the sampler's) carry the
:data:`BENCH_MARK` comment, which pg_stat_statements keeps in the text, and are left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import dict_row, tuple_row

from services.bench.measure import cpu_seconds

# In the text of every statement the bench sends while it measures.
BENCH_MARK = "/* jobcore-bench */"
SAMPLE_INTERVAL = 0.05
TOP_STATEMENTS = 15
TOP_WAITS = 12
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5451/postgres"
SETUP_HINT = "run scripts/pg_stats_cluster.sh start"

# One row per statement text: a prepared statement made again after an ANALYZE of a table
# it reads (the maintenance leader's analyzer runs during a window) can get a new queryid
# for the same text, and would otherwise be split over two rows (a job's enqueue counted
# 51 and 9 times for 60 jobs in a CI run).
STATEMENTS = """
SELECT toplevel, query, sum(calls)::bigint AS calls, sum(total_exec_time) AS total_exec_time,
       sum(rows)::bigint AS rows, sum(shared_blks_hit)::bigint AS shared_blks_hit,
       sum(shared_blks_read)::bigint AS shared_blks_read,
       sum(shared_blks_dirtied)::bigint AS shared_blks_dirtied,
       sum(shared_blks_written)::bigint AS shared_blks_written,
       sum(wal_records)::bigint AS wal_records, sum(wal_fpi)::bigint AS wal_fpi,
       sum(wal_bytes) AS wal_bytes
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY toplevel, query
"""

ACTIVITY = (
    BENCH_MARK
    + """
SELECT a.pid, a.state, a.wait_event_type, a.wait_event, a.backend_type,
       left(a.query, 300) AS query
FROM pg_stat_activity a
WHERE a.pid <> pg_backend_pid()
  AND (a.datname = current_database() OR a.datname IS NULL)
  AND (a.state IS NULL OR a.state <> 'idle')
"""
)

LOCKS = (
    BENCH_MARK
    + """
SELECT l.pid, l.locktype, l.mode,
       coalesce(c.relname, l.classid::regclass::text) AS target,
       l.objid, l.page, l.tuple,
       left(a.query, 300) AS query,
       (SELECT left(b.query, 300) FROM pg_stat_activity b
        WHERE b.pid = (pg_blocking_pids(l.pid))[1]) AS blocker,
       -- A row lock is waited for as the locker's transaction id; the first waiter holds
       -- the row's tuple lock meanwhile: its relation names the row's table.
       (SELECT string_agg(DISTINCT t.relation::regclass::text, ',') FROM pg_locks t
        WHERE t.pid = l.pid AND t.locktype = 'tuple' AND t.granted) AS row_of
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
LEFT JOIN pg_class c ON c.oid = l.relation
WHERE NOT l.granted
"""
)


def short(query: str, width: int = 110) -> str:
    """A statement on one line, cut to ``width`` (what a table cell holds)."""
    text = re.sub(r"\s+", " ", query).strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def where(url: str) -> str:
    """``host:port`` of a URL: what an error or a report shows (never a password)."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}"


async def check_server(url: str) -> str | None:
    """Why ``url`` cannot serve --pg-stats (None: it can)."""
    try:
        async with await psycopg.AsyncConnection.connect(url, connect_timeout=5) as conn:
            cur = await conn.execute("SHOW shared_preload_libraries")
            row = await cur.fetchone()
    except psycopg.Error as error:
        return f"--pg-stats: cannot reach {where(url)} ({type(error).__name__}); {SETUP_HINT}"
    if row is None or "pg_stat_statements" not in str(row[0]):
        return f"--pg-stats: the server does not preload pg_stat_statements; {SETUP_HINT}"
    return None


async def enable(database_url: str) -> None:
    """The extension in a scratch database (its view reads the shared counters)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


async def cluster_pids(conn: psycopg.AsyncConnection[Any]) -> list[int]:
    """Every process of the cluster (backends and background processes): its CPU is what
    the scenario cost PostgreSQL, the bench's cluster running nothing else."""
    cur = conn.cursor(row_factory=tuple_row)
    await cur.execute(BENCH_MARK + " SELECT pid FROM pg_stat_activity")
    return [int(row[0]) for row in await cur.fetchall()]


@dataclass
class Statements:
    """pg_stat_statements of one database over a window: reset at start, read at stop;
    and the cluster's CPU over the same window."""

    database_url: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    cpu_seconds: float = 0.0
    _cpu: dict[int, float] = field(default_factory=dict)

    async def start(self) -> None:
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True
        ) as conn:
            await conn.execute(
                BENCH_MARK + " SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                " WHERE datname = current_database()), 0)"
            )
            self._cpu = {pid: cpu_seconds(pid) for pid in await cluster_pids(conn)}

    async def stop(self, exclude: tuple[int, ...] = ()) -> None:
        """Read the counters; ``exclude``: backends whose CPU is the bench's (the
        sampler's)."""
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True, row_factory=dict_row
        ) as conn:
            # A process that started in the window counts from its start (0 before).
            pids = (set(self._cpu) | set(await cluster_pids(conn))) - set(exclude)
            self.cpu_seconds = sum(cpu_seconds(pid) - self._cpu.get(pid, 0.0) for pid in pids)
            cur = await conn.execute(STATEMENTS)
            rows = await cur.fetchall()
        self.rows = [
            {k: (float(v) if k == "wal_bytes" else v) for k, v in row.items()}
            for row in rows
            if BENCH_MARK not in row["query"]
        ]

    def table(self, title: str, jobs: int, note: str = "") -> dict[str, Any]:
        """The top statements by exec time, per job; top-level totals first."""
        top = [r for r in self.rows if r["toplevel"]]
        total_ms = sum(r["total_exec_time"] for r in top)
        totals = {
            "calls": sum(r["calls"] for r in top) / jobs,
            "exec_ms": total_ms / jobs,
            "rows": sum(r["rows"] for r in top) / jobs,
            "blks_hit": sum(r["shared_blks_hit"] for r in top) / jobs,
            "blks_dirtied": sum(r["shared_blks_dirtied"] for r in top) / jobs,
            "wal_bytes": sum(r["wal_bytes"] for r in top) / jobs,
            "cpu_ms": 1000 * self.cpu_seconds / jobs,
        }
        ranked = sorted(self.rows, key=lambda r: r["total_exec_time"], reverse=True)
        rows = [
            [
                short(r["query"]),
                "yes" if r["toplevel"] else "nested",
                round(r["calls"] / jobs, 3),
                round(r["total_exec_time"] / jobs, 4),
                round(r["total_exec_time"] / r["calls"], 4) if r["calls"] else 0.0,
                round(100 * r["total_exec_time"] / total_ms, 1) if total_ms else 0.0,
                round(r["rows"] / jobs, 3),
                round(r["shared_blks_hit"] / jobs, 2),
                round(r["shared_blks_read"] / jobs, 2),
                round(r["shared_blks_dirtied"] / jobs, 3),
                round(r["wal_bytes"] / jobs, 1),
            ]
            for r in ranked[:TOP_STATEMENTS]
        ]
        return {
            "title": title,
            "note": note,
            "totals": {k: round(v, 4) for k, v in totals.items()},
            "columns": [
                "statement",
                "top-level",
                "calls/job",
                "exec ms/job",
                "mean ms",
                "% of exec",
                "rows/job",
                "blks hit/job",
                "blks read/job",
                "blks dirtied/job",
                "WAL bytes/job",
            ],
            "rows": rows,
        }


@dataclass
class WaitSampler:
    """``pg_stat_activity`` and ungranted ``pg_locks`` of one database every
    :data:`SAMPLE_INTERVAL`, from a connection of its own, between start() and stop()."""

    database_url: str
    samples: int = 0
    backends: int = 0
    # The sampler's own backend (its CPU is the bench's).
    backend_pid: int = 0
    # (state, wait_event_type:wait_event or "CPU", statement) -> backend-samples
    waits: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    # (locktype mode target, waiting statement, blocking statement) -> backend-samples
    locks: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    _task: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True, row_factory=dict_row
        ) as conn:
            self.backend_pid = conn.info.backend_pid
            while not self._stop.is_set():
                started = time.monotonic()
                activity = await (await conn.execute(ACTIVITY)).fetchall()
                locks = await (await conn.execute(LOCKS)).fetchall()
                self.samples += 1
                for row in activity:
                    if row["backend_type"] != "client backend":
                        continue
                    self.backends += 1
                    event = (
                        f"{row['wait_event_type']}:{row['wait_event']}"
                        if row["wait_event_type"]
                        else "CPU (no wait event)"
                    )
                    statement = short(row["query"] or "", 70)
                    self.waits[(str(row["state"]), event, statement)] += 1
                for row in locks:
                    target = row["target"] or ""
                    if row["locktype"] == "tuple":
                        # Not by page and tuple: an updated row moves (a new version),
                        # and a hot row's versions are the one row.
                        target += " (a row)"
                    elif row["locktype"] == "object":
                        target += f" (objid {row['objid']})"
                    elif row["locktype"] == "transactionid" and row["row_of"]:
                        target = f"(a row of {row['row_of']})"
                    what = f"{row['locktype']} {row['mode']} {target}".strip()
                    self.locks[
                        (what, short(row["query"] or "", 90), short(row["blocker"] or "", 90))
                    ] += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(
                        self._stop.wait(),
                        max(0.0, SAMPLE_INTERVAL - (time.monotonic() - started)),
                    )

    def tables(self, title: str) -> list[dict[str, Any]]:
        samples = max(1, self.samples)
        waits = [
            [
                state,
                event,
                statement,
                count,
                round(count / samples, 3),
                round(100 * count / max(1, self.backends), 1),
            ]
            for (state, event, statement), count in self.waits.most_common(TOP_WAITS)
        ]
        locks = [
            [what, query, blocker, count, round(count / samples, 3)]
            for (what, query, blocker), count in self.locks.most_common(TOP_WAITS)
        ]
        note = (
            f"{self.samples} samples, every {1000 * SAMPLE_INTERVAL:g} ms; a non-idle "
            f"client backend of the database in a sample counts once "
            f"({self.backends / samples:.2f} per sample on average)."
        )
        return [
            {
                "title": f"{title}: what the backends were doing (pg_stat_activity)",
                "note": note,
                "columns": [
                    "state",
                    "wait event",
                    "statement (the last one, if idle in transaction)",
                    "backend-samples",
                    "per sample",
                    "% of backends",
                ],
                "rows": waits,
            },
            {
                "title": f"{title}: ungranted locks (pg_locks)",
                "note": "Each waiting backend once per sample, with the statement it runs and "
                "the statement of the first backend blocking it.",
                "columns": [
                    "lock",
                    "waiting statement",
                    "blocked by",
                    "backend-samples",
                    "per sample",
                ],
                "rows": locks,
            },
        ]
