"""A handler whose lease cannot be renewed stops when the lease runs out.

The worker reaches PostgreSQL through a proxy that the test cuts silently: heartbeats
then hang or fail, the lease expires in the database, and a reaper that can reach it may
hand the job to another worker. The handler must not still be running by then.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import via_port
from jobcore.testing.tcpproxy import Mode, TcpProxy
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import OutboxPump, effects, status_is, submit


async def test_a_handler_is_stopped_when_its_lease_runs_out_unrenewed(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    tmp_path: Path,
) -> None:
    target = urlsplit(wsettings.database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    try:
        cut_off = wsettings.model_copy(
            update={
                "database_url": via_port(wsettings.database_url, proxy.port),
                "db_connect_timeout": 1.0,
                "db_operation_timeout": 2.0,
            }
        )
        worker = await start_worker(cut_off)
        gate = tmp_path / "gate"
        job_id = await submit(db, topology, "wt_gate", GatePayload(gate=str(gate)))
        await eventually(lambda: status_is(db, job_id, "running"), what="the job to run")

        proxy.set_mode(Mode.BLACKHOLE)

        async def handler_stopped() -> bool:
            return (
                worker.metrics.counts["processed.lease_lost"] == 1 and not worker.executor.running
            )

        # wt_gate's lease is 2 s; the database stays cut all along, so only the worker's
        # own clock can have stopped the handler.
        await eventually(handler_stopped, timeout=15, what="the handler to stop, lease gone")
        assert await status_is(db, job_id, "running"), "the cut worker wrote no outcome"

        proxy.set_mode(Mode.FORWARD)
        gate.touch()
        row = await eventually(
            lambda: status_is(db, job_id, "succeeded"), timeout=30, what="the next attempt"
        )
        assert row["attempts"] == 2
        assert [e["attempt"] for e in await effects(db, job_id)] == [2]
    finally:
        proxy.set_mode(Mode.FORWARD)
        await proxy.stop()
