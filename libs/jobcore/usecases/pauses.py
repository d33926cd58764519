"""Pause and resume a queue or a job type (`jobcore queues|types pause|resume`).

A pause is a row in ``flow_pauses``, read by every claim in its own statement: relays
leave the paused rows in the outbox (the claim skips a paused queue's lane and a paused
type's rows), and a worker that receives a message of a paused queue or type parks it back
in the outbox instead of claiming its job (:meth:`jobcore.store.JobStore.claim`), so
nothing starts and nothing is burnt. Enqueueing is untouched: it still answers 202.
Resuming deletes the row and NOTIFYs the relays, which publish the waiting rows at once.
Both are admin actions, audited (:mod:`jobcore.audit`) under ``queue:<name>`` or
``type:<name>``; pausing twice (or resuming what is not paused) is done and audited with
``was_paused`` saying so.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from jobcore.audit import AuditAction, Target, audited
from jobcore.channels import OUTBOX_CHANNEL
from jobcore.db import Database
from jobcore.store import (
    PauseKind as PauseKind,  # re-exported: the CLI names a kind without jobcore.store
)
from jobcore.store import flow_pause_store

# The registry's rule for queue and job type names (jobcore.registry).
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"

_ACTIONS: dict[tuple[PauseKind, bool], AuditAction] = {
    ("queue", True): AuditAction.QUEUE_PAUSE,
    ("queue", False): AuditAction.QUEUE_RESUME,
    ("type", True): AuditAction.TYPE_PAUSE,
    ("type", False): AuditAction.TYPE_RESUME,
}


@dataclass(frozen=True, slots=True)
class PauseChange:
    kind: PauseKind
    name: str
    paused: bool
    # Whether it was paused before this action.
    was_paused: bool
    paused_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class QueueState:
    queue: str
    pending: int
    running: int
    paused: bool
    paused_at: datetime | None
    paused_by: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bad_name(kind: PauseKind, name: str) -> str | None:
    """Why ``name`` cannot be a queue or job type name (None when it can)."""
    if re.match(NAME_PATTERN, name):
        return None
    what = "queue" if kind == "queue" else "job type"
    return f"bad {what} name {name!r}: 1-63 lower-case letters, digits or '_', from a letter"


async def set_paused(
    db: Database, kind: PauseKind, name: str, *, paused: bool, actor: str
) -> PauseChange:
    """Pause (or resume) queue or job type ``name`` for every relay and worker (the
    caller checked the name with :func:`bad_name`)."""
    action = _ACTIONS[(kind, paused)]
    async with audited(db, actor=actor, action=action, target=Target(kind, name)) as work:
        if paused:
            row = await flow_pause_store.pause(
                work.uow, {"kind": kind, "name": name, "paused_by": actor}
            )
        else:
            row = await flow_pause_store.resume(
                work.uow, {"kind": kind, "name": name, "channel": OUTBOX_CHANNEL}
            )
        assert row is not None  # both statements answer one row
        work.entry.details = {"was_paused": row["was_paused"]}
        await work.commit()
    return PauseChange(kind, name, paused, row["was_paused"], row["paused_at"] if paused else None)


async def list_pauses(db: Database) -> list[dict[str, Any]]:
    """Every pause in force: kind, name, who paused it and when."""
    async with db.connection() as conn:
        return [dict(row) for row in await flow_pause_store.list_pauses(conn)]


async def list_queues(db: Database) -> list[QueueState]:
    """The queues with open jobs or a pause: their pending and running jobs, paused or not."""
    async with db.connection() as conn:
        rows = await flow_pause_store.queue_overview(conn)
    return [
        QueueState(
            r["queue"],
            int(r["pending"]),
            int(r["running"]),
            r["paused"],
            r["paused_at"],
            r["paused_by"],
        )
        for r in rows
    ]
