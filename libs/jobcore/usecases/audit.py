"""Reading the audit log (`jobcore audit`): who did which admin action, newest first.
Writing it is :mod:`jobcore.audit`, inside each action's own use case."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobcore.audit import AuditAction
from jobcore.db import Database
from jobcore.store import audit_log_store


@dataclass(frozen=True, slots=True)
class AuditFilter:
    since: datetime | None = None
    actor: str | None = None
    action: AuditAction | None = None
    tenant: str | None = None


async def list_audit_entries(
    db: Database, where: AuditFilter, *, limit: int
) -> list[dict[str, Any]]:
    """Entries matching every filter given, newest first."""
    async with db.session() as session:
        rows = await audit_log_store.list_entries(
            session,
            {
                "since": where.since,
                "actor": where.actor,
                "action": where.action.value if where.action else None,
                "tenant": where.tenant,
                "limit": limit,
            },
        )
    return [dict(row) for row in rows]
