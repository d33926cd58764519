"""Fixtures for the in-transaction enqueue tests: the worker tests' in-process workers and
broker clean-up, and an application table beside jobcore's."""

from __future__ import annotations

import pytest

from jobcore.database.gateway import Database
from tests.integration.worker.conftest import broker_cleanup, start_worker, wsettings

__all__ = ["broker_cleanup", "orders", "start_worker", "wsettings"]


@pytest.fixture
async def orders(db: Database) -> None:
    """The application's own table, written in the same transactions as the jobs."""
    async with db.connection() as conn:
        await conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY, total int NOT NULL)")
