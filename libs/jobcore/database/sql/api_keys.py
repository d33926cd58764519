"""Statements on ``api_keys``: only hashes are stored; a revoked or expired key stops at once.

A key is usable while it is not revoked and not past ``expires_at``. That rule is written
once, in :func:`usable`, and used by the per-request lookup, by rotation (at most two
usable keys per lineage) and by the state ``keys list`` shows.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TypedDict

from jobcore.database.sql import Query


def usable(table: str = "api_keys") -> str:
    """The condition on a row of ``table`` (a name or an alias) that makes a key usable."""
    return (
        f"{table}.revoked_at IS NULL AND ({table}.expires_at IS NULL OR {table}.expires_at > now())"
    )


USABLE = usable()

# What anyone may see of a key: never the key, never its hash.
_SHOWN = f"""
    id, tenant, prefix, label, scopes, created_at, expires_at, revoked_at, last_used_at,
    coalesce(lineage, id) AS lineage, rotated_from,
    CASE WHEN revoked_at IS NOT NULL THEN 'revoked'
         WHEN NOT ({USABLE}) THEN 'expired'
         ELSE 'active' END AS state
"""

# How stale last_used_at may be: the lookup writes the row at most this often per key.
LAST_USED_RESOLUTION = "1 minute"


class ApiKeyAuthenticateParams(TypedDict):
    key_hash: str


API_KEY_AUTHENTICATE = Query[ApiKeyAuthenticateParams](
    "api_key_authenticate",
    "The id, tenant, scopes and expiry of a usable key, noting its use (at most once a minute).",
    # One statement, one round trip: a unique-index probe, and a write only when
    # last_used_at is older than the resolution. SKIP LOCKED: a request never waits for
    # a lock on its key row (a rotation holding it); that touch is merely skipped.
    f"""
    WITH found AS (
        SELECT id, tenant, scopes, expires_at FROM jobcore.api_keys
        WHERE key_hash = %(key_hash)s AND {USABLE}
    ), touched AS (
        UPDATE jobcore.api_keys SET last_used_at = now()
        WHERE id IN (
            SELECT k.id FROM jobcore.api_keys k JOIN found ON found.id = k.id
            WHERE k.last_used_at IS NULL
               OR k.last_used_at < now() - interval '{LAST_USED_RESOLUTION}'
            FOR NO KEY UPDATE OF k SKIP LOCKED
        )
        RETURNING id
    )
    SELECT id, tenant, scopes, expires_at FROM found
    """,
    # Run for every authenticated request, before its own statements: planned once per
    # connection (a probe by its unique hash), it costs a fraction of planning it anew
    # (docs/bench/measurements.md, "Plans").
    generic_plan=True,
)


class ApiKeyInsertParams(TypedDict):
    id: uuid.UUID
    key_hash: str
    label: str | None
    prefix: str
    tenant: str
    scopes: list[str]
    expires_at: datetime | None
    expires_in: timedelta | None
    lineage: uuid.UUID
    rotated_from: uuid.UUID | None


API_KEY_INSERT = Query[ApiKeyInsertParams](
    "api_key_insert",
    "Store a new API key (its hash and a short prefix people recognise).",
    f"""
    INSERT INTO jobcore.api_keys (id, tenant, key_hash, prefix, label, scopes, expires_at, lineage,
                          rotated_from)
    VALUES (%(id)s, %(tenant)s, %(key_hash)s, %(prefix)s, %(label)s, %(scopes)s,
            coalesce(%(expires_at)s, now() + %(expires_in)s::interval), %(lineage)s,
            %(rotated_from)s)
    RETURNING {_SHOWN}
    """,
)


class ApiKeyListParams(TypedDict):
    tenant: str | None


API_KEY_LIST = Query[ApiKeyListParams](
    "api_key_list",
    "Every API key, or one tenant's, oldest first; never the key or its hash.",
    f"""
    SELECT {_SHOWN} FROM jobcore.api_keys
    WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s
    ORDER BY created_at, id
    """,
)


class ApiKeyIdParams(TypedDict):
    id: uuid.UUID


API_KEY_REVOKE = Query[ApiKeyIdParams](
    "api_key_revoke",
    "Revoke an API key (revoking twice keeps the first time).",
    f"""
    UPDATE jobcore.api_keys SET revoked_at = coalesce(revoked_at, now())
    WHERE id = %(id)s
    RETURNING {_SHOWN}
    """,
)

API_KEY_LOCK_LINEAGE = Query[ApiKeyIdParams](
    "api_key_lock_lineage",
    "Lock the first key of a key's lineage: rotations of one lineage take turns.",
    # The first key is never deleted, so every rotation of a lineage locks the same row.
    # (api_keys is small, one row per key ever issued: no index on lineage is needed.)
    """
    SELECT root.id FROM jobcore.api_keys k
    JOIN jobcore.api_keys root ON root.id = coalesce(k.lineage, k.id)
    WHERE k.id = %(id)s
    FOR NO KEY UPDATE OF root
    """,
)

API_KEY_GET_FOR_ROTATION = Query[ApiKeyIdParams](
    "api_key_get_for_rotation",
    "A key, how long it was made to last, and how many keys of its lineage are usable.",
    # A statement of its own after the lock: its snapshot sees a rotation that committed
    # while this one waited.
    f"""
    SELECT {_SHOWN}, expires_at - created_at AS lifetime,
           (SELECT count(*) FROM jobcore.api_keys other
            WHERE coalesce(other.lineage, other.id) = coalesce(api_keys.lineage, api_keys.id)
              AND {usable("other")}) AS usable_in_lineage
    FROM jobcore.api_keys WHERE id = %(id)s
    """,
)


class ApiKeyExpireParams(TypedDict):
    id: uuid.UUID
    within: timedelta


API_KEY_EXPIRE = Query[ApiKeyExpireParams](
    "api_key_expire",
    "Make a key expire after a while (or keep its earlier expiry).",
    f"""
    UPDATE jobcore.api_keys SET expires_at = least(expires_at, now() + %(within)s::interval)
    WHERE id = %(id)s
    RETURNING {_SHOWN}
    """,
)
