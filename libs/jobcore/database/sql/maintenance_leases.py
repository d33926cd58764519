"""Statements on ``maintenance_leases``: one maintenance leader per database, without
advisory locks (a lease is a row with a token and an expiry).

The leader holds the ``maintenance`` row (:mod:`jobcore.maintenance.lease`); each of its
services also holds a row of its own name (``reaper``, ``pruner``, ...) inside its working
transactions, the row a worker of the previous release and ``jobcore prune`` take."""

from __future__ import annotations

import uuid
from typing import TypedDict

from jobcore.database.sql import Query

# --- maintenance leases (one holder at a time, without advisory locks) -----------------


class MaintenanceLeaseParams(TypedDict):
    name: str
    owner: str
    token: uuid.UUID
    ttl: float


MAINTENANCE_LEASE_ACQUIRE = Query[MaintenanceLeaseParams](
    "maintenance_lease_acquire",
    "Take a maintenance lease if it is free or expired; return it only if we got it.",
    """
    INSERT INTO jobcore.maintenance_leases (name, owner, token, expires_at)
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
    UPDATE jobcore.maintenance_leases
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
    DELETE FROM jobcore.maintenance_leases WHERE name = %(name)s AND token = %(token)s
    """,
)


class MaintenanceLeaseGetHolderParams(TypedDict):
    name: str


MAINTENANCE_LEASE_GET_HOLDER = Query[MaintenanceLeaseGetHolderParams](
    "maintenance_lease_get_holder",
    "Who holds a maintenance lease, and until when (no row: nobody).",
    """
    SELECT owner, expires_at FROM jobcore.maintenance_leases
    WHERE name = %(name)s AND expires_at > now()
    """,
)


class MaintenanceLeaseFenceParams(TypedDict):
    leader: str
    token: uuid.UUID
    ttl: float
    name: str
    owner: str
    service_ttl: float


MAINTENANCE_LEASE_FENCE = Query[MaintenanceLeaseFenceParams](
    "maintenance_lease_fence",
    "In a working transaction: renew the leader lease we hold, then (only if we still hold "
    "it) take or renew the service's own row with the same token. One row: leading "
    "(false: the leader lease was lost) and serving (false: another holds the service row).",
    """
    WITH leader AS (
        UPDATE jobcore.maintenance_leases
        SET expires_at = now() + make_interval(secs => %(ttl)s)
        WHERE name = %(leader)s AND token = %(token)s
        RETURNING token
    ), service AS (
        INSERT INTO jobcore.maintenance_leases (name, owner, token, expires_at)
        SELECT %(name)s, %(owner)s, token, now() + make_interval(secs => %(service_ttl)s)
        FROM leader
        ON CONFLICT (name) DO UPDATE
        SET owner = excluded.owner,
            token = excluded.token,
            expires_at = excluded.expires_at,
            acquired_at = CASE WHEN maintenance_leases.token = excluded.token
                               THEN maintenance_leases.acquired_at ELSE now() END
        WHERE maintenance_leases.token = excluded.token
           OR maintenance_leases.expires_at < now()
        RETURNING token
    )
    SELECT EXISTS (SELECT FROM leader) AS leading, EXISTS (SELECT FROM service) AS serving
    """,
)


class MaintenanceLeaseReleaseAllParams(TypedDict):
    names: list[str]
    token: uuid.UUID


MAINTENANCE_LEASE_RELEASE_ALL = Query[MaintenanceLeaseReleaseAllParams](
    "maintenance_lease_release_all",
    "Give up the leader lease and every service row taken under it, so a successor (of "
    "either release) takes them at once.",
    """
    DELETE FROM jobcore.maintenance_leases WHERE name = ANY(%(names)s) AND token = %(token)s
    """,
)
