"""The compactor: after a pinned xmin horizon, the hot tables give their space back.

While a transaction pins the horizon (a report, a forgotten psql session), no dead row of
the hot tables can be removed, and their files grow with every job. Once it ends, VACUUM
makes the space reusable but returns only empty pages at the very end of a file, which
churn rarely leaves: in the pressure bench the hot tables grew from 81 to 460 MiB during a
10-minute pin at 200 jobs/s and were still 207 MiB 30 minutes after it
(docs/bench/pressure/report.md). The relay's own VACUUM of the outbox does not even try
(``TRUNCATE false``, :mod:`.table_vacuum`).

So the maintenance leader looks, every :attr:`CompactorConfig.interval`, for a hot table
whose files (heap and indexes) are at least :attr:`~CompactorConfig.ratio` times what its
live rows need, by an estimate from the statistics (``n_live_tup`` and the columns'
average widths; pgstattuple is not needed), and rewrites the largest such table:
``CLUSTER`` on its primary key, which writes the live rows into new files, rebuilds its
indexes, and drops the old files. Only when it pays:

- **Not while the horizon is pinned.** A rewrite keeps every row version some snapshot
  may still see; under a pin it would copy the dead rows too, and lock the table for
  nothing. A transaction open for more than :attr:`~CompactorConfig.horizon_age` (or a
  prepared one) counts as a pin, and so does a replication slot's or a standby's xmin
  older than the XIDs the database used in that long (measured between two rounds).
- **Not too often.** At most once per table per ``JOBCORE_COMPACT_EVERY`` (0: never), as
  this leader remembers it; a table that churns regrows to its working size anyway. A
  compaction that gave up waiting for its lock is tried again next round, up to
  :data:`LOCK_MISSES` times in a row, then after :data:`LOCK_BACKOFF`.
- **Not for more than the bound allows.** A table whose rewrite was rolled back at
  ``JOBCORE_COMPACT_MAX_SECONDS`` is tried again only once its live rows need half as
  much: as large, it would stall its statements for the whole bound again, for nothing.
- **Not for small change.** The table must hold at least
  :attr:`~CompactorConfig.min_excess_bytes` more than it needs.

Why ``CLUSTER`` in a transaction rather than ``VACUUM (FULL)`` (the same rewrite, which
cannot run in one): the lock is taken first by an explicit ``LOCK TABLE`` under
``lock_timeout`` (``JOBCORE_COMPACT_LOCK_TIMEOUT``), so a long reader holding the table
makes the compaction give up within that bound instead of queueing every enqueue, claim
and outcome behind its waiting ``ACCESS EXCLUSIVE`` request; and the lock's wait and its
hold are measured apart. The rewrite runs under ``statement_timeout``
(``JOBCORE_COMPACT_MAX_SECONDS``): one that would hold the lock longer is rolled back and
the table left as it was. The index's "clustered" mark is cleared in the same transaction,
so nothing about the schema changes. A rewrite fires no trigger (the usage, workflow and
batch triggers on ``jobs`` see nothing), keeps every row version as it was (``xmin``, the
ETag of an edit, included) and, like VACUUM, keeps what a running snapshot may still see.
Moving rows forward by no-op updates (pgcompacttable's way) would fire those triggers and
change every moved job's ETag, which is why it is not done.

A compaction is logged (table, bytes before and after, the lock's wait and hold) and
counted; the rewrite runs on a connection of its own, so the leader's other services keep
their turns meanwhile (those touching the table wait for it, bounded as above).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg
from psycopg import errors, sql

from jobcore.database.gateway import connect_for_chore
from jobcore.database.store import database_store
from jobcore.database.table_names import HOT_TABLES
from jobcore.kernel.settings import Settings
from jobcore.maintenance.base import MaintenanceService, ServiceConfig
from jobcore.maintenance.lease import Term
from jobcore.maintenance.metrics import CompactorMetrics

log = logging.getLogger(__name__)

PAGE = 8192
# A heap row's cost beyond its columns: the 23-byte header aligned to 24, and its 4-byte
# line pointer; pages filled to about this share by inserts amid deletes.
ROW_OVERHEAD = 28
PAGE_FILL = 0.9
# An index entry: its 8-byte header, a key of 8 to 24 bytes, its line pointer, in pages
# 70 to 90 % full. A partial index holds some of the rows (jobs has 15, each for a few
# statuses or a rare column): counted as this share of one.
INDEX_ENTRY = 40
PARTIAL_INDEX = 0.25
# A rewrite that outlives its bounds on the server by this much is given up by the client
# too (its connection closed): a cut network must not hold the compactor forever.
CLIENT_SLACK = 30.0
# An undated holder of the horizon (a slot, a standby's feedback) counts as a pin when its
# xmin is older than the XIDs used in horizon_age, plus this many (an idle database uses
# none, and a standby's feedback lags by a few).
XID_SLACK = 1000
# Lock timeouts in a row after which a table waits LOCK_BACKOFF (JOBCORE_COMPACT_EVERY if
# shorter) before the next try: a session that keeps the table locked for hours (an
# application's transaction left open after a read) would otherwise cost every statement
# on it a lock_timeout's wait every round; readers that come and go (a burst of reports)
# must not put the compaction off for the whole JOBCORE_COMPACT_EVERY.
LOCK_MISSES = 3
LOCK_BACKOFF = 300.0


@dataclass(frozen=True)
class CompactorConfig(ServiceConfig):
    # How often the leader looks (two catalog reads); the table's own rate is `every`.
    interval: float = 60.0
    # At most one compaction of a table this often (seconds).
    every: float = 1800.0
    lock_timeout: float = 0.1
    max_seconds: float = 2.0
    # Compact when the heap and indexes are this many times what the live rows need... A
    # churning table runs well above its compact size between vacuums: jobs at 200 jobs/s
    # with a 2-minute retention keeps 35 MiB for about 25,000 live rows, which compact into
    # 11 MiB and are estimated at 16 (scripts/compaction_hold.py); 3 leaves that alone and
    # catches the 104 MiB a 10-minute pin left.
    ratio: float = 3.0
    # ...and at least this much above it.
    # A churning table keeps some free space for the rows to come (the outbox about 4 MiB
    # at 200 jobs/s, with next to no live rows): giving that back would only see it taken
    # again, a compaction every JOBCORE_COMPACT_EVERY for nothing.
    min_excess_bytes: int = 8 * 1024 * 1024
    # A transaction open longer than this pins the horizon for the compactor.
    horizon_age: float = 60.0
    tables: tuple[str, ...] = HOT_TABLES

    variables: ClassVar = {
        "every": "JOBCORE_COMPACT_EVERY",
        "lock_timeout": "JOBCORE_COMPACT_LOCK_TIMEOUT",
        "max_seconds": "JOBCORE_COMPACT_MAX_SECONDS",
    }

    @classmethod
    def from_settings(cls, settings: Settings) -> CompactorConfig:
        return cls(
            every=settings.compact_every,
            lock_timeout=settings.compact_lock_timeout,
            max_seconds=settings.compact_max_seconds,
        )

    def check(self) -> None:
        super().check()
        for field in ("every", "lock_timeout", "max_seconds", "horizon_age"):
            self.positive(field)
        if not self.ratio > 1:
            raise self.refuse("ratio", f"must be above 1, not {self.ratio!r}")


@dataclass(frozen=True)
class Candidate:
    """A table as the statistics see it."""

    name: str
    size: int  # heap and indexes, bytes
    total: int  # with TOAST, bytes
    need: int  # the estimate of what its live rows need, bytes
    key_index: str
    # An index an operator marked for CLUSTER: the rewrite orders by it and keeps the mark.
    clustered_index: str | None = None

    @property
    def order_by(self) -> str:
        return self.clustered_index or self.key_index

    @property
    def excess(self) -> int:
        return self.size - self.need


@dataclass(frozen=True)
class Compaction:
    """One compaction's outcome: ``done``, ``lock_timeout`` (gave up waiting for the
    lock), ``too_slow`` (rolled back past max_seconds) or ``failed``."""

    table: str
    outcome: str
    bytes_before: int
    bytes_after: int
    lock_wait: float
    lock_held: float


def need_bytes(row: Mapping[str, Any]) -> int | None:
    """What a table's live rows need in heap and indexes, estimated; None when its rows'
    width is unknown (never analyzed)."""
    width = row["row_width"]
    if width is None:
        return None
    live = int(row["live"])
    full, partial = int(row["indexes"]), int(row.get("partial_indexes") or 0)
    heap = live * (int(width) + ROW_OVERHEAD) / PAGE_FILL
    index = live * (full + PARTIAL_INDEX * partial) * INDEX_ENTRY
    # Every relation keeps a page or two however empty (an index's metapage and root).
    return int(heap + index) + (1 + full + partial) * 2 * PAGE


def candidates(rows: Sequence[Mapping[str, Any]], config: CompactorConfig) -> list[Candidate]:
    """The tables worth compacting, the most excess first."""
    found = []
    for row in rows:
        need = need_bytes(row)
        if need is None or row["key_index"] is None:
            continue
        size = int(row["heap_bytes"]) + int(row["index_bytes"])
        if size >= config.ratio * need and size - need >= config.min_excess_bytes:
            found.append(
                Candidate(
                    row["name"],
                    size,
                    int(row["total_bytes"]),
                    need,
                    row["key_index"],
                    row.get("clustered_index"),
                )
            )
    return sorted(found, key=lambda c: c.excess, reverse=True)


class Compactor(MaintenanceService[CompactorConfig]):
    name = "compactor"

    def __init__(
        self, config: CompactorConfig, *, settings: Settings, metrics: CompactorMetrics | None
    ) -> None:
        super().__init__(config)
        self.settings = settings
        self.metrics = metrics
        # When each table was last compacted (or tried and failed), monotonic.
        self.compacted_at: dict[str, float] = {}
        # Lock timeouts in a row, by table.
        self.lock_misses: dict[str, int] = {}
        # What a table's live rows needed when its rewrite was too slow (rolled back at
        # JOBCORE_COMPACT_MAX_SECONDS), by table: a rewrite's time grows with the live rows,
        # so a table that large would stall its statements for the whole bound, and roll
        # back, every JOBCORE_COMPACT_EVERY for ever. It is tried again once its live rows
        # need half that.
        self.too_slow_at_need: dict[str, int] = {}
        # The previous round's (monotonic time, next XID): the XID rate that dates a slot.
        self._xids_seen: tuple[float, int] | None = None
        self.last: Compaction | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, metrics: CompactorMetrics | None) -> Compactor:
        return cls(CompactorConfig.from_settings(settings), settings=settings, metrics=metrics)

    def pinned(self, horizon: Mapping[str, Any], now: float) -> str | None:
        """Why the horizon counts as pinned (None: it does not)."""
        seen, self._xids_seen = self._xids_seen, (now, int(horizon["next_xid"]))
        if horizon["seconds"] >= self.config.horizon_age:
            return f"a transaction open for {horizon['seconds']:.0f} s"
        undated = horizon["undated_xids"]
        if undated is None:
            return None
        if seen is None or now <= seen[0]:
            return "a replication slot or standby holds it (no XID rate measured yet)"
        rate = (int(horizon["next_xid"]) - seen[1]) / (now - seen[0])
        if undated > rate * self.config.horizon_age + XID_SLACK:
            return f"a replication slot or standby holds it ({undated} XIDs old)"
        return None

    async def lead(self, term: Term) -> int:
        """Compact the table that pays most, if any does and nothing pins the horizon;
        how many tables were compacted (0 or 1)."""
        async with term.db.session() as session:
            # Reads, outside the fence: a round with nothing to do writes nothing.
            horizon = await database_store.compaction_horizon(session)
            rows = await database_store.compaction_tables(
                session, {"tables": list(self.config.tables)}
            )
        assert horizon is not None
        now = time.monotonic()
        why = self.pinned(horizon, now)
        if why is not None:
            log.debug(
                "compactor: the xmin horizon is pinned, nothing compacted", extra={"why": why}
            )
            return 0
        due = [c for c in candidates(rows, self.config) if self.due(c.name, now) and self.fits(c)]
        if not due:
            return 0
        async with term.db.unit_of_work() as uow:
            if not await term.fence(uow, self):
                return 0
            await uow.commit()
        table = due[0]
        work = asyncio.ensure_future(self.compact(table))
        # A stopping worker does not wait: PostgreSQL rolls the rewrite back when its
        # connection goes.
        ended = asyncio.ensure_future(term.sleep(self.bound))
        try:
            await asyncio.wait({work, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, ended):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        if not work.done() or work.cancelled():
            return 0
        done = work.result()
        return 1 if done.outcome == "done" else 0

    def note(self, table: str, outcome: str, now: float, need: int = 0) -> None:
        """When ``table`` is due again after an attempt that ended in ``outcome``, its live
        rows needing ``need`` bytes."""
        if outcome == "too_slow":
            self.too_slow_at_need[table] = need
        elif outcome == "done":
            self.too_slow_at_need.pop(table, None)
        misses = self.lock_misses.pop(table, 0) + 1
        if outcome != "lock_timeout":
            misses = 0
        if 0 < misses < LOCK_MISSES:
            # Tried again next round: the reader in the way is likely gone by then.
            self.lock_misses[table] = misses
        elif misses:
            # Due again LOCK_BACKOFF from now (every compaction is due `every` after).
            wait = min(LOCK_BACKOFF, self.config.every)
            self.compacted_at[table] = now - self.config.every + wait
        else:
            self.compacted_at[table] = now

    def fits(self, table: Candidate) -> bool:
        """Whether ``table``'s rewrite may end within the bound: not while its live rows
        need more than half what they needed when a rewrite of it was too slow."""
        too_slow_at = self.too_slow_at_need.get(table.name)
        return too_slow_at is None or 2 * table.need <= too_slow_at

    def due(self, table: str, now: float) -> bool:
        return now - self.compacted_at.get(table, -self.config.every) >= self.config.every

    @property
    def bound(self) -> float:
        return self.config.lock_timeout + self.config.max_seconds + CLIENT_SLACK

    async def compact(self, table: Candidate) -> Compaction:
        """Rewrite ``table`` under the lock's bounds; log and count what it did."""
        schema = self.settings.database_schema
        relation = sql.Identifier(schema, table.name)
        qualified = f"{schema}.{table.name}"
        before = after = table.total
        wait = held = 0.0
        outcome = "failed"
        error = ""
        try:
            async with asyncio.timeout(self.bound):
                conn = await connect_for_chore(self.settings, "jobcore-compactor")
                async with conn:
                    before = await total_bytes(conn, qualified)
                    asked = time.monotonic()
                    got = None
                    try:
                        async with conn.transaction():
                            await conn.execute(
                                "SELECT set_config('lock_timeout', %(lock)s, true),"
                                " set_config('statement_timeout', %(hold)s, true),"
                                " set_config('idle_in_transaction_session_timeout', %(hold)s,"
                                " true)",
                                {
                                    "lock": str(milliseconds(self.config.lock_timeout)),
                                    "hold": str(milliseconds(self.config.max_seconds)),
                                },
                            )
                            await conn.execute(
                                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(relation)
                            )
                            got = time.monotonic()
                            await conn.execute(
                                sql.SQL("CLUSTER {} USING {}").format(
                                    relation, sql.Identifier(table.order_by)
                                )
                            )
                            if table.clustered_index is None:
                                # CLUSTER marked the key: unmarked, the schema is as it was.
                                await conn.execute(
                                    sql.SQL("ALTER TABLE {} SET WITHOUT CLUSTER").format(relation)
                                )
                        outcome = "done"
                    finally:
                        ended = time.monotonic()
                        wait = (got if got is not None else ended) - asked
                        held = ended - got if got is not None else 0.0
                    after = await total_bytes(conn, qualified)
                    # The new files have no visibility map: without it, index-only scans
                    # of the table fetch every heap row until autovacuum comes by.
                    await conn.execute(
                        sql.SQL("VACUUM (SKIP_LOCKED, TRUNCATE false, PARALLEL 0) {}").format(
                            relation
                        )
                    )
        except errors.LockNotAvailable:
            outcome = "lock_timeout"
        except errors.QueryCanceled as exc:
            # statement_timeout: the rewrite would have held the lock too long.
            outcome, error = "too_slow", str(exc).strip()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}".strip()
        self.note(table.name, outcome, time.monotonic(), table.need)
        done = Compaction(table.name, outcome, before, after, wait, held)
        self.last = done
        self.report(done, table, error)
        return done

    def report(self, done: Compaction, table: Candidate, error: str) -> None:
        fields = {
            "table": done.table,
            "outcome": done.outcome,
            "bytes_before": done.bytes_before,
            "bytes_after": done.bytes_after,
            "bytes_needed_estimate": table.need,
            "lock_wait_ms": round(done.lock_wait * 1000, 1),
            "lock_held_ms": round(done.lock_held * 1000, 1),
        }
        if done.outcome == "done":
            log.info("compacted a hot table", extra=fields)
        elif done.outcome == "lock_timeout":
            log.info("compaction gave up waiting for its lock; tried again later", extra=fields)
        else:
            log.warning(
                "compaction rolled back; tried again after JOBCORE_COMPACT_EVERY",
                extra={**fields, "error": error},
            )
        if self.metrics is not None:
            self.metrics.compacted(
                done.table,
                done.outcome,
                freed=max(done.bytes_before - done.bytes_after, 0),
                lock_wait=done.lock_wait,
                lock_held=done.lock_held,
            )


def milliseconds(seconds: float) -> int:
    return max(1, round(seconds * 1000))


async def total_bytes(conn: psycopg.AsyncConnection[Any], qualified: str) -> int:
    cur = await conn.execute("SELECT pg_total_relation_size(%s::regclass)", (qualified,))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])
