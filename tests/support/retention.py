"""Helpers for the retention tests: finished jobs of a given age, with what belongs to them.

Age is made, not waited for: the job's ``finished_at`` (or an inbox row's ``received_at``)
is set in the past directly in the test's database.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import default_registry
from jobcore.storage.results import LocalResultStore
from jobcore.testing.jobtypes import EchoPayload
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue

PAYLOADS: dict[str, BaseModel] = {"echo": EchoPayload(text="x"), "noop": NoopPayload()}

FINISH = """
    UPDATE jobcore.jobs
    SET status = %(status)s, attempts = 1,
        finished_at = CASE WHEN %(age)s::float8 IS NULL THEN NULL
                           ELSE now() - make_interval(secs => %(age)s) END,
        result_ref = %(result_ref)s
    WHERE id = %(id)s
"""
ADD_EFFECT = "INSERT INTO jobcore.job_effects (job_id, attempt, kind) VALUES (%s, 1, 'did')"
ADD_DELIVERY = """
    INSERT INTO jobcore.webhook_deliveries (id, job_id, tenant, url, event, status)
    VALUES (gen_random_uuid(), %s, 't', 'https://example.com/hook', 'job.succeeded', 'delivered')
"""
OWN_ROWS = {
    "jobs": "SELECT count(*) AS n FROM jobcore.jobs WHERE id = %s",
    "job_effects": "SELECT count(*) AS n FROM jobcore.job_effects WHERE job_id = %s",
    "webhook_deliveries": "SELECT count(*) AS n FROM jobcore.webhook_deliveries WHERE job_id = %s",
    "outbox": "SELECT count(*) AS n FROM jobcore.outbox WHERE job_id = %s",
}


@dataclass(frozen=True)
class Made:
    """A job the test made, and where its result file is (if it has one)."""

    id: uuid.UUID
    result_ref: str | None


async def make_job(
    db: Database,
    topology: Topology,
    *,
    status: str = "succeeded",
    job_type: str = "noop",
    age: timedelta | None = timedelta(days=8),
    store: LocalResultStore | None = None,
    effect: bool = True,
    delivery: bool = True,
    quarantined: bool = False,
) -> Made:
    """A job in ``status`` that finished ``age`` ago, with an effect, a webhook delivery,
    a result file (given a ``store``) and a quarantined outbox row (if asked)."""
    async with db.unit_of_work() as uow:
        job_id = (
            await enqueue(
                uow,
                topology,
                EnqueueRequest(
                    tenant="t", job_type=default_registry.get(job_type), payload=PAYLOADS[job_type]
                ),
            )
        ).job_id
        await uow.commit()
    result_ref = store.put(job_id, b"a,b\n1,2\n", suffix="csv") if store else None
    async with db.connection() as conn:
        if quarantined:
            await conn.execute(
                "UPDATE jobcore.outbox SET quarantined_at = now(), attempts = 10 WHERE job_id = %s",
                (job_id,),
            )
        else:
            await conn.execute("DELETE FROM jobcore.outbox WHERE job_id = %s", (job_id,))
        await conn.execute(
            FINISH,
            {
                "id": job_id,
                "status": status,
                "age": age.total_seconds() if age is not None else None,
                "result_ref": result_ref,
            },
        )
        if effect:
            await conn.execute(ADD_EFFECT, (job_id,))
        if delivery:
            await conn.execute(ADD_DELIVERY, (job_id,))
    return Made(job_id, result_ref)


async def own_rows(db: Database, job_id: uuid.UUID) -> dict[str, int]:
    """How many rows the job has in each table that is pruned with it."""
    counts: dict[str, int] = {}
    async with db.connection() as conn:
        for table, statement in OWN_ROWS.items():
            cur = await conn.execute(statement, (job_id,))
            row = await cur.fetchone()
            counts[table] = int(row["n"]) if row else 0
    return counts


async def table_counts(db: Database) -> dict[str, int]:
    async with db.connection() as conn:
        counts = {}
        for table in ("jobs", "job_effects", "webhook_deliveries", "outbox", "inbox"):
            cur = await conn.execute(f"SELECT count(*) AS n FROM {table}")
            row = await cur.fetchone()
            counts[table] = int(row["n"]) if row else 0
    return counts


async def inbox_row(db: Database, *, age: timedelta) -> uuid.UUID:
    """An inbox row received ``age`` ago."""
    message_id = uuid.uuid4()
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO jobcore.inbox (consumer, message_id, received_at) "
            "VALUES ('jobs', %s, now() - make_interval(secs => %s))",
            (message_id, age.total_seconds()),
        )
    return message_id


async def audit_entry(db: Database, *, age: timedelta) -> None:
    """An audit entry written ``age`` ago."""
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO jobcore.audit_log (at, actor, action, target_type, outcome) "
            "VALUES (now() - make_interval(secs => %s), 'tests', 'key.create', 'api_key', "
            "'succeeded')",
            (age.total_seconds(),),
        )


def age_file(path: os.PathLike[str] | str, age: timedelta) -> None:
    """Make a file look unchanged for ``age``."""
    then = time.time() - age.total_seconds()
    os.utime(path, (then, then))
