"""/metrics on the API, the relay and the worker after a small workload through the real
processes: the counters count what happened, the backlog gauges read empty."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from jobcore.kernel.settings import Settings
from tests.e2e.stack import E2EStack, until
from tests.integration.worker.support import relayed
from tests.support.promlint import lint

pytestmark = pytest.mark.timeout(240)

JOBS = 20
QUEUE = "testq"  # the echo job type's queue (libs/jobcore/testing/jobtypes.py)


@pytest.fixture
async def stack(settings: Settings, tmp_path: Path) -> AsyncIterator[E2EStack]:
    # Tracing off here: the metrics do not depend on it.
    # Relayed: the counters of a delivery and a publish, for every job.
    stack = E2EStack(relayed(settings), tmp_path, env={"OTEL_SDK_DISABLED": "true"})
    try:
        await stack.start()
        yield stack
    finally:
        await stack.stop()


async def test_counters_and_backlog_gauges_after_20_jobs(stack: E2EStack) -> None:
    async with stack.client() as client:
        answers = await asyncio.gather(
            *(client.post("/jobs/echo", json={"text": f"job {n}"}) for n in range(JOBS))
        )
        assert [a.status_code for a in answers] == [202] * JOBS
        rejected = await client.post("/jobs/echo", json={"text": 1})
        assert rejected.status_code == 422
        for answer in answers:
            await stack.wait_status(client, answer.json()["job_id"], "succeeded")

    api = await stack.scrape("api")
    enqueued = "jobcore_api_enqueue_requests_total"
    assert api[(enqueued, (("result", "accepted"), ("type", "echo")))] == JOBS
    assert api[(enqueued, (("result", "rejected"), ("type", "echo")))] == 1
    assert api[(enqueued, (("result", "replayed"), ("type", "echo")))] == 0
    assert api[("jobcore_api_jobs_enqueued_total", (("type", "echo"),))] == JOBS

    worker = await stack.scrape("worker")
    echo = (("type", "echo"),)
    assert worker[("jobcore_worker_jobs_completed_total", (("status", "succeeded"), *echo))] == JOBS
    assert worker[("jobcore_worker_jobs_processed_total", (("outcome", "succeeded"),))] == JOBS
    assert worker[("jobcore_worker_job_attempts_count", echo)] == JOBS
    assert worker[("jobcore_worker_job_attempts_sum", echo)] == JOBS  # one attempt each
    assert worker[("jobcore_worker_handler_seconds_count", echo)] == JOBS
    assert worker[("jobcore_worker_time_to_start_seconds_count", echo)] == JOBS
    assert worker[("jobcore_worker_time_to_complete_seconds_count", echo)] == JOBS
    # Completing comes after starting, for every job.
    assert (
        worker[("jobcore_worker_time_to_complete_seconds_sum", echo)]
        >= worker[("jobcore_worker_time_to_start_seconds_sum", echo)]
    )
    assert worker[("jobcore_worker_duplicate_messages_total", ())] == 0
    assert worker[("jobcore_worker_retries_scheduled_total", ())] == 0
    assert worker[("jobcore_worker_running_handlers", ())] == 0
    # Per queue, for the alert on a queue whose deliveries stopped (the webhook queue
    # starts at 0: no job here has a callback).
    assert worker[("jobcore_worker_deliveries_total", (("queue", QUEUE),))] == JOBS
    assert worker[("jobcore_worker_deliveries_total", (("queue", "webhooks"),))] == 0
    for outcome in ("delivered", "retry", "failed"):
        assert worker[("jobcore_worker_webhook_attempts_total", (("outcome", outcome),))] == 0

    # The relay: everything published, nothing waiting (gauges are cached for a second,
    # so poll until a scrape after the last job reads the empty backlog).
    relay: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    async def drained() -> bool:
        relay.update(await stack.scrape("relay"))
        return (
            relay[("jobcore_jobs_pending", (("queue", QUEUE),))] == 0
            and relay[("jobcore_jobs_running", (("queue", QUEUE),))] == 0
            and relay[("jobcore_queue_messages", (("queue", QUEUE),))] == 0
        )

    await until(drained, timeout=30, what="the relay's backlog gauges to read empty")
    assert relay[("jobcore_relay_published_messages_total", ())] == JOBS
    assert relay[("jobcore_relay_outbox_due_rows", ())] == 0
    assert relay[("jobcore_relay_outbox_quarantined_rows", ())] == 0
    assert relay[("jobcore_relay_outbox_oldest_due_age_seconds", ())] == 0
    assert relay[("jobcore_relay_batch_confirm_seconds_count", ())] >= 1
    assert relay[("jobcore_relay_broker_connected", ())] == 1
    assert relay[("jobcore_queue_consumers", (("queue", QUEUE),))] >= 1  # the worker
    assert relay[("jobcore_dead_letter_queue_messages", ())] == 0
    assert relay.get(("jobcore_backlog_refresh_failures_total", (("source", "broker"),)), 0) == 0

    # What each process serves follows the naming rules (promtool's lint, units in names).
    roles = ("api", "relay", "worker")
    served = {role: lint(await stack.metrics_text(role)) for role in roles}
    assert served == {role: [] for role in roles}


async def test_backlog_gauges_count_what_waits(stack: E2EStack) -> None:
    """Jobs scheduled for later wait as pending (not as an outbox backlog): the gauges
    tell them apart."""
    async with stack.client() as client:
        for n in range(3):
            answer = await client.post("/jobs/echo", params={"delay": 3600}, json={"text": f"{n}"})
            assert answer.status_code == 202

    relay: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    async def counted() -> bool:
        relay.update(await stack.scrape("relay"))
        return relay.get(("jobcore_jobs_pending", (("queue", QUEUE),))) == 3

    await until(counted, timeout=30, what="three pending jobs on the relay's /metrics")
    assert relay[("jobcore_relay_outbox_due_rows", ())] == 0  # scheduled, not due
    assert relay[("jobcore_queue_messages", (("queue", QUEUE),))] == 0
