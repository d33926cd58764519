"""A producer that enqueues the way an application does, for `jobcore chaos`: each job with
:func:`jobcore.enqueue_in` inside a transaction of its own that also writes an application
row, and a share of those transactions rolled back on purpose after the enqueue.

It keeps the account the run's report checks: the job of every committed transaction
must exist and end (the run's check counts it with the HTTP submitter's jobs), and the
job of a rolled-back transaction must never exist. A commit whose answer was lost (a
fault cut the connection during it) is settled afterwards by the application row: there,
the transaction committed, and its job must exist; absent, it did not.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg

from jobcore.execution.registry import Registry
from jobcore.kernel.errors import JobcoreError
from jobcore.kernel.settings import Settings
from jobcore.usecases.enqueue.in_transaction import enqueue_in

# The application's own table in the run's database (not jobcore's).
APP_TABLE = "public.chaos_app_orders"
CREATE_APP_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {APP_TABLE} (id uuid PRIMARY KEY, n int NOT NULL, "
    "job_id uuid NOT NULL)"
)
# The job type the run submits and checks (jobcore.testing.jobtypes).
JOB_TYPE = "effect"
# Seconds to wait before a new connection after one failed (a fault is on).
RECONNECT_PAUSE = 0.2
CONNECT_TIMEOUT = 5
# A step (the enqueue and the application row, or the commit) whose answer has not come in
# this time is taken as a connection the network stopped carrying (the run's database
# proxy holds it open and forwards nothing): psycopg alone would wait for it for ever.
STEP_TIMEOUT = 15.0


@dataclass(frozen=True, slots=True)
class AppPathReport:
    committed: int  # transactions committed with their job (settled unknowns included)
    rolled_back: int  # transactions rolled back on purpose after their enqueue
    unknown_commits: int  # commits whose answer was lost, settled by the application row
    failed_transactions: int  # transactions a fault broke before their end (nothing kept)
    jobs_from_rollbacks: int  # jobs of rolled-back transactions found: must be 0

    def as_dict(self) -> dict[str, int]:
        return {
            "app_committed": self.committed,
            "app_rolled_back": self.rolled_back,
            "app_unknown_commits": self.unknown_commits,
            "app_failed_transactions": self.failed_transactions,
            "app_jobs_from_rollbacks": self.jobs_from_rollbacks,
        }


@dataclass
class AppProducer:
    """``database_url``: where the application connects (through the run's database proxy,
    so the faults reach it too). ``rollback_share``: the share of transactions rolled back
    on purpose, drawn from ``rng``."""

    database_url: str
    settings: Settings
    registry: Registry
    tenant: str
    rng: random.Random
    rollback_share: float = 0.25
    committed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    # Commits whose answer was lost: (application row id, job id), settled by settle().
    unknown: list[tuple[uuid.UUID, str]] = field(default_factory=list)
    unknown_settled: int = 0
    failed: int = 0
    step_timeout: float = STEP_TIMEOUT
    _conn: psycopg.AsyncConnection[Any] | None = None
    _sequence: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.rollback_share <= 1.0:
            raise ValueError("rollback_share is between 0 and 1")

    async def prepare(self) -> None:
        """Create the application's table (before the faults)."""
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT
        ) as conn:
            await conn.execute(CREATE_APP_TABLE)

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error, TimeoutError):
                async with asyncio.timeout(self.step_timeout):
                    await self._conn.close()
            self._conn = None

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self.database_url, connect_timeout=CONNECT_TIMEOUT
            )
        return self._conn

    async def produce_one(self, *, seconds: float = 0.0) -> None:
        """One application transaction: enqueue, write the application row, then commit
        or (a ``rollback_share`` of the time) roll back."""
        self._sequence += 1
        n = self._sequence
        row_id = uuid.uuid4()
        roll_back = self.rng.random() < self.rollback_share
        try:
            async with asyncio.timeout(self.step_timeout):
                conn = await self._connection()
                result = await enqueue_in(
                    conn,
                    self.registry,
                    JOB_TYPE,
                    {"n": n, "seconds": seconds},
                    tenant=self.tenant,
                    settings=self.settings,
                )
                job_id = str(result.job_id)
                await conn.execute(
                    f"INSERT INTO {APP_TABLE} (id, n, job_id) VALUES (%s, %s, %s)",
                    (row_id, n, result.job_id),
                )
        except (psycopg.Error, JobcoreError, TimeoutError):
            # Broken before its end (the database gone, or its answers no longer coming):
            # the server rolls it back when the connection ends; nothing of it is kept.
            self.failed += 1
            await self._reconnect_later()
            return
        if roll_back:
            try:
                async with asyncio.timeout(self.step_timeout):
                    await conn.rollback()
            except (psycopg.Error, TimeoutError):
                await self._reconnect_later()  # rolled back by the server all the same
            self.rolled_back.append(job_id)
            return
        try:
            async with asyncio.timeout(self.step_timeout):
                await conn.commit()
        except (psycopg.Error, TimeoutError):
            self.unknown.append((row_id, job_id))
            await self._reconnect_later()
            return
        self.committed.append(job_id)

    async def _reconnect_later(self) -> None:
        await self.close()
        await asyncio.sleep(RECONNECT_PAUSE)  # a fault is on: do not spin on it

    async def steady(
        self, rate: float, stop: asyncio.Event, *, limit: int | None = None, seconds: float = 0.0
    ) -> int:
        """One transaction after another, ``rate`` a second, until ``stop`` is set (or
        ``limit`` were started); how many were started."""
        started = 0
        begun = time.monotonic()
        try:
            while not stop.is_set() and (limit is None or started < limit):
                due = begun + started / rate
                if (wait := due - time.monotonic()) > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)  # the load's pacing
                    continue
                started += 1
                await self.produce_one(seconds=seconds)
        finally:
            await self.close()
        return started

    async def settle(self, database_url: str) -> None:
        """Decide each commit whose answer was lost, by its application row."""
        if not self.unknown:
            return
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            cur = await conn.execute(
                f"SELECT id FROM {APP_TABLE} WHERE id = ANY(%s)", ([r for r, _ in self.unknown],)
            )
            present = {row[0] for row in await cur.fetchall()}
        for row_id, job_id in self.unknown:
            (self.committed if row_id in present else self.rolled_back).append(job_id)
        self.unknown_settled += len(self.unknown)
        self.unknown = []

    async def report(self, database_url: str) -> AppPathReport:
        """The account, read from the database; call after :meth:`settle`. A job of a
        rolled-back transaction is looked for among the pruned jobs too, when the run
        archives them."""
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            cur = await conn.execute("SELECT to_regclass('public.pruned_jobs') IS NOT NULL")
            row = await cur.fetchone()
            archived = bool(row and row[0])
            ids = [uuid.UUID(j) for j in self.rolled_back]
            jobs = f"{self.settings.database_schema}.jobs"
            query = f"SELECT count(*) FROM {jobs} WHERE id = ANY(%(ids)s)"
            if archived:
                query += (
                    " UNION ALL SELECT count(*) FROM public.pruned_jobs WHERE id = ANY(%(ids)s)"
                )
            cur = await conn.execute(query, {"ids": ids})
            found = sum(int(r[0]) for r in await cur.fetchall())
            cur = await conn.execute(
                f"SELECT count(*) FROM {APP_TABLE} WHERE job_id = ANY(%s)", (ids,)
            )
            rows = await cur.fetchone()
        orphans = int(rows[0]) if rows else 0
        return AppPathReport(
            committed=len(self.committed),
            rolled_back=len(self.rolled_back),
            unknown_commits=self.unknown_settled,
            failed_transactions=self.failed,
            # An application row of a rolled-back transaction would be the same failure.
            jobs_from_rollbacks=found + orphans,
        )
