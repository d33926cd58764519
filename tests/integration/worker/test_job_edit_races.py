"""A pending job changed in place (jobcore.usecases.job_edits) against the worker's claim of
its message: the two are interleaved on two connections, each held at the point where the
other must wait for it. A change never reaches a running attempt: a claim that committed
first makes the edit a refusal, an edit that committed first is what the claim hands its
handler, and a message published before an edit of run_at claims nothing before it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import AsyncConn, Database, fetch_all
from jobcore.database.sql.jobs.run import JOB_CLAIM_MANY
from jobcore.database.store import job_store
from jobcore.execution.claims import ClaimedJob, ClaimRequest, claim_batch
from jobcore.execution.job_messages import message_row
from jobcore.execution.registry import default_registry
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.envelope import decode
from jobcore.kernel.errors import JobNotEditable
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.waiting import eventually
from jobcore.usecases.job_edits import JobChanges, edit_job
from tests.integration.worker.support import job_row, outbox_rows, submit

ECHO = default_registry.get("echo")


async def published(db: Database, job_id: uuid.UUID) -> ClaimRequest:
    """Take the job's message out of the outbox as a relay does once the broker confirmed
    it: the message is then in the broker, beyond the edit's reach."""
    [row] = await outbox_rows(db, job_id)
    async with db.connection() as conn:
        await conn.execute("DELETE FROM outbox WHERE id = %s", (row["id"],))
    return request_for(row)


def request_for(row: dict[str, Any]) -> ClaimRequest:
    envelope = decode(bytes(row["body"]))
    return ClaimRequest(row["message_id"], envelope.job_id, ECHO, envelope.attempt)


async def claim(db: Database, topology: Topology, request: ClaimRequest) -> ClaimedJob | None:
    async with db.connection() as conn:
        [answer] = await claim_batch(
            conn, [request], exchange=topology.jobs_exchange, worker_id="w-race"
        )
    return answer if isinstance(answer, ClaimedJob) else None


def claim_params(topology: Topology, request: ClaimRequest) -> dict[str, Any]:
    return {
        "consumer": "jobs",
        "exchange": topology.jobs_exchange,
        "worker_id": "w-race",
        "message_ids": [request.message_id],
        "job_ids": [request.job_id],
        "types": [request.job_type.name],
        "attempts": [request.attempt],
        "lease_tokens": [request.lease_token],
        "leases": [30.0],
        "published_ats": [None],
        "published_bys": [None],
    }


async def lock_waiters(db: Database) -> int:
    """Backends of this database waiting for a row lock now."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def edit(
    db: Database,
    settings: Settings,
    job_id: uuid.UUID,
    changes: JobChanges,
) -> str:
    """Edit the job as the API does, with the version it has now."""
    version = (await job_row_version(db, job_id))["version"]
    outcome = await edit_job(
        db, settings, default_registry, job_id, version=version, changes=changes, actor="test"
    )
    return outcome.version


async def job_row_version(db: Database, job_id: uuid.UUID) -> dict[str, Any]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT xmin::text AS version, status FROM jobs WHERE id = %s", (job_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def edit_uncommitted(
    conn: AsyncConn, topology: Topology, job_id: uuid.UUID, changes: JobChanges
) -> None:
    """The edit's two statements in the caller's open transaction (the use case's own, held
    before its commit)."""
    locked = await job_store.lock_for_edit(conn, {"id": job_id, "tenant": None})
    assert locked is not None
    assert locked["status"] == "pending"
    payload = None
    if changes.payload is not None:
        payload = Jsonb(ECHO.validate_payload(changes.payload).model_dump(mode="json"))
    row = await job_store.edit(
        conn,
        {
            "id": job_id,
            "version": locked["version"],
            "payload": payload,
            "priority": None,
            "run_at": changes.run_at,
            "fields": changes.fields,
            "actor": "test",
            "channel": OUTBOX_CHANNEL,
            **message_row(
                topology,
                job_id=job_id,
                type_name="echo",
                queue=locked["queue"],
                attempt=locked["attempts"] + 1,
                trace_headers={},
            ),
        },
    )
    assert row is not None


async def test_a_claim_that_committed_first_makes_the_edit_a_409_and_runs_the_old_data(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job_id = await submit(db, topology, "echo", EchoPayload(text="old"))
    request = await published(db, job_id)
    async with db.connection() as claimer, claimer.transaction():
        rows = await fetch_all(claimer, JOB_CLAIM_MANY(claim_params(topology, request)))
        assert rows[0]["payload"] == {"text": "old", "count": 1}  # claimed, not committed
        # The edit read the job pending before the claim commits: it waits for the row.
        version = (await job_row_version(db, job_id))["version"]
        editing = asyncio.create_task(
            edit_job(
                db,
                settings,
                default_registry,
                job_id,
                version=version,
                changes=JobChanges(payload={"text": "new"}),
                actor="test",
            )
        )
        await eventually(lambda: lock_waiters(db), what="the edit to wait for the claim's lock")
    with pytest.raises(JobNotEditable):
        await editing
    row = await job_row(db, job_id)
    assert (row["status"], row["payload"]["text"]) == ("running", "old")


async def test_an_edit_that_committed_first_is_what_the_waiting_claim_runs(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job_id = await submit(db, topology, "echo", EchoPayload(text="old"))
    request = await published(db, job_id)
    async with db.connection() as editor, editor.transaction():
        await edit_uncommitted(editor, topology, job_id, JobChanges(payload={"text": "new"}))
        # The claim's snapshot still has the old row; its update waits for the edit.
        claiming = asyncio.create_task(claim(db, topology, request))
        await eventually(lambda: lock_waiters(db), what="the claim to wait for the edit")
    claimed = await claiming
    assert claimed is not None
    assert claimed.raw_payload == {"text": "new", "count": 1}
    row = await job_row(db, job_id)
    assert (row["status"], row["payload"]["text"]) == ("running", "new")


async def test_a_claim_waiting_for_an_edit_of_run_at_claims_nothing_before_it(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job_id = await submit(db, topology, "echo", EchoPayload(text="old"))
    request = await published(db, job_id)
    run_at = datetime.now(UTC) + timedelta(seconds=1.5)
    async with db.connection() as editor, editor.transaction():
        await edit_uncommitted(
            editor, topology, job_id, JobChanges(run_at=run_at, payload={"text": "new"})
        )
        claiming = asyncio.create_task(claim(db, topology, request))
        await eventually(lambda: lock_waiters(db), what="the claim to wait for the edit")
    assert await claiming is None  # the message published before the edit: too early
    row = await job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("pending", 0)
    # The edit's own message, due at the new run_at, is the one that claims it.
    [superseding] = await outbox_rows(db, job_id)
    assert superseding["available_at"] == row["next_attempt_at"]
    new_request = request_for(superseding)
    assert new_request.message_id != request.message_id
    assert new_request.attempt == request.attempt
    # The relay publishes it once due (the database's clock says so), and it claims.
    await eventually(lambda: due(db, superseding["available_at"]), what="run_at")
    claimed = await claim(db, topology, new_request)
    assert claimed is not None
    assert claimed.raw_payload == {"text": "new", "count": 1}


async def due(db: Database, at: datetime) -> bool:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT statement_timestamp() >= %s AS due", (at,))
        row = await cur.fetchone()
    assert row is not None
    return bool(row["due"])


async def test_a_message_published_before_a_payload_edit_runs_the_edited_payload(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job_id = await submit(db, topology, "echo", EchoPayload(text="old"))
    request = await published(db, job_id)
    await edit(db, settings, job_id, JobChanges(payload={"text": "new"}))
    assert await outbox_rows(db, job_id) == []  # a payload alone needs no new message
    claimed = await claim(db, topology, request)
    assert claimed is not None
    assert claimed.raw_payload == {"text": "new", "count": 1}


async def test_a_message_published_before_a_later_run_at_cannot_run_the_job(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job_id = await submit(db, topology, "echo", EchoPayload(text="old"))
    request = await published(db, job_id)
    run_at = datetime.now(UTC) + timedelta(hours=1)
    await edit(db, settings, job_id, JobChanges(run_at=run_at, payload={"text": "new"}))
    assert await claim(db, topology, request) is None
    row = await job_row(db, job_id)
    assert (row["status"], row["attempts"], row["payload"]["text"]) == ("pending", 0, "new")
    [superseding] = await outbox_rows(db, job_id)
    assert superseding["available_at"] == run_at


async def test_edits_racing_claims_never_reach_a_running_attempt(
    db: Database, topology: Topology, settings: Settings
) -> None:
    """Edit and claim started together, many times: whichever commits first, the attempt
    runs the edited payload exactly when the edit was accepted."""
    for i in range(25):
        job_id = await submit(db, topology, "echo", EchoPayload(text="old"))
        request = await published(db, job_id)
        version = (await job_row_version(db, job_id))["version"]
        editing = edit_job(
            db,
            settings,
            default_registry,
            job_id,
            version=version,
            changes=JobChanges(payload={"text": f"new{i}"}),
            actor="test",
        )
        edited, claimed = await asyncio.gather(
            editing, claim(db, topology, request), return_exceptions=True
        )
        assert isinstance(claimed, ClaimedJob), claimed
        if isinstance(edited, JobNotEditable):
            assert claimed.raw_payload["text"] == "old"
        else:
            assert not isinstance(edited, BaseException), edited
            assert claimed.raw_payload["text"] == f"new{i}"
        assert (await job_row(db, job_id))["payload"] == claimed.raw_payload
