"""One application transaction of each kind jobcore.enqueue_in takes, driven alike from
async tests: a psycopg Connection or AsyncConnection, a SQLAlchemy Session or AsyncSession.

The connections keep the drivers' default tuple rows (and the async psycopg one prepares
every statement at once), so that an enqueue relying on the caller's row factory or
prepare threshold would break here."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session as OrmSession

from jobcore import enqueue_in, enqueue_in_sync
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.usecases.enqueue.write_one import EnqueueResult

KINDS = ["psycopg", "psycopg_async", "sqlalchemy", "sqlalchemy_async"]


def sqlalchemy_url(database_url: str) -> str:
    return "postgresql+psycopg://" + database_url.split("://", 1)[1]


class AppTx:
    """An open application transaction: write a row, enqueue, commit or roll back."""

    def __init__(self, kind: str, tx: Any, settings: Settings) -> None:
        self.kind = kind
        self.tx = tx
        self.settings = settings

    async def execute(self, sql: str, params: dict[str, Any]) -> None:
        if self.kind == "psycopg":
            self.tx.execute(sql, params)
        elif self.kind == "psycopg_async":
            await self.tx.execute(sql, params)
        elif self.kind == "sqlalchemy":
            self.tx.execute(text(sql.replace("%(", ":").replace(")s", "")), params)
        else:
            await self.tx.execute(text(sql.replace("%(", ":").replace(")s", "")), params)

    async def add_order(self, order_id: int) -> None:
        sql = "INSERT INTO orders (id, total) VALUES (%(id)s, 100)"
        await self.execute(sql, {"id": order_id})

    async def enqueue(self, job_type: str, payload: Any, **options: Any) -> EnqueueResult:
        options.setdefault("tenant", "t")
        options.setdefault("settings", self.settings)
        if self.kind in ("psycopg", "sqlalchemy"):
            return enqueue_in_sync(self.tx, default_registry, job_type, payload, **options)
        return await enqueue_in(self.tx, default_registry, job_type, payload, **options)

    async def commit(self) -> None:
        if self.kind in ("psycopg", "sqlalchemy"):
            self.tx.commit()
        else:
            await self.tx.commit()

    async def rollback(self) -> None:
        if self.kind in ("psycopg", "sqlalchemy"):
            self.tx.rollback()
        else:
            await self.tx.rollback()


@contextlib.asynccontextmanager
async def app_tx(kind: str, settings: Settings) -> AsyncIterator[AppTx]:
    """A connection (or session) of ``kind`` to the test's database, closed afterwards;
    its transaction begins with its first statement and is rolled back unless committed."""
    url = settings.database_url
    if kind == "psycopg":
        conn = psycopg.connect(url)
        try:
            yield AppTx(kind, conn, settings)
        finally:
            conn.close()
    elif kind == "psycopg_async":
        aconn = await psycopg.AsyncConnection.connect(url, prepare_threshold=0)
        try:
            yield AppTx(kind, aconn, settings)
        finally:
            await aconn.close()
    elif kind == "sqlalchemy":
        engine = create_engine(sqlalchemy_url(url))
        try:
            with OrmSession(engine) as session:
                yield AppTx(kind, session, settings)
        finally:
            engine.dispose()
    else:
        aengine = create_async_engine(sqlalchemy_url(url))
        try:
            async with AsyncSession(aengine) as asession:
                yield AppTx(kind, asession, settings)
        finally:
            await aengine.dispose()
