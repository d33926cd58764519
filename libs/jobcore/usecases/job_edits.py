"""Change a pending job in place: its run_at, priority and payload, compare-and-set on the
version of the job the caller read (``PATCH /jobs/{id}`` with ``If-Match``, ``jobcore jobs
edit``, the console's edit form).

One transaction: the job's row is locked (so the decision is made on the row as it is
now, and no claim can slip in until the commit), then refused (:class:`JobNotEditable`
when it was claimed or ended, :class:`JobVersionMismatch` when it changed since the
version read), else changed with its event and its message in one statement
(:mod:`jobcore.database.sql.jobs.edit`, where the race with the worker's claim is told in
full). A new payload is validated as an enqueue's is (the job type's model, the inline
size) and may not change what was derived from it at enqueue: its unique key and its
concurrency and rate keys (invariant 15: the limits travel with the job). Audited, with
the fields changed, never their values.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from psycopg.types.json import Jsonb

from jobcore.access.audit import AuditAction, Target, audited
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.store import JobEditParams, job_store
from jobcore.execution.job_messages import message_row, trace_headers_of
from jobcore.execution.payloads import validate_payload
from jobcore.execution.registry import Registry
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.errors import (
    InvalidField,
    JobNotEditable,
    JobNotFound,
    JobVersionMismatch,
    JobVersionRequired,
)
from jobcore.kernel.priorities import Priority
from jobcore.kernel.settings import Settings
from jobcore.kernel.states import JobStatus
from jobcore.usecases.enqueue.submit import MAX_SCHEDULE_AHEAD
from jobcore.usecases.enqueue.write_one import job_gates


@dataclass(frozen=True, slots=True)
class JobChanges:
    """What an edit changes; None: left as it is. ``payload`` is the JSON as sent."""

    run_at: datetime | None = None
    priority: Priority | None = None
    payload: Any = None

    @property
    def fields(self) -> list[str]:
        return [
            name
            for name, value in (
                ("run_at", self.run_at),
                ("priority", self.priority),
                ("payload", self.payload),
            )
            if value is not None
        ]


@dataclass(frozen=True, slots=True)
class EditOutcome:
    job_id: uuid.UUID
    # The job's version now: the next edit's If-Match.
    version: str
    fields: list[str]
    # What happened to its message: "moved" (still in the outbox), "superseded" (a new one
    # written: the published one can no longer claim it early), "kept" (a payload alone).
    message: str


def check_run_at(run_at: datetime) -> datetime:
    """An edit's run_at, checked as an enqueue's is: with a time zone, within a year."""
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidField("run_at", "needs a time zone offset", kind="timezone")
    when = run_at.astimezone(UTC)
    if when - datetime.now(UTC) > MAX_SCHEDULE_AHEAD:
        reason = f"must be within {MAX_SCHEDULE_AHEAD.days} days from now"
        raise InvalidField("run_at", reason, kind="range")
    return when


async def edit_job(
    db: Database,
    settings: Settings,
    registry: Registry,
    job_id: uuid.UUID,
    *,
    version: str | None,
    changes: JobChanges,
    actor: str,
    tenant: str | None = None,
) -> EditOutcome:
    """Change the job ``job_id`` (of ``tenant``; None: any tenant's, for operators) as
    ``changes`` say, if it is pending and still at ``version``; committed and audited."""
    fields = changes.fields
    if not fields:
        raise InvalidField(
            "payload", "name at least one of run_at, priority, payload", kind="empty"
        )
    run_at = None if changes.run_at is None else check_run_at(changes.run_at)
    topology = Topology.from_settings(settings)
    target = Target("job", str(job_id))
    async with audited(db, actor=actor, action=AuditAction.JOB_EDIT, target=target) as work:
        work.entry.details = {"fields": fields}
        if not version:
            raise JobVersionRequired()
        locked = await job_store.lock_for_edit(work.uow, {"id": job_id, "tenant": tenant})
        if locked is None:
            raise JobNotFound("no job with that id")
        work.entry.tenant = locked["tenant"]
        if locked["status"] != JobStatus.PENDING:
            raise JobNotEditable(locked["status"])
        if locked["version"] != version:
            raise JobVersionMismatch(locked["version"])
        payload = None
        if changes.payload is not None:
            payload = Jsonb(_checked_payload(registry, settings, locked, changes.payload))
        params: JobEditParams = {
            "id": job_id,
            "version": version,
            "payload": payload,
            "priority": None if changes.priority is None else int(changes.priority),
            "run_at": run_at,
            "fields": fields,
            "actor": work.entry.actor,
            "channel": OUTBOX_CHANNEL,
            **message_row(
                topology,
                job_id=job_id,
                type_name=locked["type"],
                queue=locked["queue"],
                attempt=locked["attempts"] + 1,
                trace_headers=trace_headers_of(locked),
            ),
        }
        row = await job_store.edit(work.uow, params)
        # The lock held the status and the version still.
        assert row is not None, f"job {job_id} changed under its row lock"
        message = "moved" if row["moved"] else "superseded" if row["superseded"] else "kept"
        work.entry.details = {"fields": fields, "version": row["version"], "message": message}
        await work.commit()
    return EditOutcome(job_id, row["version"], fields, message)


def _checked_payload(
    registry: Registry, settings: Settings, locked: dict[str, Any] | Any, raw: Any
) -> Any:
    """The new payload as it is stored (validated as an enqueue's is: strictly, and
    storable), refused when it is too large to keep in the row or would change a key
    derived from the payload."""
    job_type = registry.get(locked["type"])
    document = validate_payload(job_type, raw).model_dump(mode="json")
    if len(orjson.dumps(document)) > settings.inline_payload_max_bytes:
        raise InvalidField(
            "payload",
            f"larger than JOBCORE_INLINE_PAYLOAD_MAX_BYTES ({settings.inline_payload_max_bytes} "
            "bytes): a payload stored by reference cannot be changed in place",
            kind="too_large",
        )
    gates = job_gates(
        job_type, tenant=locked["tenant"], payload=document, ordering_key=locked["ordering_key"]
    )
    for key in ("concurrency_key", "rate_key"):
        if gates[key] != locked[key]:
            raise InvalidField(
                "payload",
                f"would change the job's {key.removesuffix('_key')} key, which its limits "
                "were given at enqueue; enqueue a new job instead",
                kind="immutable",
            )
    unique_field = job_type.unique_field
    if unique_field is not None and locked["unique_key"] is not None:
        before = (
            locked["payload"].get(unique_field) if isinstance(locked["payload"], dict) else None
        )
        if before != document.get(unique_field):
            raise InvalidField(
                "payload",
                "is the job's unique key and cannot change; enqueue a new job instead",
                kind="immutable",
                path=(unique_field,),
            )
    return document
