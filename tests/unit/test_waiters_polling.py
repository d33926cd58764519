"""Long-poll waiters behind PgBouncer with no direct URL: a ticker wakes them all together
(so their re-reads share statements), and nothing tries to LISTEN."""

from __future__ import annotations

import asyncio
import time
import uuid

from jobcore.kernel.settings import Settings
from services.api.waiters import JobWaiters

INTERVAL = 0.05


async def test_parked_waiters_are_woken_together_each_interval() -> None:
    settings = Settings(
        database_url="postgresql://postgres@127.0.0.1:6441/jobcore",
        database_pooler="pgbouncer",
        notify_poll_interval=INTERVAL,
    )
    waiters = JobWaiters(settings)
    assert waiters.polling
    await waiters.start()
    try:
        with (
            waiters.subscribe(uuid.uuid4()) as ended,
            waiters.subscribe(uuid.uuid4(), progress=True) as progressed,
        ):
            started = time.monotonic()
            woken = await asyncio.gather(waiters.park(ended, 30.0), waiters.park(progressed, 30.0))
            assert woken == [True, True]
            assert time.monotonic() - started < 10 * INTERVAL + 1.0
            assert not waiters.listening
    finally:
        await waiters.stop(1.0)


def test_waiters_listen_when_a_direct_url_is_given() -> None:
    settings = Settings(
        database_url="postgresql://postgres@127.0.0.1:6441/jobcore",
        database_pooler="pgbouncer",
        listen_database_url="postgresql://postgres@127.0.0.1:5432/jobcore",
    )
    assert not JobWaiters(settings).polling
