"""What every maintenance service shares: a frozen config checked when it is built, one
constructor, and its part of the contract with the leader (:mod:`.maintainer`).

A service does nothing on its own: the :class:`~jobcore.maintenance.maintainer.Maintainer`
calls :meth:`MaintenanceService.lead` once per interval while its worker holds the leader
lease (with the term, whose fence each working transaction runs first), and
:meth:`MaintenanceService.follow` on the workers that do not lead, for the few services
that keep gauges current everywhere.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from jobcore.database.gateway import UnitOfWork
from jobcore.kernel.errors import ConfigurationError
from jobcore.maintenance.connection import Transactions
from jobcore.maintenance.lease import Term

log = logging.getLogger(__name__)

# Candidates a batch takes at most; a full batch means: look again, at once.
BATCH_SIZE = 500


@dataclass(frozen=True)
class ServiceConfig:
    """A service's settings, frozen, checked when built: a bad value stops the worker at
    start-up with one line naming the variable."""

    interval: float
    batch_size: int = BATCH_SIZE

    # The variable each field is read from (the error names it).
    variables: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        self.positive("interval")
        self.positive("batch_size")

    def positive(self, field: str) -> None:
        value = getattr(self, field)
        if not value > 0:
            raise self.refuse(field, f"must be above zero, not {value!r}")

    def refuse(self, field: str, why: str) -> ConfigurationError:
        name = self.variables.get(field, f"{type(self).__name__}.{field}")
        return ConfigurationError(f"{name}: {why}")

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes``, checked again (tests shorten intervals)."""
        return dataclasses.replace(self, **changes)

    @property
    def row_ttl(self) -> float:
        """How long the service's own lease row lasts after each working transaction: three
        intervals, as when each service had a lease of its own (a worker of the previous
        release takes the row only once it ran out)."""
        return self.interval * 3


C = TypeVar("C", bound=ServiceConfig)


class MaintenanceService(Generic[C]):
    """One periodic service. ``name`` is its name in logs and its own lease row's."""

    name: ClassVar[str]

    def __init__(self, config: C) -> None:
        self.config = config

    @property
    def interval(self) -> float:
        return self.config.interval

    @property
    def row_ttl(self) -> float:
        return self.config.row_ttl

    # True: :meth:`follow` has work on the workers that do not lead (gauges).
    follows: ClassVar[bool] = False

    async def lead(self, term: Term) -> int:
        """One round as the leader's service: how much it did (jobs, rows, ticks)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Once the maintainer stops: end what the service started beyond its rounds (a
        VACUUM under way on a connection of its own)."""

    async def follow(self, db: Transactions) -> None:
        """One round on a worker that does not lead."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


class BatchService(MaintenanceService[C]):
    """A service whose round is batches, each its own fenced transaction, until one is not
    full: :meth:`work` does one inside the transaction, :meth:`report` logs and counts it
    once it committed."""

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[Any]]:
        """One batch: how many candidates it took (a full batch means: look again), and
        what it changed (rows, or a use case's answers)."""
        raise NotImplementedError

    def report(self, rows: Sequence[Any]) -> None:
        """Log and count a committed batch."""

    async def lead(self, term: Term) -> int:
        total = 0
        while not term.over:
            async with term.db.unit_of_work() as uow:
                if not await term.fence(uow, self):
                    break
                taken, rows = await self.work(uow)
                await uow.commit()
            self.report(rows)
            total += taken
            if taken < self.config.batch_size:
                break
        return total
