"""How often a maintenance service tries for its lease, holder or not (no I/O)."""

from __future__ import annotations

import uuid
from typing import cast

import pytest

from jobcore.db import Database
from services.worker.maintenance import MaintenanceService


class Probe(MaintenanceService):
    lease_name = "probe"


async def test_a_standby_tries_a_third_of_the_lease_apart_a_holder_every_interval() -> None:
    service = Probe(cast(Database, None), owner="w", interval=0.2)
    service.lease_ttl = 5.0  # as the gate releaser stretches it
    slept: list[float] = []

    async def tick() -> int:
        if slept:  # the second round takes the lease
            service.token = uuid.uuid4()
        return 0

    async def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return len(slept) == 2

    async def release() -> None:
        return None

    service.tick = tick  # type: ignore[method-assign]
    service.sleep = sleep  # type: ignore[method-assign]
    service._release = release  # type: ignore[method-assign]
    await service.run()
    assert slept == [pytest.approx(5.0 / 3), 0.2]


def test_a_standby_never_tries_more_often_than_a_holder_works() -> None:
    service = Probe(cast(Database, None), owner="w", interval=5.0)  # lease: 3 intervals
    assert service.standby_interval == 5.0
