"""A few pool connections held by the worker for its hot path (claim, outcome, heartbeat).

The shared pool checks every connection it hands out with an empty query: one round
trip, and a fifth of the worker's CPU in a no-op job profile, for each of the two
statements a job costs. Connections held here skip that check. One that comes back from
a failed or interrupted statement in any state but idle goes back to the pool (which
resets or discards it) and is replaced from the pool on next use, so a restarted
database is survived the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from psycopg.pq import TransactionStatus

from jobcore.db import AsyncConn, Database, translate_errors


class HeldConnections:
    def __init__(self, db: Database, size: int) -> None:
        self.db = db
        self.size = size
        # None marks a free slot with no connection yet (taken from the pool when used).
        self._free: asyncio.Queue[AsyncConn | None] = asyncio.Queue()
        for _ in range(size):
            self._free.put_nowait(None)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConn]:
        conn = await self._free.get()
        healthy = False
        try:
            with translate_errors(self.db.settings):
                if conn is None:
                    conn = await self.db.pool.getconn()
                yield conn
            healthy = conn.pgconn.transaction_status == TransactionStatus.IDLE
        finally:
            if conn is not None and not healthy:
                with contextlib.suppress(Exception):
                    await self.db.pool.putconn(conn)
                conn = None
            self._free.put_nowait(conn)

    async def close(self) -> None:
        """Give every held connection back to the pool (before the pool closes)."""
        for _ in range(self.size):
            try:
                conn = await asyncio.wait_for(self._free.get(), timeout=5)
            except TimeoutError:
                return  # still in use by a statement that outlived shutdown: the pool closes it
            if conn is not None:
                with contextlib.suppress(Exception):
                    await self.db.pool.putconn(conn)
