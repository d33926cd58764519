"""Statements on ``audit_log``: append an entry, read entries back, prune past retention.

Nothing here updates an entry (a trigger refuses it anyway): the log is append-only.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from psycopg.types.json import Jsonb

from jobcore.database.sql import Query


class AuditLogInsertParams(TypedDict):
    actor: str
    action: str
    target_type: str
    target_id: str | None
    tenant: str | None
    outcome: str
    details: Jsonb


AUDIT_LOG_INSERT = Query[AuditLogInsertParams](
    "audit_log_insert",
    "Append one entry (in the transaction of the action it records).",
    """
    INSERT INTO jobcore.audit_log (actor, action, target_type, target_id, tenant, outcome, details)
    VALUES (%(actor)s, %(action)s, %(target_type)s, %(target_id)s, %(tenant)s, %(outcome)s,
            %(details)s)
    RETURNING id, at
    """,
)


class AuditLogListParams(TypedDict):
    since: datetime | None
    actor: str | None
    action: str | None
    tenant: str | None
    limit: int


AUDIT_LOG_LIST = Query[AuditLogListParams](
    "audit_log_list",
    "Entries newest first, optionally since a time and of one actor, action or tenant.",
    """
    SELECT id, at, actor, action, target_type, target_id, tenant, outcome, details
    FROM jobcore.audit_log
    WHERE (%(since)s::timestamptz IS NULL OR at >= %(since)s)
      AND (%(actor)s::text IS NULL OR actor = %(actor)s)
      AND (%(action)s::text IS NULL OR action = %(action)s)
      AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    ORDER BY at DESC, id DESC
    LIMIT %(limit)s
    """,
)


class AuditLogPruneCountParams(TypedDict):
    keep: float


AUDIT_LOG_PRUNE_COUNT = Query[AuditLogPruneCountParams](
    "audit_log_prune_count",
    "Count entries older than the audit retention.",
    """
    SELECT count(*) AS audit_log FROM jobcore.audit_log
    WHERE at < now() - make_interval(secs => %(keep)s)
    """,
)


class AuditLogPruneBatchParams(TypedDict):
    keep: float
    limit: int


# Entries are never updated, so a ctid found by the subquery still names its row in the
# same statement (as for the inbox, jobcore.database.sql.inbox.INBOX_PRUNE_BATCH).
AUDIT_LOG_PRUNE_BATCH = Query[AuditLogPruneBatchParams](
    "audit_log_prune_batch",
    "Delete a batch of entries older than the audit retention, oldest first.",
    """
    DELETE FROM jobcore.audit_log
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM jobcore.audit_log
        WHERE at < now() - make_interval(secs => %(keep)s)
        ORDER BY at
        LIMIT %(limit)s
    ))
    """,
)
