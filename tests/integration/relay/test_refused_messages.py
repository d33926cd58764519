"""A transient broker condition never fails a job; only a message that can never be
published is quarantined (issue 14, Must 3).

The broker refusing a message for now (returned because no queue is bound: a queue missing
during a deploy, deleted and recreated; nacked; its exchange missing) is retried with
capped backoff for as long as it lasts, past JOBCORE_RELAY_MAX_PUBLISH_ATTEMPTS, while a
relay that declares the route declares its topology again (at most once per interval).
Quarantine, and so the rescuer failing the job, is only for malformed or too large
messages, and one of those does not hold up the rest of its batch.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import orjson

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from services.worker.app import Worker
from tests.integration.relay.helpers import (
    collect,
    fill_outbox,
    outbox_row,
    relay_env,
    run_cli,
    running_relay,
    wait_drained,
    wait_idle,
    wait_received,
)
from tests.integration.worker.support import (
    job_row,
    outbox_rows,
    status_is,
    submit,
    worker_settings,
)

# The test's own JOBCORE_RELAY_MAX_PUBLISH_ATTEMPTS: today's quarantine horizon, in seconds
# with the fast retry delays of relay_env / running_relay (0.05 s base, 0.2 s cap).
MAX_ATTEMPTS = 3


def metric(text: str, name: str) -> float:
    """One sample's value from Prometheus text (0 when the sample is absent)."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@contextlib.asynccontextmanager
async def running_worker(settings: Settings) -> AsyncIterator[Worker]:
    """A worker in this process, consuming the test job queue; like any worker it declares
    its queues at start-up."""
    worker = Worker(worker_settings(settings), queues=["testq"], health=False)
    await worker.start()
    try:

        async def consuming() -> bool:
            return worker.consumer.consuming

        await eventually(consuming, what="the worker to consume")
        yield worker
    finally:
        await worker.stop()


async def test_a_job_whose_queue_is_missing_waits_past_the_old_horizon_then_succeeds(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    tmp_path: Path,
) -> None:
    """The issue's test. The job queue is deleted; a job is enqueued; its message is
    returned again and again, far past the old quarantine horizon, and the job stays
    pending, saying why. A worker then starts (declaring the queue, as at start-up): the
    job succeeds."""
    await topology.declare(amqp_channel, ["testq"])
    await amqp_channel.queue_delete(topology.queue_name("testq"))
    # A relay of a deploy in progress: its job modules lack the job type, so it neither
    # declares nor restores the type's queue.
    env = relay_env(
        JOBCORE_JOB_MODULES="jobcore.examples.jobtypes",
        JOBCORE_RELAY_MAX_PUBLISH_ATTEMPTS=str(MAX_ATTEMPTS),
    )
    with jobcore_process(settings, "relay", log_path=tmp_path / "relay.log", **env):
        job_id = await submit(db, topology, "echo", EchoPayload(text="still here"))

        async def far_past_the_horizon() -> dict[str, Any] | None:
            [row] = await outbox_rows(db, job_id)
            return row if row["attempts"] >= 3 * MAX_ATTEMPTS else None

        row = await eventually(
            far_past_the_horizon, timeout=30, what="attempts far past the old quarantine"
        )
        waiting = await job_row(db, job_id)
        status = run_cli(settings, "outbox", "status", "--json")
        failing = run_cli(settings, "outbox", "list-failing", "--json")

        async with running_worker(settings):
            done = await eventually(
                lambda: status_is(db, job_id, "succeeded", "failed"),
                timeout=30,
                what="the job to end",
            )

    assert row["quarantined_at"] is None
    assert "NO_ROUTE" in row["last_error"]
    assert waiting["status"] == "pending"
    assert waiting["last_error"].startswith("attempt 1's message could not be published")
    assert "NO_ROUTE" in waiting["last_error"]
    assert status.returncode == 0, status.stderr
    backlog = orjson.loads(status.stdout)
    assert backlog["failing"] == 1
    assert backlog["quarantined"] == 0
    assert backlog["longest_failing_seconds"] > 0
    assert failing.returncode == 0, failing.stderr
    [listed] = orjson.loads(failing.stdout)
    assert listed["job_id"] == str(job_id)
    assert "NO_ROUTE" in listed["last_error"]
    assert done["status"] == "succeeded"
    assert done["result"] == {"text": "still here"}
    assert await outbox_rows(db, job_id) == []


async def test_a_relay_that_declares_the_deleted_queue_restores_it_and_the_job_runs(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    """No operator, no worker start-up: the relay sees its message returned for a route it
    declares, declares its topology again, and the retry goes out."""
    async with running_relay(settings, db, redeclare_interval=60.0) as relay:
        await wait_idle(relay)  # connected, with its topology (the test queue) declared
        await amqp_channel.queue_delete(topology.queue_name("testq"))
        job_id = await submit(db, topology, "echo", EchoPayload(text="restored"))
        await wait_drained(db, timeout=20)
        text = await relay.metrics_text()

    assert metric(text, 'jobcore_relay_publish_failures_total{reason="returned"}') >= 1
    assert metric(text, 'jobcore_relay_topology_declares_total{result="declared"}') == 1
    assert metric(text, "jobcore_relay_quarantined_rows_total") == 0
    # The message waits in the queue the relay declared again.
    queue = await amqp_channel.declare_queue(topology.queue_name("testq"), passive=True)
    assert queue.declaration_result.message_count == 1
    async with running_worker(settings):
        done = await eventually(
            lambda: status_is(db, job_id, "succeeded", "failed"), timeout=30, what="the job"
        )
    assert done["status"] == "succeeded"


async def test_a_message_that_can_never_be_published_is_quarantined_alone_at_once(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    """Malformed and too large messages are quarantined on their first attempt; the rest of
    their batch is published. Sent, the header over frame_max would make the broker close
    the connection, and the exchange name AMQP cannot carry would raise out of the probe:
    every batch would fail behind them."""
    collector = await collect(amqp_channel, topology)
    bad = [
        *await fill_outbox(db, topology, 1, headers={"n": 2**70}),
        *await fill_outbox(db, topology, 1, exchange="e" * 300),
        *await fill_outbox(db, topology, 1, headers={"big": "x" * 200_000}),
        *await fill_outbox(db, topology, 1, body=b"x" * (64 * 1024 + 1)),
    ]
    good = await fill_outbox(db, topology, 200)
    async with running_relay(settings, db, max_message_bytes=64 * 1024) as relay:
        await wait_received(collector, {r["message_id"] for r in good}, timeout=20)

        async def all_quarantined() -> list[dict[str, Any]] | None:
            rows = [await outbox_row(db, r["id"]) for r in bad]
            done = all(r is not None and r["quarantined_at"] is not None for r in rows)
            return [r for r in rows if r is not None] if done else None

        rows = await eventually(all_quarantined, timeout=15, what="the bad rows quarantined")
        text = await relay.metrics_text()

    assert [r["attempts"] for r in rows] == [1, 1, 1, 1]
    assert [r["last_error"].split(":")[0] for r in rows] == [
        "malformed",
        "malformed",
        "too_large",
        "too_large",
    ]
    assert not {r["message_id"] for r in bad} & collector.distinct
    assert metric(text, "jobcore_relay_published_messages_total") == len(good)
    assert metric(text, "jobcore_relay_quarantined_rows_total") == len(bad)
    assert metric(text, 'jobcore_relay_publish_failures_total{reason="malformed"}') == 2
    assert metric(text, 'jobcore_relay_publish_failures_total{reason="too_large"}') == 2
    assert metric(text, "jobcore_relay_outbox_quarantined_rows") == len(bad)
    assert metric(text, "jobcore_relay_outbox_failing_rows") == 0


async def test_declaring_the_topology_again_is_throttled(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    """Hundreds of returns for a route the relay declares cost one declaration per
    interval. Here every declaration fails (the queue was recreated as a classic queue,
    unbound: the broker refuses our arguments for it), so the returns go on."""
    interval = 1.0
    async with running_relay(settings, db, redeclare_interval=interval) as relay:
        await wait_idle(relay)
        await amqp_channel.queue_delete(topology.queue_name("testq"))
        await amqp_channel.declare_queue(topology.queue_name("testq"), durable=True)
        started = time.monotonic()
        rows = await fill_outbox(db, topology, 100)

        async def returned_many_times() -> bool:
            attempts = [(await outbox_row(db, r["id"]) or {}).get("attempts", 0) for r in rows]
            return min(attempts) >= 5 and time.monotonic() - started >= 2.5 * interval

        await eventually(returned_many_times, timeout=30, what="rows returned many times")
        elapsed = time.monotonic() - started
        text = await relay.metrics_text()
        assert relay.running

    returns = metric(text, 'jobcore_relay_publish_failures_total{reason="returned"}')
    declares = metric(text, 'jobcore_relay_topology_declares_total{result="failed"}')
    assert returns >= 500
    assert 2 <= declares <= elapsed / interval + 1
    assert metric(text, 'jobcore_relay_topology_declares_total{result="declared"}') == 0
    assert metric(text, "jobcore_relay_quarantined_rows_total") == 0


async def test_requeue_resets_a_quarantined_rows_failing_clock(
    settings: Settings, db: Database, topology: Topology
) -> None:
    [row] = await fill_outbox(db, topology, 1, headers={"n": 2**70}, notify=False)
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE outbox SET attempts = 1, failing_since = now(), quarantined_at = now() "
            "WHERE id = %s",
            (row["id"],),
        )
    result = run_cli(settings, "outbox", "requeue", str(row["id"]))
    assert result.returncode == 0, result.stderr
    requeued = await outbox_row(db, row["id"])
    assert requeued is not None
    assert (requeued["attempts"], requeued["failing_since"]) == (0, None)
