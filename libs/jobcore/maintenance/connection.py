"""Where maintenance statements run: any :class:`~jobcore.database.gateway.Database`, or the
leader's one pool connection taken in turn (:class:`SharedConnection`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from jobcore.database.gateway import Session, UnitOfWork
from jobcore.kernel.errors import ServiceStateError
from jobcore.kernel.settings import Settings


class Transactions(Protocol):
    """What a service's statements run on: sessions and units of work."""

    @property
    def settings(self) -> Settings: ...

    def session(self) -> AbstractAsyncContextManager[Session]: ...

    def unit_of_work(self) -> AbstractAsyncContextManager[UnitOfWork]: ...


class SharedConnection:
    """One pool connection's worth for all of maintenance: one transaction (or session) at
    a time; the others wait their turn, first come first served."""

    def __init__(self, db: Transactions) -> None:
        self._db = db
        self._turn = asyncio.Lock()
        self._holder: asyncio.Task[Any] | None = None

    @property
    def settings(self) -> Settings:
        return self._db.settings

    @contextlib.asynccontextmanager
    async def _taking_turn(self) -> AsyncIterator[None]:
        if self._holder is not None and self._holder is asyncio.current_task():
            # It would wait for itself forever.
            raise ServiceStateError("a maintenance transaction inside another")
        async with self._turn:
            self._holder = asyncio.current_task()
            try:
                yield
            finally:
                self._holder = None

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        async with self._taking_turn(), self._db.session() as session:
            yield session

    @contextlib.asynccontextmanager
    async def unit_of_work(self) -> AsyncIterator[UnitOfWork]:
        async with self._taking_turn(), self._db.unit_of_work() as uow:
            yield uow
