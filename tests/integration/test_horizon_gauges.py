"""The backlog gauges see a pinned xmin horizon on jobcore's database: its age grows while
a transaction holds it, and dead rows of a hot table stay counted, then it drops to the
age of nothing once the transaction ends.

A pin is one connection that took an XID (``BEGIN; SELECT txid_current()``) and stays
idle in its transaction, as a forgotten psql session or a long report does."""

from __future__ import annotations

import psycopg
from prometheus_client import CollectorRegistry

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from jobcore.usecases.backlog import BacklogGauges


def gauges(db: Database, settings: Settings) -> tuple[CollectorRegistry, BacklogGauges]:
    registry = CollectorRegistry()
    backlog = BacklogGauges(
        registry,
        db,
        Topology.from_settings(settings),
        ["default"],
        lambda: None,
        cache_seconds=0,
    )
    return registry, backlog


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"{name} {labels} not exposed"
    return value


async def test_the_horizon_age_grows_while_a_transaction_pins_it(
    db: Database, settings: Settings
) -> None:
    registry, backlog = gauges(db, settings)
    await backlog.refresh()
    assert sample(registry, "jobcore_database_xmin_horizon_age_seconds") == 0.0

    async with await psycopg.AsyncConnection.connect(settings.database_url) as pin:
        await pin.execute("SELECT txid_current()")  # an XID, held while idle in transaction
        await backlog.refresh()
        first = sample(registry, "jobcore_database_xmin_horizon_age_seconds")
        assert first > 0.0

        # Rows that die after the pin began cannot be removed: counted as dead.
        async with await psycopg.AsyncConnection.connect(
            settings.database_url, autocommit=True
        ) as conn:
            for _ in range(3):  # three transactions more: the horizon's age in XIDs
                await conn.execute(
                    "INSERT INTO tenant_usage (tenant) VALUES ('pinned')"
                    " ON CONFLICT (tenant) DO UPDATE SET unfinished = tenant_usage.unfinished"
                )
            await conn.execute("VACUUM tenant_usage")

        async def grown() -> bool:
            await backlog.refresh()
            return (
                sample(registry, "jobcore_database_xmin_horizon_age_seconds") > first
                and sample(registry, "jobcore_database_xmin_horizon_age_transactions") >= 3
                and sample(registry, "jobcore_table_dead_tuples", table="tenant_usage") >= 2
            )

        await eventually(grown, timeout=20, interval=0.1, what="the pinned horizon's gauges")
        assert sample(registry, "jobcore_table_live_tuples", table="tenant_usage") >= 1
        await pin.rollback()

    async def released() -> bool:
        await backlog.refresh()
        return sample(registry, "jobcore_database_xmin_horizon_age_seconds") == 0.0

    await eventually(released, timeout=20, interval=0.1, what="the horizon to be released")
