"""Unique jobs: at most one pending or running job per (tenant, type, unique key), the key
given as ``unique_key`` or taken from the payload field the job type names; a duplicate
answers 409 ``unique-job-exists`` with the live job; the key is free again once its job
ends. Apart from Idempotency-Key, which replays a request."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

import httpx
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, Session, execute, fetch_one
from jobcore.database.sql import Query
from jobcore.database.sql.jobs.enqueue import JOB_INSERT, JOB_INSERT_MANY
from jobcore.execution.registry import default_registry
from jobcore.kernel.errors import UniqueJobExists
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload, SyncPayload
from jobcore.usecases import jobs as job_usecases
from jobcore.usecases import keys as key_usecases
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue_many
from jobcore.usecases.enqueue.submit import enqueue as enqueue_job
from jobcore.usecases.enqueue.write_many import ItemStatus
from tests.integration.api.conftest import TENANT
from tests.integration.api.support import (
    assert_problem,
    counts,
    enqueue,
    finish_job,
    job_row,
    start_job,
)

LIVE_WITH_KEY = Query(
    "test_live_with_key",
    "How many pending or running jobs hold a unique key.",
    """
    SELECT count(*) AS n FROM jobs
    WHERE unique_key = %(key)s AND status IN ('pending', 'running')
    """,
)


@pytest.fixture
async def admin_auth(db: Database) -> dict[str, str]:
    created = await key_usecases.create_key(
        db, "ops", "operators", scopes=[Scope.ADMIN], actor="tests"
    )
    return {"Authorization": f"Bearer {created.key}"}


async def live_with_key(db: Database, key: str) -> int:
    async with db.connection() as conn:
        row = await fetch_one(conn, LIVE_WITH_KEY({"key": key}))
    assert row is not None
    return int(row["n"])


def unique(key: str) -> dict[str, dict[str, str]]:
    return {"params": {"unique_key": key}}


async def test_a_second_job_with_the_same_unique_key_is_409_naming_the_live_one(
    api_client: httpx.AsyncClient, auth: dict[str, str], other_auth: dict[str, str], db: Database
) -> None:
    first = await enqueue(api_client, auth, **unique("report-7"))
    assert first.status_code == 202, first.text
    job_id = first.json()["job_id"]

    second = await enqueue(api_client, auth, payload={"text": "another"}, **unique("report-7"))
    body = assert_problem(second, 409, "unique-job-exists")
    assert (body["job_id"], body["job_status"]) == (job_id, "pending")
    # Another key, another job type, another tenant: no conflict.
    assert (await enqueue(api_client, auth, **unique("report-8"))).status_code == 202
    other_type = await enqueue(api_client, auth, "sync_account", {}, **unique("report-7"))
    assert other_type.status_code == 202, other_type.text
    assert (await enqueue(api_client, other_auth, **unique("report-7"))).status_code == 202
    assert (await counts(db))["jobs"] == 4
    view = (await api_client.get(f"/jobs/{job_id}", headers=auth)).json()
    assert view["unique_key"] == "report-7"


async def test_the_job_types_unique_field_is_the_key_unless_the_request_names_one(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    first = await enqueue(api_client, auth, "sync_account", {"account": "acct-1", "note": "a"})
    assert first.status_code == 202, first.text
    assert (await job_row(db, first.json()["job_id"]))["unique_key"] == "acct-1"
    again = await enqueue(api_client, auth, "sync_account", {"account": "acct-1", "note": "b"})
    assert assert_problem(again, 409, "unique-job-exists")["job_id"] == first.json()["job_id"]
    # Another account, no account (no key), or a key of the request's own: new jobs.
    for payload, extra in (
        ({"account": "acct-2"}, {}),
        ({}, {}),
        ({}, {}),
        ({"account": "acct-1"}, unique("explicit")),
    ):
        answer = await enqueue(api_client, auth, "sync_account", payload, **extra)
        assert answer.status_code == 202, (payload, answer.text)
    assert await live_with_key(db, "explicit") == 1


async def test_a_key_longer_than_255_characters_is_refused_before_anything_is_written(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    long_field = await enqueue(api_client, auth, "sync_account", {"account": "a" * 256})
    body = assert_problem(long_field, 422, "invalid-payload")
    assert body["errors"][0]["loc"] == ["body", "account"]
    long_param = await enqueue(api_client, auth, **unique("k" * 256))
    assert_problem(long_param, 422, "invalid-request")
    assert (await counts(db))["jobs"] == 0


async def test_fifty_parallel_requests_with_one_unique_key_make_exactly_one_job(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    answers = await asyncio.gather(
        *(
            enqueue(api_client, auth, payload={"text": f"n{n}"}, **unique("burst"))
            for n in range(50)
        )
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [202] + [409] * 49, [a.text for a in answers if a.status_code != 409]
    created = next(a for a in answers if a.status_code == 202).json()["job_id"]
    assert {a.json()["job_id"] for a in answers if a.status_code == 409} == {created}
    assert await counts(db) == {"jobs": 1, "outbox": 1, "jobs_without_message": 0}


async def test_idempotency_replays_while_the_unique_rule_refuses_other_requests(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    def keyed(key: str) -> dict[str, object]:
        return {"headers": {"Idempotency-Key": key}, **unique("nightly")}

    first = await enqueue(api_client, auth, **keyed("k1"))
    assert first.status_code == 202, first.text
    job_id = first.json()["job_id"]
    # The same idempotency key and request: its job, replayed (not a conflict).
    replay = await enqueue(api_client, auth, **keyed("k1"))
    assert (replay.status_code, replay.json()["job_id"]) == (202, job_id)
    assert replay.headers["Idempotent-Replayed"] == "true"
    # Another idempotency key with the same unique key: the unique rule.
    other = await enqueue(api_client, auth, **keyed("k2"))
    assert assert_problem(other, 409, "unique-job-exists")["job_id"] == job_id

    # Once the first job has ended, the key is free: k2 makes a new job.
    await start_job(db, job_id)
    await finish_job(db, job_id, "succeeded", result={"ok": True})
    second = await enqueue(api_client, auth, **keyed("k2"))
    assert second.status_code == 202, second.text
    assert second.json()["job_id"] != job_id
    assert "Idempotent-Replayed" not in second.headers
    # k1 still answers its own (finished) job; k2 its new one.
    assert (await enqueue(api_client, auth, **keyed("k1"))).json()["job_id"] == job_id
    assert (await enqueue(api_client, auth, **keyed("k2"))).json() == second.json()
    # The unique key is part of the request an idempotency key stands for.
    changed = await enqueue(api_client, auth, headers={"Idempotency-Key": "k1"}, **unique("other"))
    assert_problem(changed, 422, "idempotency-key-reused")
    assert await live_with_key(db, "nightly") == 1


@pytest.mark.parametrize("ending", ["succeeded", "failed", "cancelled"])
async def test_a_job_that_ends_frees_its_key(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database, ending: str
) -> None:
    first = (await enqueue(api_client, auth, **unique("slot"))).json()["job_id"]
    await start_job(db, first)
    # Running still holds the key.
    assert (await enqueue(api_client, auth, **unique("slot"))).status_code == 409
    await finish_job(db, first, ending)
    assert (await enqueue(api_client, auth, **unique("slot"))).status_code == 202


async def test_cancelling_a_pending_job_frees_its_key(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    first = (await enqueue(api_client, auth, **unique("slot"))).json()["job_id"]
    cancelled = await api_client.post(f"/jobs/{first}/cancel", headers=auth)
    assert cancelled.json()["status"] == "cancelled"
    assert (await enqueue(api_client, auth, **unique("slot"))).status_code == 202


async def test_an_operators_retry_keeps_the_key_and_is_refused_while_another_holds_it(
    db: Database, settings: Settings, topology: Topology
) -> None:
    echo = default_registry.get("echo")
    async with db.session() as session:
        failed = await enqueue_job(
            session,
            topology,
            EnqueueRequest(
                tenant=TENANT, job_type=echo, payload=EchoPayload(text="x"), unique_key="retryable"
            ),
        )
    await start_job(db, failed.job_id)
    await finish_job(db, failed.job_id, "failed", last_error="boom")
    retried = await job_usecases.retry_job(
        db, settings, default_registry, failed.job_id, actor="tests"
    )
    assert (await job_row(db, retried.job_id))["unique_key"] == "retryable"
    await start_job(db, retried.job_id)
    await finish_job(db, retried.job_id, "failed", last_error="boom")
    async with db.session() as session:
        holder = await enqueue_job(
            session,
            topology,
            EnqueueRequest(
                tenant=TENANT,
                job_type=default_registry.get("sync_account"),
                payload=SyncPayload(),
                unique_key="retryable",
            ),
        )
        live = await enqueue_job(
            session,
            topology,
            EnqueueRequest(
                tenant=TENANT, job_type=echo, payload=EchoPayload(text="y"), unique_key="retryable"
            ),
        )
    assert holder.job_id != live.job_id
    with pytest.raises(UniqueJobExists) as refused:
        await job_usecases.retry_job(db, settings, default_registry, failed.job_id, actor="tests")
    assert refused.value.job_id == live.job_id
    assert await live_with_key(db, "retryable") == 2  # one echo, one sync_account


async def test_the_admin_retry_route_answers_409_for_a_held_key(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database, admin_auth: dict[str, str]
) -> None:
    first = (await enqueue(api_client, auth, **unique("r"))).json()["job_id"]
    await start_job(db, first)
    await finish_job(db, first, "failed", last_error="boom")
    holder = (await enqueue(api_client, auth, **unique("r"))).json()["job_id"]
    refused = await api_client.post(f"/admin/jobs/{first}/retry", headers=admin_auth)
    assert assert_problem(refused, 409, "unique-job-exists")["job_id"] == holder


END_JOB = Query(
    "test_end_job",
    "End a job, as a worker's outcome would.",
    "UPDATE jobs SET status = 'cancelled', finished_at = now() WHERE id = %(id)s",
)


class EndsHolderAfterInsert:
    """A connection that, right after the first run of ``insert``, ends ``holder`` on
    another connection: the key the insert found taken is free before it is read."""

    def __init__(self, conn: Any, db: Database, insert: Query, holder: uuid.UUID) -> None:
        self.conn, self.db, self.insert, self.holder = conn, db, insert, holder
        self.inserts = 0

    async def execute(self, sql: str, params: Any) -> Any:
        cursor = await self.conn.execute(sql, params)
        if sql == self.insert.sql:
            self.inserts += 1
            if self.inserts == 1:
                async with self.db.connection() as other:
                    await execute(other, END_JOB({"id": self.holder}))
        return cursor


@pytest.mark.parametrize("many", [False, True], ids=["single", "batch"])
async def test_a_key_freed_between_the_insert_and_its_read_is_taken_on_the_next_try(
    db: Database, topology: Topology, many: bool
) -> None:
    echo = default_registry.get("echo")
    async with db.session() as session:
        holder = await enqueue_job(
            session,
            topology,
            EnqueueRequest(
                tenant=TENANT, job_type=echo, payload=EchoPayload(text="x"), unique_key="k"
            ),
        )
    async with db.connection() as conn:
        racing = EndsHolderAfterInsert(
            conn, db, JOB_INSERT_MANY if many else JOB_INSERT, holder.job_id
        )
        if many:
            item = EnqueueRequest(
                tenant=TENANT, job_type=echo, payload=EchoPayload(text="y"), unique_key="k"
            )
            result = await enqueue_many(cast(Session, racing), topology, [item])
            [outcome] = result.outcomes
            created = outcome.job_id if outcome.status is ItemStatus.CREATED else None
        else:
            created = (
                await enqueue_job(
                    cast(Session, racing),
                    topology,
                    EnqueueRequest(
                        tenant=TENANT, job_type=echo, payload=EchoPayload(text="y"), unique_key="k"
                    ),
                )
            ).job_id
    assert racing.inserts == 2
    assert created is not None
    assert created != holder.job_id
    assert await live_with_key(db, "k") == 1
