"""The worker's held connections (services.worker.connections.HeldConnections) hand out
the one given back last: a trickle of claims and outcomes runs on one backend, which
keeps appending the inbox's new rows to the page it is filling. Handed out
in turn, each of the held backends kept a half-filled page of its own, and the inbox's
heap took half again the bytes its rows need (docs/bench/measurements.md, "Held
connections")."""

from __future__ import annotations

import asyncio

from jobcore.database.gateway import Database
from services.worker.connections import HeldConnections


async def _backend(held: HeldConnections) -> int:
    async with held.connection() as conn:
        row = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
        assert row is not None
        return int(row["pid"])


async def test_statements_one_after_another_run_on_one_backend(db: Database) -> None:
    held = HeldConnections(db, 4)
    try:
        backends = [await _backend(held) for _ in range(8)]
    finally:
        await held.close()
    assert len(set(backends)) == 1, backends


async def test_statements_at_once_take_more_and_the_last_given_back_comes_first(
    db: Database,
) -> None:
    held = HeldConnections(db, 4)
    taken = [asyncio.Event(), asyncio.Event()]
    release = [asyncio.Event(), asyncio.Event()]

    async def hold(n: int) -> int:
        async with held.connection() as conn:
            row = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
            assert row is not None
            taken[n].set()
            await release[n].wait()
            return int(row["pid"])

    try:
        tasks = [asyncio.create_task(hold(n)) for n in (0, 1)]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in taken)), 10)
        release[0].set()
        first_back = await tasks[0]
        release[1].set()
        last_back = await tasks[1]
        assert first_back != last_back
        assert [await _backend(held) for _ in range(3)] == [last_back] * 3
    finally:
        await held.close()
