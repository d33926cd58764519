"""Statements on ``maintenance_leases``: one reaper, rescuer, sweeper or pruner at a time,
without advisory locks (a lease is a row with a token and an expiry)."""

from __future__ import annotations

import uuid
from typing import TypedDict

from jobcore.sql import Query

# --- maintenance leases (one reaper at a time, without advisory locks) -----------------


class MaintenanceLeaseParams(TypedDict):
    name: str
    owner: str
    token: uuid.UUID
    ttl: float


MAINTENANCE_LEASE_ACQUIRE = Query[MaintenanceLeaseParams](
    "maintenance_lease_acquire",
    "Take a maintenance lease if it is free or expired; return it only if we got it.",
    """
    INSERT INTO maintenance_leases (name, owner, token, expires_at)
    VALUES (%(name)s, %(owner)s, %(token)s, now() + make_interval(secs => %(ttl)s))
    ON CONFLICT (name) DO UPDATE
    SET owner = excluded.owner,
        token = excluded.token,
        expires_at = excluded.expires_at,
        acquired_at = now()
    WHERE maintenance_leases.expires_at < now()
    RETURNING token, expires_at
    """,
)


class MaintenanceLeaseRenewParams(TypedDict):
    name: str
    token: uuid.UUID
    ttl: float


MAINTENANCE_LEASE_RENEW = Query[MaintenanceLeaseRenewParams](
    "maintenance_lease_renew",
    "Extend a maintenance lease we still hold (fenced by its token); no row: it was lost.",
    """
    UPDATE maintenance_leases
    SET expires_at = now() + make_interval(secs => %(ttl)s)
    WHERE name = %(name)s AND token = %(token)s
    RETURNING expires_at
    """,
)


class MaintenanceLeaseReleaseParams(TypedDict):
    name: str
    token: uuid.UUID


MAINTENANCE_LEASE_RELEASE = Query[MaintenanceLeaseReleaseParams](
    "maintenance_lease_release",
    "Give up a maintenance lease so another process takes it at once.",
    """
    DELETE FROM maintenance_leases WHERE name = %(name)s AND token = %(token)s
    """,
)


class MaintenanceLeaseGetHolderParams(TypedDict):
    name: str


MAINTENANCE_LEASE_GET_HOLDER = Query[MaintenanceLeaseGetHolderParams](
    "maintenance_lease_get_holder",
    "Who holds a maintenance lease, and until when (no row: nobody).",
    """
    SELECT owner, expires_at FROM maintenance_leases
    WHERE name = %(name)s AND expires_at > now()
    """,
)
