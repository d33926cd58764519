"""/readyz says whether the worker can make progress, not only whether it is connected.

The worker reaches PostgreSQL through a proxy the test cuts while deliveries arrive: they
wait for their claims, none succeeds, and past JOBCORE_WORKER_STALL_AFTER the worker is
not ready. Once the proxy forwards again the claims go through and it is ready again,
with nothing restarted.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import via_port
from jobcore.testing.tcpproxy import Mode, TcpProxy
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import OutboxPump, readiness, status_is, submit
from tests.integration.worker.test_settlement import health_port

STALL_AFTER = 2.0


async def test_readyz_is_red_while_claims_cannot_reach_the_database_and_green_after(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    target = urlsplit(wsettings.database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    try:
        worker = await start_worker(
            wsettings.model_copy(
                update={
                    "database_url": via_port(wsettings.database_url, proxy.port),
                    "db_connect_timeout": 1.0,
                    "db_operation_timeout": 2.0,
                    "worker_stall_after": STALL_AFTER,
                }
            ),
            queues=["testq"],
        )
        port = await health_port(worker)
        first = await submit(db, topology, "wt_gate", GatePayload())
        await eventually(lambda: status_is(db, first, "succeeded"), what="a job through the proxy")
        assert (await readiness(port))[0] == 200

        proxy.set_mode(Mode.REFUSE)
        waiting = [await submit(db, topology, "wt_gate", GatePayload()) for _ in range(3)]

        async def red() -> dict[str, Any] | None:
            status, body = await readiness(port)
            return body if status == 503 else None

        body = await eventually(red, timeout=20, what="/readyz to turn red")
        assert body["broker_connected"] is True  # connected, consuming, and yet stuck
        assert body["consuming"] is True
        [reason] = body["trouble"]
        assert reason.startswith("jobs: ")
        assert "waiting for the database" in reason
        for job_id in waiting:
            assert await status_is(db, job_id, "pending")

        proxy.set_mode(Mode.FORWARD)

        async def green() -> bool:
            return (await readiness(port))[0] == 200

        await eventually(green, timeout=20, what="/readyz to turn green by itself")
        for job_id in waiting:
            await eventually(
                lambda job_id=job_id: status_is(db, job_id, "succeeded"),
                timeout=20,
                what="the held deliveries to be claimed and run",
            )
    finally:
        proxy.set_mode(Mode.FORWARD)
        await proxy.stop()
