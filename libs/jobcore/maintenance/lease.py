"""The leader lease: one row of ``maintenance_leases`` per database, and a term of office.

A lease is a row with a token and an expiry, not an advisory lock, so it works behind
PgBouncer in transaction mode. The worker that takes the ``maintenance`` row leads: its
:class:`~jobcore.maintenance.maintainer.Maintainer` runs every service for the length of
its :class:`Term`. The lease is renewed inside every working transaction, first
(:meth:`Term.fence`): a leader that lost it (it stalled past the lease, and another took
over) rolls that transaction back instead of working alongside the new leader. The renewal
also locks the row until the transaction ends, so no successor can take it while a
transaction that renewed it is still working.

The same fence takes (or keeps) the service's own row, named after it (``reaper``,
``pruner``, ...), with the term's token: the row that each service of the previous release
elected itself with, and that ``jobcore prune`` takes. While a worker of the previous
release (during a rolling upgrade) or ``jobcore prune`` holds it, the leader's service does
nothing, and that service is still done by one process at a time (docs/design.md,
"Maintenance").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Protocol

from jobcore.db import UnitOfWork
from jobcore.maintenance.connection import Transactions
from jobcore.store import maintenance_lease_store

log = logging.getLogger(__name__)

# The row of maintenance_leases whose holder leads every maintenance service.
LEADER_LEASE = "maintenance"


class Fenced(Protocol):
    """A service, as the fence sees it: its own row's name, and how long that row lasts."""

    @property
    def name(self) -> str: ...

    @property
    def row_ttl(self) -> float: ...


class LeaderLease:
    """The statements on the leader's row, for one worker (``owner``)."""

    def __init__(self, owner: str, ttl: float, name: str = LEADER_LEASE) -> None:
        self.owner = owner
        self.ttl = ttl
        self.name = name

    async def acquire(self, uow: UnitOfWork) -> uuid.UUID | None:
        """Take the lease if it is free or expired: its new token, or None."""
        token = uuid.uuid4()
        row = await maintenance_lease_store.acquire(
            uow, {"name": self.name, "owner": self.owner, "ttl": self.ttl, "token": token}
        )
        return token if row is not None else None

    async def renew(self, uow: UnitOfWork, token: uuid.UUID) -> bool:
        renewed = await maintenance_lease_store.renew(
            uow, {"name": self.name, "ttl": self.ttl, "token": token}
        )
        return renewed is not None

    async def release(self, uow: UnitOfWork, token: uuid.UUID, services: list[str]) -> None:
        """Give up the lease and the services' rows taken under it (a successor of either
        release takes them at once); a row another holds now is left alone."""
        await maintenance_lease_store.release_all(
            uow, {"names": [self.name, *services], "token": token}
        )


class Term:
    """One worker's time as leader: the token, the fence, and whether it is over."""

    def __init__(
        self, lease: LeaderLease, token: uuid.UUID, db: Transactions, stopping: asyncio.Event
    ) -> None:
        self.lease = lease
        self.token = token
        self.db = db
        self.lost = False
        self.ended = asyncio.Event()
        self._stopping = stopping
        self._busy: set[str] = set()

    @property
    def over(self) -> bool:
        """True once the lease was lost or given up, or the worker is stopping."""
        return self.ended.is_set() or self._stopping.is_set()

    def end(self, *, lost: bool = False) -> None:
        self.lost = self.lost or lost
        self.ended.set()

    async def fence(self, uow: UnitOfWork, service: Fenced) -> bool:
        """Run first in each working transaction: renew the leader lease and hold the
        service's own row. False: do nothing in it (the lease was lost, and the term is
        over; or another process holds the service's row for now)."""
        if self.over:
            return False
        row = await maintenance_lease_store.fence(
            uow,
            {
                "leader": self.lease.name,
                "token": self.token,
                "ttl": self.lease.ttl,
                "name": service.name,
                "owner": self.lease.owner,
                "service_ttl": service.row_ttl,
            },
        )
        if row is None or not row["leading"]:
            log.info("maintenance lease lost to another worker", extra={"service": service.name})
            self.end(lost=True)
            return False
        if not row["serving"]:
            if service.name not in self._busy:
                # A worker of the previous release, or `jobcore prune`: it does the work.
                log.info(
                    "%s lease held by another process; this leader's %s waits",
                    service.name,
                    service.name,
                )
                self._busy.add(service.name)
            return False
        self._busy.discard(service.name)
        return True

    async def sleep(self, seconds: float) -> bool:
        """Rest unless the term ends first; True if it is over (stop the round)."""
        if not self.over:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._either(), timeout=max(0.0, seconds))
        return self.over

    async def _either(self) -> None:
        waits = [
            asyncio.ensure_future(self.ended.wait()),
            asyncio.ensure_future(self._stopping.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
