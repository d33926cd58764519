"""A few pool connections held by the worker for its hot path (claim, outcome, heartbeat).

Held connections skip the pool's checkout and its check (which looks at the socket, and
only then queries: a query per checkout was a round trip for each of the two statements a
job costs). One that comes back from a failed or interrupted statement in any state but
idle goes back to the pool (which resets or discards it), together with every idle held
one, and slots are refilled from the pool (checked) on next use: a restarted database
costs one failed statement.

A held connection plans its statements once (``plan_cache_mode = force_generic_plan``,
reset when the worker gives its held connections back to the pool). Its statements are
prepared after a few runs (psycopg's ``prepare_threshold``), and PostgreSQL then chooses
between a generic plan and one planned anew for each run's parameters from what the first
five runs cost. The claim's first runs are small batches (a worker starting, a trickle, or
one of several replicas): re-planning then looked cheaper, and every claim after that was
planned again, at several times the generic plan's cost (figures: docs/scaling.md and
docs/bench/measurements.md, "Held connections"). These statements look rows up by key in
parameter arrays: one plan serves every batch size.

The connection handed out is the one given back last (a stack, not a queue). A backend
appends the rows it inserts to the page it last filled, one page per backend and table:
handed out in turn, each of the held backends kept a half-filled page of the inbox
open, and a trickle of claims spread its rows over all of them (the inbox's heap took 92–94
bytes a job for rows of 60: docs/bench/measurements.md, "Held connections"). From the
top of the stack, a trickle runs on one or two backends, and the rest are used only
under load.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

from jobcore.database.gateway import GENERIC_PLANS, AsyncConn, Database, translate_errors
from jobcore.kernel.errors import TransientConflict

POOL_PLANS = "RESET plan_cache_mode"


class HeldConnections:
    def __init__(self, db: Database, size: int) -> None:
        self.db = db
        self.size = size
        # Behind PgBouncer in transaction mode a SET would stay on a server connection for
        # other clients, and with no prepared statements there is no plan cache to steer.
        self._plans_generic = db.settings.database_pooler != "pgbouncer"
        # None marks a free slot with no connection yet (taken from the pool when used).
        self._free: asyncio.LifoQueue[AsyncConn | None] = asyncio.LifoQueue()
        for _ in range(size):
            self._free.put_nowait(None)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConn]:
        conn = await self._free.get()
        try:
            with translate_errors(self.db.settings):
                if conn is None:
                    conn = await self.db.pool.getconn()
                    try:
                        if self._plans_generic:
                            await conn.execute(GENERIC_PLANS)
                    except BaseException:
                        await self._give_back(conn)
                        conn = None
                        raise
                try:
                    yield conn
                except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                    raise TransientConflict(str(exc).strip().splitlines()[0]) from exc
        finally:
            # A statement error leaves an autocommit connection idle and usable; a broken
            # connection or an interrupted statement does not.
            healthy = conn is not None and conn.pgconn.transaction_status == TransactionStatus.IDLE
            if conn is not None and not healthy:
                await self._give_back(conn)
                conn = None
                if self._free.qsize():
                    # One broken connection usually means the server restarted: the idle
                    # ones are broken too. The pool checks what it hands out next.
                    await self._give_back_idle()
            self._free.put_nowait(conn)

    async def _give_back(self, conn: AsyncConn, *, reset: bool = False) -> None:
        if reset:
            # Statements that run on the pool keep choosing their plans per run. (After a
            # failure the connections go back as they are: most are broken, and a cut
            # network would make each RESET wait for the operation timeout.)
            with contextlib.suppress(Exception):
                if self._plans_generic:
                    await conn.execute(POOL_PLANS)
        with contextlib.suppress(Exception):
            await self.db.pool.putconn(conn)

    async def _give_back_idle(self) -> None:
        idle = [self._free.get_nowait() for _ in range(self._free.qsize())]
        for conn in idle:
            if conn is not None:
                await self._give_back(conn)
            self._free.put_nowait(None)

    async def close(self) -> None:
        """Give every held connection back to the pool (before the pool closes)."""
        for _ in range(self.size):
            try:
                conn = await asyncio.wait_for(self._free.get(), timeout=5)
            except TimeoutError:
                return  # still in use by a statement that outlived shutdown: the pool closes it
            if conn is not None:
                await self._give_back(conn, reset=True)
