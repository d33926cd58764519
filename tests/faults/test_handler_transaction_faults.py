"""A worker process SIGKILLed at every step of a transactional handler (``ctx.transaction``):
before its write, after the write but before the commit, after the commit before the
handler returned, and after it returned. The account is credited exactly once and the
job ends succeeded, whichever attempt ran it.

The crash points are in the test job type ``wt_credit`` (CRASH_AT_ENV, set only on the
worker that should die); the worker kills itself there, so the kill lands at that step
and nowhere else. (The delivery was acknowledged right after the claim, before the
handler ran: every one of these steps is after the broker's ack.)
"""

from __future__ import annotations

import contextlib
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from tests.integration.worker.jobtypes import CRASH_AT_ENV, CRASH_POINTS, CreditPayload
from tests.integration.worker.support import (
    PROCESS_START,
    OutboxPump,
    balance,
    effects,
    exited,
    job_row,
    ledger,
    log_has,
    running_pump,
    status_is,
    submit,
    worker_env,
    worker_settings,
)

COMMITTED_BEFORE_THE_KILL = {"after_commit", "after_return"}


@pytest.fixture
def wsettings(settings: Settings) -> Settings:
    return worker_settings(settings)


@pytest.fixture
async def outbox_pump(
    wsettings: Settings, db: Database, topology: Topology
) -> AsyncIterator[OutboxPump]:
    pump = OutboxPump(wsettings, db)
    try:
        yield pump
    finally:
        await pump.close()
        with contextlib.suppress(Exception):
            connection = await aio_pika.connect(wsettings.amqp_url, timeout=5)
            async with connection:
                await topology.delete(await connection.channel(), default_registry.queues())


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
async def test_a_worker_killed_at_any_step_of_a_transactional_handler_credits_once(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    wsettings: Settings,
    tmp_path: Path,
    crash_at: str,
) -> None:
    account = f"acct-{uuid.uuid4().hex[:8]}"
    env = worker_env(wsettings)
    first_log, second_log = tmp_path / "a.log", tmp_path / "b.log"
    async with running_pump(outbox_pump):
        with jobcore_process(
            wsettings, "worker", log_path=first_log, **env, **{CRASH_AT_ENV: crash_at}
        ) as first:
            await eventually(
                log_has(first_log, "worker consuming"), what="worker a", timeout=PROCESS_START
            )
            job_id = await submit(
                db, topology, "wt_credit", CreditPayload(account=account, amount_cents=700)
            )
            await eventually(exited(first), what=f"worker a to die {crash_at}", timeout=60)
        assert first.returncode == -signal.SIGKILL
        killed = await job_row(db, job_id)
        committed = crash_at in COMMITTED_BEFORE_THE_KILL
        assert killed["status"] == ("succeeded" if committed else "running")
        assert len(await ledger(db, job_id)) == (1 if committed else 0)

        with jobcore_process(wsettings, "worker", log_path=second_log, **env):
            await eventually(
                log_has(second_log, "worker consuming"), what="worker b", timeout=PROCESS_START
            )
            row = await eventually(
                lambda: status_is(db, job_id, "succeeded"), what="the credit to succeed", timeout=60
            )
            # A job after it, through the same worker: whatever b would still do about the
            # first job (a reaped lease, a redelivery) it had its chance to do by then.
            after = await submit(
                db, topology, "wt_credit", CreditPayload(account=f"{account}-after")
            )
            await eventually(lambda: status_is(db, after, "succeeded"), what="a job after")

    attempt = 1 if committed else 2
    assert row["attempts"] == attempt
    entries = await ledger(db, job_id)
    assert [(e["account"], e["amount_cents"], e["attempt"]) for e in entries] == [
        (account, 700, attempt)
    ]
    assert await balance(db, account) == 700
    assert [(e["kind"], e["attempt"]) for e in await effects(db, job_id)] == [("credited", attempt)]
    assert row["result"]["entry_id"] == entries[0]["id"]
    if not committed:
        assert row["last_error"] == "lease expired"
