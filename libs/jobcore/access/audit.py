"""The audit log: who did which admin action, when, to what, and whether it was done.

Every admin use case (:mod:`jobcore.usecases`) runs inside :func:`audited`, which gives it
a unit of work and writes its entry in that same transaction when the use case commits:
an action that rolls back leaves no entry, and one that commits always has one. An
action the system refuses (unknown id, wrong state, a pruner already running) rolls back
and is then recorded as ``refused`` in a short transaction of its own, so repeated
attempts at something not allowed are visible too. An action that failed because the
database or the broker could not be reached is not recorded: nothing happened, and the
database may be the thing that is missing.

Actions that are not one transaction (a DLQ replay on the broker, a prune or a
republish in many batches) record what was done once it is done (:func:`record_done`).

An entry names its actor (``cli:<user>@<host>``, ``key:<key id>``), never a secret, a
key, a payload or a full URL: ``details`` hold ids, counts and states only.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import orjson
from psycopg.types.json import Jsonb

from jobcore.database.gateway import Database, UnitOfWork
from jobcore.database.store import audit_log_store
from jobcore.kernel.errors import (
    BrokerUnavailable,
    DatabaseUnavailable,
    JobcoreError,
    ServiceStateError,
)
from jobcore.kernel.settings import MAX_ACTOR_LENGTH

log = logging.getLogger(__name__)

# A programming error, caught before the entry is written: such a detail is a secret, a
# key, a payload or a URL that may carry a token (webhook URLs often do).
FORBIDDEN_DETAILS = frozenset(
    {"secret", "key", "key_hash", "password", "token", "payload", "body", "url"}
)
# Failures that are not a refusal: nothing was decided, and the database may be down.
NOT_REFUSALS = (DatabaseUnavailable, BrokerUnavailable, ServiceStateError)


class AuditAction(StrEnum):
    JOB_CANCEL = "job.cancel"
    JOB_RETRY = "job.retry"
    JOB_UNBLOCK = "job.unblock"
    JOB_EDIT = "job.edit"
    BATCH_CLOSE = "batch.close"
    BATCH_CANCEL = "batch.cancel"
    WORKFLOW_CANCEL = "workflow.cancel"
    WORKFLOW_RETRY = "workflow.retry"
    JOBS_REPUBLISH_STALE = "jobs.republish_stale"
    OUTBOX_REQUEUE = "outbox.requeue"
    OUTBOX_DISCARD = "outbox.discard"
    DLQ_REPLAY = "dlq.replay"
    DLQ_REPLAY_JOB = "dlq.replay_job"
    KEY_CREATE = "key.create"
    KEY_REVOKE = "key.revoke"
    KEY_ROTATE = "key.rotate"
    # Names of actions on a secret, not secrets (ruff's S105 sees the word).
    WEBHOOK_SECRET_REVEAL = "webhook_secret.reveal"  # noqa: S105
    WEBHOOK_SECRET_ROTATE = "webhook_secret.rotate"  # noqa: S105
    WEBHOOK_ENDPOINT_SET = "webhook_endpoint.set"
    WEBHOOK_ENDPOINT_REMOVE = "webhook_endpoint.remove"
    WEBHOOK_REDELIVER = "webhook.redeliver"
    PRUNE = "prune"
    SCHEDULE_PAUSE = "schedule.pause"
    SCHEDULE_RESUME = "schedule.resume"
    SCHEDULE_TRIGGER = "schedule.trigger"
    QUEUE_PAUSE = "queue.pause"
    QUEUE_RESUME = "queue.resume"
    TYPE_PAUSE = "type.pause"
    TYPE_RESUME = "type.resume"


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    REFUSED = "refused"


class InvalidActor(JobcoreError):
    """An actor is 1 to 200 printable characters."""


@dataclass(frozen=True, slots=True)
class Target:
    """What an action was done to: a kind of thing and its id (None: no single row)."""

    type: str
    id: str | None = None


def cli_actor() -> str:
    """The default actor of a command: the operating-system user and the host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (a bare container)
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def key_actor(key_id: uuid.UUID) -> str:
    """The actor of an HTTP admin request: the API key that authenticated it."""
    return f"key:{key_id}"


def check_actor(actor: str) -> str:
    if not 0 < len(actor) <= MAX_ACTOR_LENGTH or not actor.isprintable():
        raise InvalidActor(f"an actor is 1 to {MAX_ACTOR_LENGTH} printable characters")
    return actor


def url_fingerprint(url: str) -> dict[str, str]:
    """A URL as the log may keep it: its origin and a hash of the whole, never the path or
    query, where webhook URLs carry their tokens (whoever knows a URL can check it)."""
    parts = urlsplit(url)
    return {
        "url_origin": f"{parts.scheme}://{parts.hostname or ''}"
        + (f":{parts.port}" if parts.port else ""),
        "url_sha256": hashlib.sha256(url.encode()).hexdigest()[:16],
    }


def _details_json(details: Mapping[str, Any]) -> Jsonb:
    forbidden = FORBIDDEN_DETAILS.intersection(details)
    if forbidden:
        raise ValueError(f"audit details must not carry {sorted(forbidden)}")
    return Jsonb(dict(details), dumps=lambda value: orjson.dumps(value, default=str).decode())


@dataclass(slots=True)
class Entry:
    """One audit entry: who did what to what. ``tenant`` and ``details`` are filled in as
    the action learns them."""

    actor: str
    action: AuditAction
    target: Target
    tenant: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


async def record(uow: UnitOfWork, entry: Entry, outcome: Outcome = Outcome.SUCCEEDED) -> None:
    """Append ``entry`` in the caller's transaction (it commits or rolls back with it)."""
    await audit_log_store.insert(
        uow,
        {
            "actor": check_actor(entry.actor),
            "action": entry.action.value,
            "target_type": entry.target.type,
            "target_id": entry.target.id,
            "tenant": entry.tenant,
            "outcome": outcome.value,
            "details": _details_json(entry.details),
        },
    )


async def record_done(db: Database, entry: Entry) -> None:
    """Record an action that is not one transaction (on the broker, or in many batches)
    once it is done, in a transaction of its own."""
    async with db.unit_of_work() as uow:
        await record(uow, entry)
        await uow.commit()


@dataclass(slots=True)
class AuditedWork:
    """An admin action's unit of work; :meth:`commit` writes its entry, then commits."""

    uow: UnitOfWork
    entry: Entry
    committed: bool = False

    async def commit(self) -> None:
        await record(self.uow, self.entry)
        await self.uow.commit()
        self.committed = True


@contextlib.asynccontextmanager
async def audited(
    db: Database, *, actor: str, action: AuditAction, target: Target
) -> AsyncIterator[AuditedWork]:
    """A unit of work for one admin action, whose entry is written in it on
    :meth:`AuditedWork.commit`. A :class:`JobcoreError` raised inside (the action was
    refused) rolls it back, then records the refusal; it is raised again."""
    entry = Entry(check_actor(actor), action, target)
    work: AuditedWork | None = None
    try:
        async with db.unit_of_work() as uow:
            work = AuditedWork(uow, entry)
            yield work
    except NOT_REFUSALS:
        raise
    except JobcoreError as exc:
        if work is None or not work.committed:  # a failure after the commit is no refusal
            await record_refused(db, entry, exc)
        raise


async def record_refused(db: Database, entry: Entry, error: JobcoreError) -> None:
    """Record, in a transaction of its own, that ``entry``'s action was refused (nothing
    changed). Best effort: the refusal itself is what the caller must hear."""
    # The error's class, not its message: messages echo what the caller typed.
    entry.details = {**entry.details, "refused": type(error).__name__}
    try:
        async with db.unit_of_work() as uow:
            await record(uow, entry, Outcome.REFUSED)
            await uow.commit()
    except JobcoreError as exc:
        # The refusal is what the caller must hear; nothing changed to be audited.
        log.warning(
            "could not record a refused admin action",
            extra={"action": entry.action.value, "error": str(exc)},
        )
