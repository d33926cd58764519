"""jobcore.client through real outages: `jobcore api` reaches PostgreSQL through the test's
own TCP proxy, which is cut (refused, then silently blackholed) and restored while callers
enqueue with the client's retries and nothing else; then the API process is killed and
started again. Every call must return one job, made exactly once (by its Idempotency-Key),
and no job may exist that no call returned."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest

from jobcore.client import Accepted, AsyncClient, Client, RetryPolicy
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import Stack
from jobcore.testing.tcpproxy import Mode
from jobcore.testing.waiting import eventually

pytestmark = pytest.mark.timeout(300)

ASYNC_CALLERS = 6
# Long enough to outlast each outage here by far: a call gives up only if the API never
# comes back.
PATIENT = RetryPolicy(max_attempts=10_000, deadline=150.0, base_delay=0.05, max_delay=1.0)
JOBS_BETWEEN_FAULTS = 20

JOBS_BY_KEY = """
SELECT j.idempotency_key AS key, j.id, count(o.id) AS messages
FROM jobcore.jobs j LEFT JOIN jobcore.outbox o ON o.job_id = j.id
WHERE j.tenant = %(tenant)s GROUP BY j.id
"""


class CountingTransport(httpx.AsyncHTTPTransport):
    """Counts the connection errors the client saw (each one it then retried)."""

    errors = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.TransportError:
            self.errors += 1
            raise


async def test_enqueue_through_outages_makes_exactly_one_job_per_call(
    settings: Settings, tmp_path: Path
) -> None:
    results: list[Accepted] = []
    statuses: Counter[int] = Counter()
    transport = CountingTransport()

    async def count(response: httpx.Response) -> None:
        statuses[response.status_code] += 1

    async with Stack(
        settings, tmp_path / "logs", relays=0, workers=0, database_proxy=True
    ) as stack:
        proxy = stack.database_proxy
        assert proxy is not None
        assert stack.api is not None
        http = httpx.AsyncClient(transport=transport, timeout=10, event_hooks={"response": [count]})
        client = AsyncClient(stack.api_url, stack.api_key, http=http, retry=PATIENT)
        stop = asyncio.Event()
        stop_blocking = threading.Event()

        async def caller(number: int) -> None:
            sequence = 0
            while not stop.is_set():
                sequence += 1
                payload = {"n": number * 100_000 + sequence}
                results.append(await client.enqueue("effect", payload))

        def blocking_caller() -> None:
            # The blocking client, from a thread, through the same outages.
            with Client(stack.api_url, stack.api_key, retry=PATIENT) as blocking:
                sequence = 0
                while not stop_blocking.is_set():
                    sequence += 1
                    results.append(blocking.enqueue("effect", {"n": 900_000 + sequence}))

        async def accepted_at_least(n: int) -> None:
            async def probe() -> bool:
                return len(results) >= n

            await eventually(probe, timeout=120, interval=0.05, what=f"{n} calls returned")

        def felt() -> int:
            # A cut is felt as a 503 or, when the API's answer outlasts the client's own
            # timeout (a blackholed database), as a transport error the client retries.
            return statuses[503] + transport.errors

        async def refused_more_than(n: int) -> None:
            async def probe() -> bool:
                return felt() > n

            await eventually(probe, timeout=60, interval=0.05, what="the cut felt by callers")

        tasks = [asyncio.create_task(caller(i)) for i in range(ASYNC_CALLERS)]
        tasks.append(asyncio.create_task(asyncio.to_thread(blocking_caller)))
        try:
            await accepted_at_least(JOBS_BETWEEN_FAULTS)
            for mode in (Mode.REFUSE, Mode.BLACKHOLE):
                proxy.set_mode(mode)
                await refused_more_than(felt() + ASYNC_CALLERS)
                proxy.set_mode(Mode.FORWARD)
                await accepted_at_least(len(results) + JOBS_BETWEEN_FAULTS)
            # The API itself goes away mid-request and comes back on the same port.
            errors_before = transport.errors
            stack.api.kill()

            async def connection_errors() -> bool:
                return transport.errors > errors_before

            await eventually(connection_errors, timeout=30, what="connection errors")
            await stack.restart(stack.api)
            await accepted_at_least(len(results) + JOBS_BETWEEN_FAULTS)
        finally:
            stop.set()
            stop_blocking.set()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            await http.aclose()
        assert [o for o in outcomes if o is not None] == []  # no call raised

        async with stack.db.connection() as conn:
            cursor = await conn.execute(JOBS_BY_KEY, {"tenant": stack.tenant})
            rows = await cursor.fetchall()

    by_key: dict[str, list[str]] = {}
    for row in rows:
        by_key.setdefault(row["key"], []).append(str(row["id"]))
        assert row["messages"] == 1  # each job with its outbox message
    returned = {a.idempotency_key: str(a.job_id) for a in results}
    assert len(returned) == len(results)  # a fresh key per call
    # Exactly one job per call, the one the call returned; none that no call returned.
    assert by_key == {key: [job_id] for key, job_id in returned.items()}
    # The faults happened and were retried through: refusals, and lost connections.
    assert statuses[503] > 2 * ASYNC_CALLERS
    assert transport.errors > 0
