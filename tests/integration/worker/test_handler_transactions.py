"""``ctx.transaction()``: a handler's own writes commit with its attempt's success, fenced by
the lease, or not at all; the success's usual companions (effects, result, completion
webhook, the long-poll NOTIFY) still come with it, once."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute, fetch_one
from jobcore.database.sql.jobs.run import JOB_PROGRESS_SET
from jobcore.database.sql.webhook_deliveries import JOB_DONE_CHANNEL
from jobcore.examples.jobtypes import CreditAccountPayload
from jobcore.kernel.channels import JOB_PROGRESS_CHANNEL
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import CreditPayload, ProgressPayload
from tests.integration.worker.support import (
    TAKE_OVER,
    OutboxPump,
    balance,
    effects,
    job_row,
    ledger,
    running_echo_job,
    status_is,
    submit,
)


async def deliveries(db: Database, job_id: uuid.UUID) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT * FROM webhook_deliveries WHERE job_id = %s", (job_id,))
        return [dict(r) for r in await cur.fetchall()]


class Notifications:
    """A LISTEN connection of the test's own on the job-done and progress channels."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.heard: list[tuple[str, str]] = []
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> Notifications:
        self._conn = await psycopg.AsyncConnection.connect(
            self.settings.database_url, autocommit=True, row_factory=dict_row
        )
        await self._conn.execute(f"LISTEN {JOB_DONE_CHANNEL}")
        await self._conn.execute(f"LISTEN {JOB_PROGRESS_CHANNEL}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            await self._conn.close()

    async def until_done(self, job_id: uuid.UUID) -> list[tuple[str, str]]:
        """Everything heard about ``job_id`` up to its job-done notification."""
        assert self._conn is not None

        async def done() -> bool:
            assert self._conn is not None
            async for n in self._conn.notifies(timeout=0.2):
                self.heard.append((n.channel, n.payload))
            return (JOB_DONE_CHANNEL, str(job_id)) in self.heard

        await eventually(done, what="the job-done notification")
        return [(channel, payload) for channel, payload in self.heard if payload == str(job_id)]


async def test_a_transaction_commits_the_handlers_writes_with_the_success_once(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    account = f"acct-{uuid.uuid4().hex[:8]}"
    worker = await start_worker(webhooks=False)
    async with Notifications(wsettings) as heard:
        job_id = await submit(
            db,
            topology,
            "wt_credit",
            CreditPayload(account=account, amount_cents=250),
            callback_url="https://hooks.example.com/jobs",
        )
        row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="the credit")
        notifications = await heard.until_done(job_id)

    assert row["attempts"] == 1
    [entry] = await ledger(db, job_id)
    assert (entry["account"], entry["amount_cents"], entry["attempt"]) == (account, 250, 1)
    assert entry["tenant"] == row["tenant"]
    assert await balance(db, account) == 250
    # The result set on the transaction, with the fence the handler saw.
    assert row["result"]["entry_id"] == entry["id"]
    assert row["result"]["balance_cents"] == 250
    assert row["result"]["fence"] == {
        "job_id": str(job_id),
        "attempt": 1,
        "lease_token": str(row["lease_token"]),
    }
    # What follows a success came with it, once: the effect, the webhook, the NOTIFY.
    assert [(e["kind"], e["attempt"]) for e in await effects(db, job_id)] == [("credited", 1)]
    [delivery] = await deliveries(db, job_id)
    assert delivery["event"] == "job.succeeded"
    assert notifications.count((JOB_DONE_CHANNEL, str(job_id))) == 1
    # The worker counted one success and wrote no second outcome.
    counts = worker.metrics.snapshot()
    assert counts.get("processed.succeeded") == 1
    assert counts.get("processed.lease_lost", 0) == 0


async def test_an_error_in_the_transaction_rolls_its_writes_back_and_the_retry_commits_once(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    account = f"acct-{uuid.uuid4().hex[:8]}"
    await start_worker(webhooks=False)
    job_id = await submit(
        db, topology, "wt_credit", CreditPayload(account=account, fail_in_transaction=1)
    )
    row = await eventually(
        lambda: status_is(db, job_id, "succeeded"), what="the retried credit", timeout=30
    )

    assert row["attempts"] == 2
    assert [e["attempt"] for e in await ledger(db, job_id)] == [2]
    assert await balance(db, account) == 100
    assert [e["attempt"] for e in await effects(db, job_id)] == [2]


async def test_a_lost_lease_rolls_the_transaction_back_and_the_handler_sees_lease_lost(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker, tmp_path: Path
) -> None:
    account = f"acct-{uuid.uuid4().hex[:8]}"
    gate, seen = tmp_path / "gate", tmp_path / "seen"
    await start_worker(webhooks=False)
    job_id = await submit(
        db,
        topology,
        "wt_credit_long_lease",
        CreditPayload(account=account, gate=str(gate), seen=str(seen)),
    )
    await eventually(lambda: status_is(db, job_id, "running"), what="the claim")
    # Another attempt takes the job over (as the reaper and a second worker would).
    other_token = uuid.uuid4()
    async with db.connection() as conn:
        await execute(conn, TAKE_OVER({"id": job_id, "token": other_token}))
    gate.touch()

    async def handler_saw() -> str | None:
        return seen.read_text() if seen.exists() else None

    assert await eventually(handler_saw, what="the handler's exception") == "LeaseLost"
    row = await job_row(db, job_id)
    assert (row["status"], row["lease_token"]) == ("running", other_token)
    assert row["result"] is None
    assert await ledger(db, job_id) == []
    assert await balance(db, account) is None
    assert await effects(db, job_id) == []


async def test_progress_is_throttled_and_its_last_report_is_written_before_the_outcome(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    await start_worker(webhooks=False)
    async with Notifications(wsettings) as heard:
        job_id = await submit(
            db, topology, "wt_progress", ProgressPayload(gate=str(gate), reports=200)
        )

        async def halfway() -> dict[str, Any] | None:
            row = await job_row(db, job_id)
            return row if row["progress_message"] == "halfway" else None

        row = await eventually(halfway, what="the first burst's last report")
        assert (row["status"], row["progress_fraction"], row["progress_attempt"]) == (
            "running",
            0.5,
            1,
        )
        gate.touch()
        done = await eventually(lambda: status_is(db, job_id, "succeeded"), what="the job")
        notifications = await heard.until_done(job_id)

    # The second burst's last report came within the throttle's interval of its first and
    # right before the handler returned: only the final flush wrote it.
    assert (done["progress_fraction"], done["progress_message"]) == (1.0, "done")
    assert done["progress_updated_at"] <= done["finished_at"]
    # 402 reports in two bursts: one write when each burst began (the tight loop's latest
    # value by then) plus at most the final flush, never one per report.
    writes = notifications.count((JOB_PROGRESS_CHANNEL, str(job_id)))
    assert 2 <= writes <= 3


async def test_progress_is_fenced_by_the_lease(db: Database, topology: Topology) -> None:
    token = uuid.uuid4()
    job_id = await running_echo_job(db, topology, token)
    async with db.connection() as conn:
        stale = await fetch_one(
            conn,
            JOB_PROGRESS_SET(
                {"id": job_id, "lease_token": uuid.uuid4(), "fraction": 0.9, "message": "stale"}
            ),
        )
        assert stale is None
        assert (await job_row(db, job_id))["progress_updated_at"] is None
        written = await fetch_one(
            conn,
            JOB_PROGRESS_SET(
                {"id": job_id, "lease_token": token, "fraction": 0.3, "message": None}
            ),
        )
    assert written is not None
    row = await job_row(db, job_id)
    assert (row["progress_fraction"], row["progress_message"], row["progress_attempt"]) == (
        0.3,
        None,
        1,
    )


async def test_the_database_refuses_progress_out_of_bounds(
    db: Database, topology: Topology
) -> None:
    token = uuid.uuid4()
    job_id = await running_echo_job(db, topology, token)
    for fraction, message in ((1.5, None), (-0.1, None), (0.5, "x" * 501)):
        async with db.connection() as conn:
            try:
                await execute(
                    conn,
                    JOB_PROGRESS_SET(
                        {
                            "id": job_id,
                            "lease_token": token,
                            "fraction": fraction,
                            "message": message,
                        }
                    ),
                )
            except psycopg.errors.CheckViolation:
                continue
        raise AssertionError(f"progress {fraction}, {len(message or '')} chars was stored")


async def test_the_shipped_credit_account_credits_each_job_once(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    account = f"acct-{uuid.uuid4().hex[:8]}"
    await start_worker(webhooks=False)
    first = await submit(
        db, topology, "credit_account", CreditAccountPayload(account=account, amount_cents=1500)
    )
    await eventually(lambda: status_is(db, first, "succeeded"), what="the first credit")
    second = await submit(
        db, topology, "credit_account", CreditAccountPayload(account=account, amount_cents=25)
    )
    row = await eventually(lambda: status_is(db, second, "succeeded"), what="the second credit")

    [entry] = await ledger(db, second)
    assert row["result"] == {"account": account, "entry_id": entry["id"], "balance_cents": 1525}
    assert len(await ledger(db, first)) == 1
    assert await balance(db, account) == 1525
