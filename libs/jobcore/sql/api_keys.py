"""Statements on ``api_keys``: only hashes are stored, and a revoked key stops at once."""

from __future__ import annotations

import uuid
from typing import TypedDict

from jobcore.sql import Query

# The per-request lookup: the unique index on key_hash makes it one index probe.
# What makes a key usable, in one place: the enqueue statement looks keys up by itself
# (jobcore.sql.jobs) and must refuse exactly the keys every other route refuses.
ACTIVE_KEY = "SELECT tenant FROM api_keys WHERE key_hash = %(key_hash)s AND revoked_at IS NULL"


class ApiKeyGetTenantParams(TypedDict):
    key_hash: str


API_KEY_GET_TENANT = Query[ApiKeyGetTenantParams](
    "api_key_get_tenant",
    "The tenant of an API key that exists and is not revoked.",
    ACTIVE_KEY,
)


class ApiKeyInsertParams(TypedDict):
    id: uuid.UUID
    key_hash: str
    label: str | None
    prefix: str
    tenant: str


API_KEY_INSERT = Query[ApiKeyInsertParams](
    "api_key_insert",
    "Store a new API key (its hash and a short prefix people recognise).",
    """
    INSERT INTO api_keys (id, tenant, key_hash, prefix, label)
    VALUES (%(id)s, %(tenant)s, %(key_hash)s, %(prefix)s, %(label)s)
    RETURNING id, tenant, prefix, label, created_at, revoked_at
    """,
)


class ApiKeyListParams(TypedDict):
    tenant: str | None


API_KEY_LIST = Query[ApiKeyListParams](
    "api_key_list",
    "Every API key, or one tenant's, oldest first; never the key or its hash.",
    """
    SELECT id, tenant, prefix, label, created_at, revoked_at FROM api_keys
    WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s
    ORDER BY created_at, id
    """,
)


class ApiKeyRevokeParams(TypedDict):
    id: uuid.UUID


API_KEY_REVOKE = Query[ApiKeyRevokeParams](
    "api_key_revoke",
    "Revoke an API key (revoking twice keeps the first time).",
    """
    UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
    WHERE id = %(id)s
    RETURNING id, tenant, prefix, label, created_at, revoked_at
    """,
)
