"""Singleton maintenance work (reaper, rescuer, sweeper, scheduler): one holder at a time,
by lease row.

Every worker runs each maintenance service, but only the holder of the service's row in
``maintenance_leases`` works: the lease is a row with a token and an expiry (not an
advisory lock, so it works behind PgBouncer in transaction mode), renewed inside each
working transaction, so a holder that lost it rolls back instead of working alongside
the new holder.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

from jobcore.db import Database, UnitOfWork, execute, fetch_one
from jobcore.errors import DatabaseUnavailable
from jobcore.service import Service
from jobcore.sql.maintenance_leases import (
    MAINTENANCE_LEASE_ACQUIRE,
    MAINTENANCE_LEASE_RELEASE,
    MAINTENANCE_LEASE_RENEW,
    MaintenanceLeaseParams,
)

log = logging.getLogger(__name__)

BATCH_SIZE = 500


class MaintenanceService(Service):
    """Works in rounds every ``interval`` seconds while it holds its lease.

    A subclass names its lease and does one batch in :meth:`work`, inside the
    transaction that renewed the lease; :meth:`report` runs once that batch committed.
    """

    lease_name: ClassVar[str]

    def __init__(self, db: Database, *, owner: str, interval: float) -> None:
        super().__init__()
        self.db = db
        self.owner = owner
        self.interval = interval
        # Long enough to survive a slow round or two; short enough that a dead holder's
        # successor takes over within a few intervals.
        self.lease_ttl = interval * 3
        self.token: uuid.UUID | None = None

    @property
    def is_leader(self) -> bool:
        return self.token is not None

    @property
    def standby_interval(self) -> float:
        """How often a worker without the lease tries for it: a third of the lease's life.

        A holder's lease runs out ``lease_ttl`` after its last renewal, so trying more
        often takes over no sooner; it only costs a transaction per try on every standby
        (the gate releaser's lease outlives 25 of its 0.2 s rounds: N − 1 workers tried
        five times a second for a lease that could not be free)."""
        return max(self.interval, self.lease_ttl / 3)

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[Any]]:
        """One batch: how many candidates it took (a full batch means: look again), and
        what it changed (rows, or a use case's answers)."""
        raise NotImplementedError

    def report(self, rows: Sequence[Any]) -> None:
        """Log and count a committed batch."""

    async def run(self) -> None:
        trouble_logged = False
        try:
            while not self.stopping.is_set():
                try:
                    await self.tick()
                    trouble_logged = False
                except DatabaseUnavailable as exc:
                    # Keep the token: the next renewal says whether the lease survived.
                    if not trouble_logged:
                        log.warning(
                            "%s: database unavailable", self.lease_name, extra={"error": str(exc)}
                        )
                        trouble_logged = True
                if await self.sleep(self.interval if self.is_leader else self.standby_interval):
                    break
        finally:
            await self._release()

    async def tick(self) -> int:
        """One round: take the lease if we hold none, then work until a batch is not full.

        A holder goes straight to work: each batch renews the lease in its own transaction
        (:meth:`renew_in`), so renewing it first as well would only add a commit (a WAL
        flush) per round, and the gate releaser's round comes every 0.2 s on every worker.
        """
        if self.token is None and not await self._hold_lease():
            return 0
        total = 0
        while True:
            taken = await self._work_batch()
            total += taken
            if taken < BATCH_SIZE:
                return total

    def _lease_params(self, token: uuid.UUID) -> MaintenanceLeaseParams:
        return {"name": self.lease_name, "owner": self.owner, "ttl": self.lease_ttl, "token": token}

    async def _hold_lease(self) -> bool:
        async with self.db.unit_of_work() as uow:
            if self.token is not None:
                row = await fetch_one(uow, MAINTENANCE_LEASE_RENEW(self._lease_params(self.token)))
                if row is None:
                    log.info("%s lease lost to another worker", self.lease_name)
                    self.token = None
            if self.token is None:
                token = uuid.uuid4()
                row = await fetch_one(uow, MAINTENANCE_LEASE_ACQUIRE(self._lease_params(token)))
                if row is not None:
                    self.token = token
                    log.info("%s lease acquired", self.lease_name, extra={"owner": self.owner})
            await uow.commit()
        return self.token is not None

    async def renew_in(self, uow: UnitOfWork) -> bool:
        """The fence: renew the lease in the caller's transaction, so its work commits only
        while we hold it; False (and the lease forgotten) if another holder took over."""
        renewed = (
            None
            if self.token is None
            else await fetch_one(uow, MAINTENANCE_LEASE_RENEW(self._lease_params(self.token)))
        )
        if renewed is None:
            self.token = None
            return False
        return True

    async def _work_batch(self) -> int:
        async with self.db.unit_of_work() as uow:
            if not await self.renew_in(uow):
                return 0
            taken, rows = await self.work(uow)
            await uow.commit()
        self.report(rows)
        return taken

    async def _release(self) -> None:
        if self.token is None:
            return
        token, self.token = self.token, None
        try:
            async with self.db.unit_of_work() as uow:
                await execute(
                    uow, MAINTENANCE_LEASE_RELEASE({"name": self.lease_name, "token": token})
                )
                await uow.commit()
        except DatabaseUnavailable:
            log.debug("could not release the %s lease; it expires on its own", self.lease_name)
