"""An enqueue in a transaction above READ COMMITTED: its tenant's cap is read in the
caller's snapshot, taken before the others' enqueues committed, so it is refused unless
the caller asks for no quotas (docs/how-to/enqueue-in-transaction.md)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import IsolationLevel

from jobcore import enqueue_in, enqueue_in_sync
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.quotas import UNLIMITED
from jobcore.kernel.settings import Settings
from jobcore.usecases.enqueue.in_transaction import UnsupportedIsolation


def capped(settings: Settings) -> Settings:
    """A deployment whose tenants may have one unfinished job."""
    return settings.model_copy(update={"quota_max_unfinished": 1})


async def jobs_of_t(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM jobs WHERE tenant = 't'")
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def enqueue_committed(settings: Settings, text: str) -> None:
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        await enqueue_in(
            conn, default_registry, "echo", {"text": text}, tenant="t", settings=settings
        )
        await conn.commit()


@pytest.mark.parametrize(
    "level", [IsolationLevel.REPEATABLE_READ, IsolationLevel.SERIALIZABLE], ids=str
)
async def test_above_read_committed_the_cap_is_not_read_in_an_old_snapshot(
    settings: Settings, db: Database, level: IsolationLevel
) -> None:
    config = capped(settings)
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        await conn.set_isolation_level(level)
        await conn.execute("SELECT 1")  # the transaction's snapshot is taken here
        # Meanwhile another transaction fills the tenant's one place.
        await enqueue_committed(config, "first")
        assert await jobs_of_t(db) == 1

        with pytest.raises(UnsupportedIsolation) as refused:
            await enqueue_in(
                conn, default_registry, "echo", {"text": "over"}, tenant="t", settings=config
            )
        assert "read committed" in str(refused.value)
        assert level.name.replace("_", " ").lower() in str(refused.value)
        # Refused before any write: the caller's transaction goes on.
        await conn.execute("SELECT 1")

        # Without quotas there is no cap to read: allowed at any level.
        await enqueue_in(
            conn,
            default_registry,
            "echo",
            {"text": "unlimited"},
            tenant="t",
            settings=config,
            quotas=UNLIMITED,
        )
        await conn.commit()
    assert await jobs_of_t(db) == 2


async def test_the_sync_variant_refuses_repeatable_read_too(
    settings: Settings, db: Database
) -> None:
    with psycopg.Connection.connect(settings.database_url) as conn:
        conn.isolation_level = IsolationLevel.REPEATABLE_READ
        with pytest.raises(UnsupportedIsolation):
            enqueue_in_sync(
                conn, default_registry, "echo", {"text": "a"}, tenant="t", settings=settings
            )
        conn.rollback()
    assert await jobs_of_t(db) == 0


async def test_read_committed_set_inside_the_transaction_is_what_counts(
    settings: Settings, db: Database
) -> None:
    # The server's answer decides, not the driver's setting: a SET TRANSACTION the caller
    # ran (here READ COMMITTED on a connection whose default is REPEATABLE READ) counts.
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        await conn.execute("SET default_transaction_isolation = 'repeatable read'")
        await conn.commit()
        await conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        await enqueue_in(
            conn, default_registry, "echo", {"text": "a"}, tenant="t", settings=capped(settings)
        )
        await conn.commit()
    assert await jobs_of_t(db) == 1
