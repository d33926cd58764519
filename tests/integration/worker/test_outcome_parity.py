"""The worker and the testing kit's InlineWorker write the same outcomes.

Both decide an attempt's outcome through :mod:`jobcore.execution.outcomes`; this runs the same jobs
through a real worker (the broker in the middle) and through an InlineWorker on a database
of its own, and compares the rows they leave: status, attempts, last_error, result (and a
result in the store), effects. Ids, timestamps and lease tokens are left out.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.storage.objectstore import open_result_store
from jobcore.testing import InlineWorker
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.support import OutboxPump, submit, worker_settings
from tests.support import databases
from tests.support.services import ServiceUrls

# Small limits, so that a result and a payload go to the store without megabytes.
INLINE_RESULT_MAX_BYTES = 1000
INLINE_PAYLOAD_MAX_BYTES = 200
# A payload that no longer validates (wt_gate's model forbids unknown fields).
INVALID_PAYLOAD = '{"bogus": 1}'


@dataclass(frozen=True)
class Case:
    job_type: str
    payload: dict[str, Any] = field(default_factory=dict)
    # What the job ends as: checked on both sides, so the comparison compares something.
    status: str = "succeeded"
    # Made invalid after the enqueue, as when the job type's model changed since.
    invalidate: bool = False
    max_attempts: int | None = None


CASES = {
    "succeeds": Case("wt_gate"),
    "result_too_large_for_the_row": Case("wt_gate", {"result_size": 3 * INLINE_RESULT_MAX_BYTES}),
    "retried_then_succeeds": Case("wt_gate", {"fail_times": 1}),
    "retries_exhausted": Case("wt_gate", {"fail_times": 9}, status="failed"),
    "last_attempt_fails": Case("wt_gate", {"fail_times": 9}, status="failed", max_attempts=1),
    "permanent_error": Case("wt_gate", {"permanent": True}, status="failed"),
    "invalid_payload": Case("wt_gate", status="failed", invalidate=True),
    "payload_by_reference": Case("wt_blob", {"data": "d" * 2 * INLINE_PAYLOAD_MAX_BYTES}),
    "timed_out": Case("wt_slow", {"seconds": 30}, status="failed"),
    "unstorable_error": Case("wt_unstorable_error", status="failed"),
    "unstorable_result": Case("wt_nul_result", status="failed"),
    "result_file_and_too_large_result": Case("wt_file_and_result", status="failed"),
    "cancelled_while_running": Case("wt_cancel_self", status="cancelled"),
    "cancelled_then_failed": Case("wt_cancel_then_fail", status="cancelled"),
    "cancelled_itself": Case("wt_self_cancelled", status="failed"),
}

TERMINAL = ("succeeded", "failed", "cancelled")

OUTCOME_COLUMNS = """
    SELECT type, status, attempts, max_attempts, last_error, result, result_ref,
           payload, payload_ref IS NOT NULL AS payload_by_reference,
           cancel_requested_at IS NOT NULL AS cancel_requested,
           finished_at IS NOT NULL AS finished, lease_token IS NOT NULL AS leased
    FROM jobs WHERE id = %s
"""
EFFECTS = "SELECT kind, detail FROM job_effects WHERE job_id = %s ORDER BY kind, detail::text"


@pytest.fixture
def wsettings(settings: Settings) -> Settings:
    return worker_settings(
        settings,
        inline_result_max_bytes=INLINE_RESULT_MAX_BYTES,
        inline_payload_max_bytes=INLINE_PAYLOAD_MAX_BYTES,
    )


@pytest.fixture
async def kit_db(
    service_urls: ServiceUrls, template_database: str, wsettings: Settings, tmp_path: Path
) -> AsyncIterator[Database]:
    """A database (and result directory) of the InlineWorker's own, set as the worker's."""
    name = databases.create_database(service_urls.pg_admin_url, template=template_database)
    try:
        settings = wsettings.model_copy(
            update={
                "database_url": databases.with_database(service_urls.pg_admin_url, name),
                "result_dir": tmp_path / "kit-results",
            }
        )
        # The test's own statements name jobcore's tables unqualified (tests.support.databases).
        database = Database(
            settings.model_copy(
                update={"database_url": databases.with_search_path(settings.database_url)}
            )
        )
        await database.open(wait=True)
        try:
            yield database
        finally:
            await database.close()
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


async def invalidate(db: Database, job_id: uuid.UUID) -> None:
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET payload = %s::jsonb WHERE id = %s", (INVALID_PAYLOAD, job_id)
        )


async def outcome_of(db: Database, job_id: uuid.UUID) -> dict[str, Any]:
    """The job's row as its outcome left it, without ids, timestamps and lease tokens; a
    result in the store by its content."""
    async with db.connection() as conn:
        row = await (await conn.execute(OUTCOME_COLUMNS, (job_id,))).fetchone()
        effects = await (await conn.execute(EFFECTS, (job_id,))).fetchall()
    assert row is not None
    outcome = dict(row)
    ref = outcome.pop("result_ref")
    if ref is not None:
        # Keys name the job; what they hold must be the same.
        stored = open_result_store(db.settings).get(ref)
        outcome["stored_result"] = orjson.loads(stored) if ref.endswith(".json") else stored
    outcome["effects"] = [dict(effect) for effect in effects]
    return outcome


async def test_the_worker_and_the_inline_worker_write_the_same_outcomes(
    db: Database,
    kit_db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    pump.paused.set()  # publish nothing until every job is as the case wants it
    store = open_result_store(wsettings)
    kit = InlineWorker(kit_db)
    worker_jobs: dict[str, uuid.UUID] = {}
    kit_jobs: dict[str, uuid.UUID] = {}
    for name, case in CASES.items():
        model = default_registry.get(case.job_type).validate_payload(case.payload)
        worker_jobs[name] = await submit(
            db,
            topology,
            case.job_type,
            model,
            max_attempts=case.max_attempts,
            # As the API enqueues (and the InlineWorker does): a large payload by reference.
            payload_store=store,
            inline_payload_max_bytes=wsettings.inline_payload_max_bytes,
        )
        kit_jobs[name] = await kit.enqueue(
            case.job_type, case.payload, tenant="t", max_attempts=case.max_attempts
        )
        if case.invalidate:
            await invalidate(db, worker_jobs[name])
            await invalidate(kit_db, kit_jobs[name])

    await kit.drain()
    await start_worker()
    pump.paused.clear()

    async def all_ended() -> bool:
        async with db.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s) AND status = ANY(%s)",
                (list(worker_jobs.values()), list(TERMINAL)),
            )
            row = await cursor.fetchone()
        assert row is not None
        return bool(row["n"] == len(worker_jobs))

    await eventually(all_ended, what="every job to end in the worker", timeout=60)

    for name, case in CASES.items():
        by_worker = await outcome_of(db, worker_jobs[name])
        by_kit = await outcome_of(kit_db, kit_jobs[name])
        assert by_worker["status"] == case.status, (name, by_worker["last_error"], by_kit)
        assert by_kit == by_worker, name
    # The cases reach what they are named for (on both sides, being equal).
    large = await outcome_of(db, worker_jobs["result_too_large_for_the_row"])
    assert large["result"] is None
    assert "stored_result" in large
    assert (await outcome_of(db, worker_jobs["payload_by_reference"]))["payload_by_reference"]
    retried = await outcome_of(db, worker_jobs["retried_then_succeeds"])
    assert (retried["attempts"], retried["last_error"]) == (
        2,
        "RuntimeError: planned failure on attempt 1",
    )
