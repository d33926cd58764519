"""Every delivery is settled, and an attempt that fails after its claim says why.

An unexpected error before the claim requeues the delivery (it does not keep a prefetch
slot until the channel closes); one after the claim acknowledges it and ends the attempt
as a retryable failure with its real cause, never "lease expired". A consumer whose every
delivery fails turns /readyz red, and green again once they stop failing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.sql.inbox import JOBS_CONSUMER
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from services.worker.app import Worker
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload, NoPayload, TripwirePayload
from tests.integration.worker.support import (
    InboxRefusal,
    OutboxPump,
    effects,
    readiness,
    relayed,
    status_is,
    submit,
)


@pytest.fixture
def wsettings(wsettings: Settings) -> Settings:
    """Deliveries only: settling a delivery is the broker's path."""
    return relayed(wsettings)


JOBS = 4
CONCURRENCY = 2  # and so the prefetch: fewer than the jobs


async def health_port(worker: Worker) -> int:
    async def port() -> int | None:
        return worker.health.port if worker.health else None

    return await eventually(port, what="the health port")


async def test_an_error_before_the_claim_requeues_the_delivery_and_reddens_readiness(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    refusal = InboxRefusal(db, JOBS_CONSUMER)
    await refusal.start()
    worker = await start_worker(
        wsettings.model_copy(update={"worker_stall_after": 5.0}),
        queues=["testq"],
        concurrency=CONCURRENCY,
    )
    port = await health_port(worker)
    ids = [await submit(db, topology, "wt_gate", GatePayload()) for _ in range(JOBS)]

    async def refused_again_and_again() -> bool:
        return await refusal.refusals() >= 2 * JOBS

    # More refused claims than the prefetch: each failed delivery gave its slot back.
    await eventually(refused_again_and_again, timeout=30, what="claims refused repeatedly")

    async def red() -> dict[str, object] | None:
        status, body = await readiness(port)
        return body if status == 503 else None

    body = await eventually(red, timeout=15, what="/readyz to turn red")
    assert any("unexpected errors" in reason for reason in body["trouble"])  # type: ignore[attr-defined]

    await refusal.stop()
    for job_id in ids:
        row = await eventually(
            lambda job_id=job_id: status_is(db, job_id, "succeeded"),
            timeout=60,
            what="each job to succeed once the inbox accepts rows again",
        )
        assert row["attempts"] == 1  # refused claims never started an attempt
        assert len(await effects(db, job_id)) == 1

    async def green() -> bool:
        return (await readiness(port))[0] == 200

    await eventually(green, timeout=15, what="/readyz to turn green by itself")
    assert worker.metrics.counts["delivery_errors.before_claim"] >= 2 * JOBS


async def test_an_error_after_the_claim_acknowledges_and_fails_the_attempt_with_its_cause(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    tripwire = tmp_path / "tripwire"
    job_id = await submit(db, topology, "wt_tripwire", TripwirePayload(tripwire=str(tripwire)))
    tripwire.touch()  # the payload validated at enqueue; in the worker it raises, once
    worker = await start_worker()

    row = await eventually(
        lambda: status_is(db, job_id, "succeeded"), timeout=30, what="the retry to succeed"
    )
    assert row["attempts"] == 2
    assert row["last_error"] == (
        "starting the job failed: RuntimeError: the payload model broke in the worker"
    )
    assert [e["detail"]["attempt"] for e in await effects(db, job_id)] == [2]
    assert worker.metrics.counts["delivery_errors.after_claim"] == 1
    assert worker.metrics.counts["reaped.pending"] == 0  # no lease had to expire


async def test_an_error_text_postgresql_cannot_store_is_still_recorded(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_unstorable_error", NoPayload())
    row = await eventually(lambda: status_is(db, job_id, "failed"), timeout=20, what="failure")
    assert row["last_error"] == "RuntimeError: broken \\x00 text ? here"
    assert worker.metrics.counts["reaped.failed"] == 0


async def test_a_result_store_that_cannot_be_written_fails_attempts_with_the_real_cause(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the result directory should be")
    worker = await start_worker(wsettings.model_copy(update={"result_dir": blocker}))
    # Too large for the job row: the worker stores it (JobRunner._succeed).
    large = await submit(db, topology, "wt_gate", GatePayload(result_size=64 * 1024))
    # The handler stores a file itself (JobContext.put_result).
    own = await submit(db, topology, "wt_put_result", NoPayload())

    row = await eventually(lambda: status_is(db, large, "failed"), timeout=30, what="failure")
    assert row["attempts"] == 3  # every attempt ran, and failed as itself
    assert row["last_error"].startswith("storing the result failed: FileExistsError: ")
    assert row["result_ref"] is None
    assert await effects(db, large) == []  # effects only come with a success

    row = await eventually(lambda: status_is(db, own, "failed"), timeout=30, what="failure")
    assert row["attempts"] == 2
    assert row["last_error"].startswith("FileExistsError: ")
    assert worker.metrics.counts["reaped.pending"] == 0
    assert worker.metrics.counts["reaped.failed"] == 0
