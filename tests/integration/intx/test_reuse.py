"""What an enqueue in a transaction builds once rather than per call: the settings read
from the environment, and the topology of a settings object."""

from __future__ import annotations

import psycopg
import pytest

from jobcore import enqueue_in
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.usecases.enqueue import in_transaction as module


async def jobs_of_t(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM jobs WHERE tenant = 't'")
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_settings_and_topology_are_not_built_on_every_enqueue(
    settings: Settings, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[Settings] = []
    built: list[Settings] = []
    real_from_settings = Topology.from_settings

    def counting_settings() -> Settings:
        parsed.append(Settings())
        return parsed[-1]

    def counting_from_settings(given: Settings) -> Topology:
        built.append(given)
        return real_from_settings(given)

    monkeypatch.setattr(module, "Settings", counting_settings)
    monkeypatch.setattr(Topology, "from_settings", staticmethod(counting_from_settings))
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        for n in range(3):  # from the environment
            await enqueue_in(conn, default_registry, "echo", {"text": f"e{n}"}, tenant="t")
        for n in range(3):  # a deployment's settings object, the same each call
            await enqueue_in(
                conn, default_registry, "echo", {"text": f"s{n}"}, tenant="t", settings=settings
            )
        await conn.commit()

    assert await jobs_of_t(db) == 6
    # At most once each: an earlier test in this process may have built them already.
    assert len(parsed) <= 1
    assert sum(1 for given in built if given is settings) <= 1
    assert len(built) <= 2
