"""The maintainer: one leader per database runs every maintenance service.

Every worker runs a :class:`Maintainer`. One loop tries for the leader lease
(:mod:`jobcore.maintenance.lease`) a third of its life apart; the worker that holds it
leads, and each of its services works once per interval for as long as the term lasts.
When the lease is lost (a renewal, in a working transaction or on its own, finds another
token), the term ends and its services stop leading at once; on the other workers they only
keep their gauges current (:meth:`~jobcore.maintenance.base.MaintenanceService.follow`).

Every statement of every service, the election's included, runs on one pool connection
taken in turn (:class:`SharedConnection`): maintenance needs one connection of a worker's
pool, not one per service, and the leader's transactions never wait for each other's lock
on the lease row.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobcore.kernel.errors import ConfigurationError, DatabaseUnavailable, ServiceStateError
from jobcore.kernel.startstop import Service
from jobcore.maintenance.base import MaintenanceService
from jobcore.maintenance.connection import SharedConnection, Transactions
from jobcore.maintenance.lease import LeaderLease, Term

log = logging.getLogger(__name__)

# The shortest leader lease: a short interval must not make it flap between workers on a
# slow round (the gate releaser's 0.2 s rounds kept their lease at least this long too).
MIN_LEASE_TTL = 5.0


@dataclass(frozen=True)
class MaintainerConfig:
    """The leader lease's life. Renewed by every working transaction, and on its own every
    third of its life; standbys try for it as often."""

    lease_ttl: float = MIN_LEASE_TTL

    def __post_init__(self) -> None:
        if not self.lease_ttl > 0:
            raise ConfigurationError(
                f"MaintainerConfig.lease_ttl: must be above zero, not {self.lease_ttl!r}"
            )

    @classmethod
    def for_services(cls, services: Sequence[MaintenanceService[Any]]) -> MaintainerConfig:
        """Three of the shortest interval, at least :data:`MIN_LEASE_TTL`: a dead leader's
        successor takes over no later than each service's successor did when each had a
        lease of its own (three of its interval), bar the shortest ones."""
        shortest = min((service.interval for service in services), default=MIN_LEASE_TTL)
        return cls(lease_ttl=max(MIN_LEASE_TTL, 3 * shortest))

    @property
    def renew_every(self) -> float:
        return self.lease_ttl / 3


class Maintainer(Service):
    """Elects one leader per database and runs every service under it."""

    name = "worker-maintenance"

    def __init__(
        self,
        db: Transactions,
        services: Sequence[MaintenanceService[Any]],
        *,
        owner: str,
        config: MaintainerConfig | None = None,
    ) -> None:
        super().__init__()
        names = [service.name for service in services]
        if len(set(names)) != len(names):
            raise ServiceStateError(f"maintenance services named twice: {names}")
        self.db = SharedConnection(db)
        self.services = tuple(services)
        self.owner = owner
        self.config = config or MaintainerConfig.for_services(self.services)
        self.lease = LeaderLease(owner, self.config.lease_ttl)
        self.term: Term | None = None
        # Set (and replaced) on each change of leadership: services waiting wake up.
        self._changed = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        return self.term is not None and not self.term.over

    def service(self, name: str) -> MaintenanceService[Any]:
        return next(service for service in self.services if service.name == name)

    # --- the election -----------------------------------------------------------------

    async def elect(self) -> bool:
        """Renew the lease, or try to take it; whether this worker leads now.

        The leader renews it here too, not only in its working transactions: one that
        rolled back renewed nothing."""
        term = self.term
        if term is not None and not term.over:
            async with self.db.unit_of_work() as uow:
                renewed = await self.lease.renew(uow, term.token)
                await uow.commit()
            if renewed:
                return True
            log.info("maintenance lease lost to another worker")
            term.end(lost=True)
        if self.term is not None:
            await self.step_down()
        if self.stopping.is_set():
            return False
        async with self.db.unit_of_work() as uow:
            token = await self.lease.acquire(uow)
            await uow.commit()
        if token is not None:
            self.term = Term(self.lease, token, self.db, self.stopping)
            log.info(
                "maintenance lease acquired: this worker leads",
                extra={"owner": self.owner, "services": [s.name for s in self.services]},
            )
            self._announce()
        return token is not None

    async def step_down(self) -> None:
        """The term is over: services stop leading; its rows go back (those still ours)."""
        term, self.term = self.term, None
        if term is None:
            return
        term.end()
        self._announce()
        try:
            async with self.db.unit_of_work() as uow:
                await self.lease.release(uow, term.token, [s.name for s in self.services])
                await uow.commit()
        except DatabaseUnavailable:
            log.debug("could not give back the maintenance leases; they expire on their own")

    def _announce(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- rounds -----------------------------------------------------------------------

    async def round(self, service: MaintenanceService[Any]) -> int:
        """One round of ``service`` as this worker stands: its work as the leader's, or
        what it does on the other workers (then 0)."""
        term = self.term
        if term is not None and not term.over:
            return await service.lead(term)
        if service.follows:
            await service.follow(self.db)
        return 0

    async def tick(self) -> dict[str, int]:
        """An election, then one round of every service, one after another: what each did
        (the tests drive maintenance with it)."""
        await self.elect()
        return {service.name: await self.round(service) for service in self.services}

    # --- the loops --------------------------------------------------------------------

    async def run(self) -> None:
        tasks = [asyncio.create_task(self._elections(), name=f"{self.name}-election")]
        tasks += [
            asyncio.create_task(self._serve(service), name=f"{self.name}-{service.name}")
            for service in self.services
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a loop ends early only by raising: so does the maintainer
        finally:
            self.stopping.set()
            try:
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                for task in tasks:
                    task.cancel()
            # First what the services run on connections of their own (a VACUUM under
            # way): the step-down waits for the database, which may be gone.
            for service in self.services:
                try:
                    await service.close()
                except Exception:
                    log.exception("maintenance: %s did not close", service.name)
            await self.step_down()

    async def _elections(self) -> None:
        trouble_logged = False
        while not self.stopping.is_set():
            try:
                await self.elect()
                trouble_logged = False
            except DatabaseUnavailable as exc:
                # Keep the term: the next renewal says whether the lease survived.
                if not trouble_logged:
                    log.warning("maintenance: database unavailable", extra={"error": str(exc)})
                    trouble_logged = True
            term = self.term
            if term is not None:
                await term.sleep(self.config.renew_every)  # wakes early once it is lost
            else:
                await self.sleep(self.config.renew_every)

    async def _serve(self, service: MaintenanceService[Any]) -> None:
        trouble_logged = False
        while not self.stopping.is_set():
            leading, changed = self.is_leader, self._changed
            try:
                await self.round(service)
                trouble_logged = False
            except DatabaseUnavailable as exc:
                if not trouble_logged:
                    log.warning("%s: database unavailable", service.name, extra={"error": str(exc)})
                    trouble_logged = True
            # A service with nothing to do off the lead waits for the next term.
            await self._pause(service.interval if leading or service.follows else None, changed)

    async def _pause(self, seconds: float | None, changed: asyncio.Event) -> None:
        """Until ``seconds`` passed (None: no limit), leadership changed since ``changed``
        was current, or stopping."""
        waits = [
            asyncio.ensure_future(self.stopping.wait()),
            asyncio.ensure_future(changed.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
