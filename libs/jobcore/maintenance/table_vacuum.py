"""VACUUM of a table by the process that empties it, after every so many rows it deleted.

Two tables are written and emptied all the time, and autovacuum is too slow for them:
it looks at a database once a minute at most (``autovacuum_naptime``) and sleeps between
pages, and the machine may run without it.

- **The outbox, by the relays.** The relay deletes every row it publishes, oldest first,
  so the dead index entries pile up at the head of the indexes its claim reads in order
  (``outbox_fair_due_idx`` from the oldest due row, ``outbox_ready_lanes_due_idx`` from
  its last lane). Index scans mark dead entries and skip them, but only VACUUM frees
  their pages: until then every claim walks every leaf page of the rows drained since
  the last one. Draining 1,000,000 rows with no VACUUM, the claim read 24 buffers on the
  full outbox and 6,000 with 50,000 rows left, and the drain slowed down as the outbox
  emptied.
- **The usage deltas, by the maintenance leader's usage folder**
  (:mod:`jobcore.maintenance.usage_folder`), which deletes every delta it folds. Until a
  VACUUM records the space of the deleted deltas as free, every new delta goes to a new
  page: at a steady 137 jobs/s the table grew by 105 to 295 bytes per job over 30 s,
  and by none with a VACUUM every 250 deltas folded (docs/bench/paced/lean-rows).

One VACUUM at a time per table and process, in the background on a connection of its own
(it may run longer than a statement's timeout, and cannot run in a transaction);
``SKIP_LOCKED``, so a process whose peer (or autovacuum) is vacuuming the table skips its
turn instead of waiting. VACUUM takes no lock that a claim, an enqueue or a delete waits
for, and changes no row anyone can see: it only frees what no transaction can see any
more. A role that does not own the table gets a warning from PostgreSQL and nothing is
vacuumed; a failure is logged and the next turn tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import psycopg

from jobcore.database.gateway import connect_for_chore, in_schema
from jobcore.kernel.settings import Settings

log = logging.getLogger(__name__)

# TRUNCATE false: giving the empty pages at the end of the file back to the system takes
# an ACCESS EXCLUSIVE lock, which every claim and enqueue would wait for. (The space a
# pinned horizon made the outbox take is the maintenance leader's compactor's to give
# back, under a lock it waits for and holds a bounded time: jobcore.maintenance.compactor.)
# PARALLEL 0: a background chore takes one backend, not one per index besides the relay's
# own.
TABLE_VACUUM = "VACUUM (SKIP_LOCKED, TRUNCATE false, PARALLEL 0) jobcore.{table}"
# The outbox's emptiers (relays, and workers that take rows themselves: direct pickup)
# each vacuum it after every OUTBOX_SMALL_EVERY rows they deleted while it is smaller than
# OUTBOX_SMALL_BYTES: under a steady trickle the outbox stays small, and a VACUUM of it (a
# few milliseconds) keeps the space and index pages of the deleted rows for the next ones.
# At 137 jobs/s, with autovacuum alone, the outbox grew by 146 B/job over 30 s
# (docs/bench/paced/lean-rows). Past that size (a backlog, many scheduled rows) only every
# `every` rows (the relay's JOBCORE_RELAY_VACUUM_EVERY).
OUTBOX_SMALL_EVERY = 1000
OUTBOX_SMALL_BYTES = 32 * 1024 * 1024
# A VACUUM that takes longer is given up (its connection closed): a cut network must not
# stop every later one.
VACUUM_TIMEOUT = 600.0
# After a VACUUM that could not start (no connection to be had: the server's
# max_connections, say), the next is tried this long after, not after as many rows again.
# One that failed once started (a statement_timeout, VACUUM_TIMEOUT) waits for as many rows
# again: tried again at once, it would redo most of its work and fail the same way.
RETRY_SECONDS = 1.0


# How big the table is, heap and indexes, read before a VACUUM that only a small table is
# owed (TableVacuum's ``small_every``).
TABLE_SIZE = """
    SELECT pg_total_relation_size(c.oid) AS bytes
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = 'jobcore' AND c.relname = '{table}'
"""


class TableVacuum:
    """Counts the rows of ``table`` a process deleted; past ``every`` since the last VACUUM,
    starts one. ``owner`` names the process in logs and in ``application_name``.

    ``small_every`` (0: never): past that many rows, a VACUUM too, if the table and its
    indexes are smaller than ``small_bytes``. A VACUUM reads every page of every index,
    so a big table (a backlog, many scheduled rows) is vacuumed every ``every`` rows,
    while a small one under a steady trickle costs a few milliseconds each time, and
    keeps the space and the index pages its deleted rows held for the next ones, rather
    than for autovacuum's next look (a minute at most). After a look that found the
    table big, the next is ``small_every`` rows later.
    """

    def __init__(
        self,
        settings: Settings,
        table: str,
        every: int,
        *,
        owner: str,
        small_every: int = 0,
        small_bytes: int = 0,
    ) -> None:
        self.settings = settings
        self.table = table
        self.owner = owner
        self.every = every
        self.small_every = small_every if every > 0 else 0
        self.small_bytes = small_bytes
        self.deleted_since = 0
        self.runs = 0
        # Looks at the table's size that found it too big for a small VACUUM.
        self.found_big = 0
        self._next_look = small_every
        self._task: asyncio.Task[None] | None = None
        self._retry_at = 0.0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def deleted(self, rows: int) -> None:
        """``rows`` more rows deleted; vacuum now if enough were (``every`` 0: never)."""
        if self.every <= 0:
            return
        self.deleted_since += rows
        if self.running or time.monotonic() < self._retry_at:
            return
        if self.deleted_since >= self.every:
            self._start(small_only=False)
        elif self.small_every > 0 and self.deleted_since >= self._next_look:
            self._start(small_only=True)

    def _start(self, *, small_only: bool) -> None:
        counted, self.deleted_since = self.deleted_since, 0
        self._task = asyncio.create_task(
            self._vacuum(counted, small_only), name=f"{self.owner}-{self.table}-vacuum"
        )

    async def _vacuum(self, counted: int, small_only: bool) -> None:
        started = time.monotonic()
        connected = False
        try:
            async with asyncio.timeout(VACUUM_TIMEOUT):
                conn = await connect_for_chore(self.settings, f"jobcore-{self.owner}-vacuum")
                connected = True
                schema = self.settings.database_schema
                async with conn:
                    if small_only and not await self._small(conn, schema):
                        # Not vacuumed: the rows still count towards `every`.
                        self.deleted_since += counted
                        self._next_look = self.deleted_since + self.small_every
                        self.found_big += 1
                        return
                    statement = TABLE_VACUUM.format(table=self.table)
                    await conn.execute(in_schema(statement, schema))
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning(
                "VACUUM of a table failed; it is tried again later",
                extra={
                    "table": self.table,
                    "owner": self.owner,
                    "error": f"{type(exc).__name__}: {exc}".strip(),
                },
            )
            if not connected:
                # Still owed: tried again after RETRY_SECONDS, at the next batch deleted.
                self.deleted_since += counted
                self._retry_at = time.monotonic() + RETRY_SECONDS
            return
        self.runs += 1
        self._next_look = self.small_every
        log.debug(
            "table vacuumed",
            extra={"table": self.table, "seconds": round(time.monotonic() - started, 3)},
        )

    async def _small(self, conn: psycopg.AsyncConnection[Any], schema: str) -> bool:
        cur = await conn.execute(in_schema(TABLE_SIZE.format(table=self.table), schema))
        row = await cur.fetchone()
        return row is not None and int(row[0]) < self.small_bytes

    async def close(self) -> None:
        """Stop a VACUUM under way (PostgreSQL ends it when its connection goes)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
