"""The relay's `published` event, written by its delete of the confirmed rows: not for a
live job's first publish, which the worker's claim keeps on the job row (migration 0041);
for a job that already holds one, without locking it; for a job that has ended
(cancelled while its message waited) with its row locked against the pruner; and for a
job that is gone not at all."""

from __future__ import annotations

import uuid

from jobcore.database.gateway import Database, fetch_one
from jobcore.database.sql.outbox import OUTBOX_DELETE_PUBLISHED
from jobcore.execution.registry import load_job_modules
from jobcore.testing.draining import InlineWorker


async def events(db: Database, job_id: uuid.UUID) -> list[str]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT kind FROM job_events WHERE job_id = %s ORDER BY id", (job_id,)
        )
        return [row["kind"] for row in await cur.fetchall()]


async def test_published_is_written_unless_the_job_row_keeps_it_and_skipped_for_gone_ones(
    db: Database,
) -> None:
    worker = InlineWorker(db, registry=load_job_modules(("jobcore.examples.jobtypes",)))
    live, holding, ended, gone = [await worker.enqueue("noop", {}) for _ in range(4)]
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'cancelled', finished_at = now() WHERE id = %s", (ended,)
        )
        # A job whose row holds an earlier publish (its message published again).
        await conn.execute(
            "UPDATE jobs SET published_at = now() - interval '1 minute', published_by = 'r-0'"
            " WHERE id = %s",
            (holding,),
        )
        await conn.execute("DELETE FROM jobs WHERE id = %s", (gone,))
        cur = await conn.execute(
            "SELECT id FROM outbox WHERE job_id = ANY(%s)", ([live, holding, ended, gone],)
        )
        ids = [row["id"] for row in await cur.fetchall()]
    assert len(ids) == 4

    async with db.unit_of_work() as uow:
        row = await fetch_one(uow, OUTBOX_DELETE_PUBLISHED({"ids": ids, "relay": "r-1"}))
        await uow.commit()

    assert row is not None
    assert row["deleted"] == 4
    assert await events(db, live) == []  # its claim keeps it on the job row
    assert await events(db, holding) == ["published"]
    assert await events(db, ended) == ["published"]
    assert await events(db, gone) == []  # no foreign key to refuse it: the join does
