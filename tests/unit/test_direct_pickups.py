"""Which outbox rows a worker takes itself (jobcore.execution.claims.pickups): only job
messages of the types it runs, each message once; anything else is left in the outbox for
the relays (and the consumer that dead-letters what it cannot run)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from jobcore.execution.claims import pickups
from jobcore.execution.registry import default_registry


def row(outbox_id: int, *, job_id: uuid.UUID | None = None, **body: Any) -> dict[str, Any]:
    job = job_id or uuid.uuid4()
    envelope = {"v": 1, "job_id": str(job), "attempt": 1, "type": "echo", **body}
    return {
        "id": outbox_id,
        "message_id": job,
        "job_id": job,
        "message_type": envelope["type"],
        "body": orjson.dumps(envelope),
    }


def test_a_job_message_becomes_a_claim_of_its_job_and_attempt() -> None:
    good = row(1, attempt=2)
    [taken] = pickups([good], default_registry)
    assert taken.outbox_id == 1
    request = taken.request
    assert (request.message_id, request.job_id, request.attempt) == (
        good["message_id"],
        good["job_id"],
        2,
    )
    assert request.job_type.name == "echo"
    assert request.published_at is None  # nothing published it


def test_rows_it_cannot_run_or_trust_are_left_in_the_outbox() -> None:
    not_json = {**row(1), "body": b"not json"}
    unknown = row(2, type="no_such_type")
    other_job = {**row(3), "job_id": uuid.uuid4()}
    other_type = {**row(4), "message_type": "batch_done"}
    good = row(5)
    again = {**row(6), "message_id": good["message_id"]}
    taken = pickups([not_json, unknown, other_job, other_type, good, again], default_registry)
    assert [t.outbox_id for t in taken] == [5]
