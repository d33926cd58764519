"""What only the operators' console reads (:mod:`jobcore.sql.console`): :class:`ConsoleStore`,
a method per statement. They read several tables and change none."""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import Reader, fetch_all, fetch_one
from jobcore.sql import NoParams
from jobcore.sql.console import (
    CONSOLE_BACKLOG_BY_QUEUE,
    CONSOLE_FAILED_WEBHOOKS,
    CONSOLE_GATE_RUNNING,
    CONSOLE_JOB_SEARCH,
    CONSOLE_JOB_SEARCH_ANY_STATUS,
    CONSOLE_LEASES,
    CONSOLE_NOW,
    CONSOLE_ORDERING_BLOCKER,
    CONSOLE_RATES,
    ConsoleGateRunningParams,
    ConsoleJobSearchAnyStatusParams,
    ConsoleJobSearchParams,
    ConsoleLeasesParams,
    ConsoleOrderingBlockerParams,
    ConsoleRatesParams,
)

__all__ = [
    "ConsoleGateRunningParams",
    "ConsoleJobSearchAnyStatusParams",
    "ConsoleJobSearchParams",
    "ConsoleLeasesParams",
    "ConsoleOrderingBlockerParams",
    "ConsoleRatesParams",
    "ConsoleStore",
    "console_store",
]

_NO_PARAMS: NoParams = {}


class ConsoleStore:
    __slots__ = ()

    async def rates(self, on: Reader, params: ConsoleRatesParams) -> list[DictRow]:
        """Jobs enqueued, succeeded and failed per minute over the last ``minutes``."""
        return await fetch_all(on, CONSOLE_RATES(params))

    async def backlog_by_queue(self, on: Reader) -> list[DictRow]:
        return await fetch_all(on, CONSOLE_BACKLOG_BY_QUEUE(_NO_PARAMS))

    async def leases(self, on: Reader, params: ConsoleLeasesParams) -> DictRow | None:
        """Running jobs, and those whose lease ends soon or has ended."""
        return await fetch_one(on, CONSOLE_LEASES(params))

    async def count_failed_webhooks(self, on: Reader) -> DictRow | None:
        return await fetch_one(on, CONSOLE_FAILED_WEBHOOKS(_NO_PARAMS))

    async def search_jobs(self, on: Reader, params: ConsoleJobSearchParams) -> list[DictRow]:
        """A keyset page of the newest jobs matching every filter given."""
        return await fetch_all(on, CONSOLE_JOB_SEARCH(params))

    async def search_jobs_any_status(
        self, on: Reader, params: ConsoleJobSearchAnyStatusParams
    ) -> list[DictRow]:
        """A keyset page of the newest jobs of any status (of one type, at most)."""
        return await fetch_all(on, CONSOLE_JOB_SEARCH_ANY_STATUS(params))

    async def ordering_blocker(
        self, on: Reader, params: ConsoleOrderingBlockerParams
    ) -> DictRow | None:
        """The earliest job before this place of the ordering key that still holds it."""
        return await fetch_one(on, CONSOLE_ORDERING_BLOCKER(params))

    async def count_running_of_gate(
        self, on: Reader, params: ConsoleGateRunningParams
    ) -> DictRow | None:
        """How many jobs of a concurrency key are running."""
        return await fetch_one(on, CONSOLE_GATE_RUNNING(params))

    async def now(self, on: Reader) -> DictRow | None:
        """The database's clock."""
        return await fetch_one(on, CONSOLE_NOW(_NO_PARAMS))


console_store = ConsoleStore()
