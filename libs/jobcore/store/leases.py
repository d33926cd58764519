"""The ``maintenance_leases`` table (who leads maintenance, who runs each service):
:class:`MaintenanceLeaseStore`, a method per statement of
:mod:`jobcore.sql.maintenance_leases`. Each lease is fenced by its token."""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import Reader, Session, execute, fetch_one
from jobcore.sql.maintenance_leases import (
    MAINTENANCE_LEASE_ACQUIRE,
    MAINTENANCE_LEASE_FENCE,
    MAINTENANCE_LEASE_GET_HOLDER,
    MAINTENANCE_LEASE_RELEASE,
    MAINTENANCE_LEASE_RELEASE_ALL,
    MAINTENANCE_LEASE_RENEW,
    MaintenanceLeaseFenceParams,
    MaintenanceLeaseGetHolderParams,
    MaintenanceLeaseParams,
    MaintenanceLeaseReleaseAllParams,
    MaintenanceLeaseReleaseParams,
    MaintenanceLeaseRenewParams,
)

__all__ = [
    "MaintenanceLeaseFenceParams",
    "MaintenanceLeaseGetHolderParams",
    "MaintenanceLeaseParams",
    "MaintenanceLeaseReleaseAllParams",
    "MaintenanceLeaseReleaseParams",
    "MaintenanceLeaseRenewParams",
    "MaintenanceLeaseStore",
    "maintenance_lease_store",
]


class MaintenanceLeaseStore:
    __slots__ = ()

    async def acquire(self, on: Reader, params: MaintenanceLeaseParams) -> DictRow | None:
        """Take the lease if it is free or expired; None if another holds it."""
        return await fetch_one(on, MAINTENANCE_LEASE_ACQUIRE(params))

    async def renew(self, on: Reader, params: MaintenanceLeaseRenewParams) -> DictRow | None:
        """Extend the lease while its token holds it; None: it was lost."""
        return await fetch_one(on, MAINTENANCE_LEASE_RENEW(params))

    async def release(self, on: Session, params: MaintenanceLeaseReleaseParams) -> int:
        return await execute(on, MAINTENANCE_LEASE_RELEASE(params))

    async def get_holder(
        self, on: Reader, params: MaintenanceLeaseGetHolderParams
    ) -> DictRow | None:
        """Who holds the lease, and until when; None: nobody."""
        return await fetch_one(on, MAINTENANCE_LEASE_GET_HOLDER(params))

    async def fence(self, on: Reader, params: MaintenanceLeaseFenceParams) -> DictRow | None:
        """Renew the leader lease, then take or renew the service's row with its token:
        whether it still leads (``leading``) and may serve (``serving``)."""
        return await fetch_one(on, MAINTENANCE_LEASE_FENCE(params))

    async def release_all(self, on: Session, params: MaintenanceLeaseReleaseAllParams) -> int:
        """Give up the leader lease and the service rows taken under its token."""
        return await execute(on, MAINTENANCE_LEASE_RELEASE_ALL(params))


maintenance_lease_store = MaintenanceLeaseStore()
