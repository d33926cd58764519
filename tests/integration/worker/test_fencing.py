"""Invariant 6: every write after the claim is fenced by the lease token.

A worker that lost its lease (the reaper handed the job to another worker, whose claim
issued a new token) must write nothing: no status, no effect, no outbox message. Each
outcome statement is run here with a stale token against a running job, then with the
current token to show the same call would have written.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest

from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.enqueue import OUTBOX_CHANNEL, enqueue, job_message_row
from jobcore.registry import default_registry
from jobcore.settings import Settings
from jobcore.sql import Query
from jobcore.sql import worker as q
from jobcore.webhooks import completion_params
from tests.support.jobtypes import EchoPayload

TAKE_OVER = Query(
    "test_take_over",
    "Make a job running under a given lease token, as another worker's claim would.",
    """
    UPDATE jobs SET status = 'running', attempts = 1, lease_token = %(token)s,
                    lease_expires_at = now() + interval '1 minute', started_at = now()
    WHERE id = %(id)s
    """,
)
SNAPSHOT = Query(
    "test_snapshot",
    "A job's status and lease, with its outbox messages and effects counted.",
    """
    SELECT status, lease_token, attempts, last_error,
           (SELECT count(*) FROM outbox WHERE job_id = %(id)s) AS messages,
           (SELECT count(*) FROM job_effects WHERE job_id = %(id)s) AS effects
    FROM jobs WHERE id = %(id)s
    """,
)


def outcome_params(
    statement: Query, job_id: uuid.UUID, token: uuid.UUID, topology: Topology, settings: Settings
) -> dict[str, Any]:
    completion = completion_params(topology, settings)
    if statement is q.SUCCEED:
        return {
            **completion,
            "ids": [job_id],
            "lease_tokens": [token],
            "results": ['{"ok": true}'],
            "result_refs": [None],
            "effects": orjson.dumps(
                [{"job_id": str(job_id), "kind": "charged", "detail": {"cents": 100}}]
            ).decode(),
        }
    message = job_message_row(
        topology,
        job_id=job_id,
        job_type=default_registry.get("echo"),
        attempt=2,
        trace_headers={},
    )
    return {
        **completion,
        **message,
        "id": job_id,
        "lease_token": token,
        "error": "boom",
        "delay": 0.0,
        "channel": OUTBOX_CHANNEL,
    }


@pytest.mark.parametrize(
    "statement", [q.SUCCEED, q.RETRY, q.FAIL, q.CANCEL_RUNNING, q.RELEASE], ids=lambda s: s.name
)
async def test_a_stale_lease_token_writes_nothing(
    statement: Query, db: Database, topology: Topology, settings: Settings
) -> None:
    async with db.unit_of_work() as uow:
        job = await enqueue(
            uow,
            topology,
            tenant="t",
            job_type=default_registry.get("echo"),
            payload=EchoPayload(text="x"),
        )
        current, stale = uuid.uuid4(), uuid.uuid4()
        await uow.execute(TAKE_OVER, {"id": job.job_id, "token": current})
        await uow.commit()

    async with db.unit_of_work() as uow:
        before = await uow.fetch_one(SNAPSHOT, {"id": job.job_id})
        lost = await uow.fetch_all(
            statement, outcome_params(statement, job.job_id, stale, topology, settings)
        )
        after = await uow.fetch_one(SNAPSHOT, {"id": job.job_id})
        await uow.commit()
    assert lost == []
    assert after == before  # same status, lease, attempts, messages and effects

    async with db.unit_of_work() as uow:
        won = await uow.fetch_all(
            statement, outcome_params(statement, job.job_id, current, topology, settings)
        )
        changed = await uow.fetch_one(SNAPSHOT, {"id": job.job_id})
        await uow.commit()
    assert len(won) == 1
    assert changed is not None
    assert changed["status"] != "running"
