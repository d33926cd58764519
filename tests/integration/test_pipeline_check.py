"""The fault harness's final check still sees jobs and effects that a pruner deleted.

The chaos soak runs the pruner during faults; without the archive, a pruned job would
count as lost and its duplicated effect would vanish with it.
"""

from __future__ import annotations

import uuid

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute
from jobcore.database.sql import Query
from jobcore.testing.jobtypes import EffectPayload
from jobcore.testing.pipeline import archive_pruned, check
from tests.integration.worker.support import submit

FINISH_WITH_EFFECTS = Query(
    "test_finish_with_effects",
    "Mark a job succeeded and record `n` effects for it.",
    """
    WITH done AS (
        UPDATE jobs SET status = 'succeeded', attempts = 1, finished_at = now()
        WHERE id = %(id)s RETURNING id
    )
    INSERT INTO job_effects (job_id, attempt, kind)
    SELECT done.id, 1, 'effect' FROM done, generate_series(1, %(n)s)
    """,
)
DELETE_JOB = Query(
    "test_delete_job", "Delete a job as the pruner would.", "DELETE FROM jobs WHERE id = %(id)s"
)


async def _finished_job(db: Database, topology: Topology, effects: int) -> uuid.UUID:
    job_id = await submit(db, topology, "effect", EffectPayload())
    async with db.unit_of_work() as uow:
        await execute(uow, FINISH_WITH_EFFECTS({"id": job_id, "n": effects}))
        await execute(uow, DELETE_JOB({"id": job_id}))
        await uow.commit()
    return job_id


async def test_pruned_jobs_and_effects_still_count(db: Database, topology: Topology) -> None:
    await archive_pruned(db)
    await archive_pruned(db)  # idempotent: a restarted harness installs it again
    once = await _finished_job(db, topology, effects=1)
    twice = await _finished_job(db, topology, effects=2)

    report = await check(db, "t", [str(once), str(twice)])

    assert report.accepted == 2
    assert report.jobs == 2
    assert report.lost == 0
    assert report.statuses == {"succeeded": 2}
    assert report.missing_effects == 0
    assert report.duplicate_effects == 1  # the doubled effect is still caught
    assert report.pruned == 2


async def test_without_the_archive_a_pruned_job_is_lost(db: Database, topology: Topology) -> None:
    job_id = await _finished_job(db, topology, effects=1)

    report = await check(db, "t", [str(job_id)])

    assert report.lost == 1


FAIL_JOB = Query(
    "test_fail_job",
    "Mark a job failed after `attempts` attempts, with the attempt its handler last reported.",
    """
    UPDATE jobs SET status = 'failed', attempts = %(attempts)s, finished_at = now(),
                    progress_fraction = CASE WHEN %(reported)s::int IS NOT NULL THEN 0 END,
                    progress_attempt = %(reported)s, progress_updated_at = now()
    WHERE id = %(id)s
    """,
)


async def _failed_job(
    db: Database, topology: Topology, *, reported: int | None, pruned: bool
) -> uuid.UUID:
    job_id = await submit(db, topology, "effect", EffectPayload())
    async with db.unit_of_work() as uow:
        await execute(uow, FAIL_JOB({"id": job_id, "attempts": 1, "reported": reported}))
        if pruned:
            await execute(uow, DELETE_JOB({"id": job_id}))
        await uow.commit()
    return job_id


async def test_a_job_failed_without_its_handler_having_run_is_counted(
    db: Database, topology: Topology
) -> None:
    await archive_pruned(db)
    ran = await _failed_job(db, topology, reported=1, pruned=False)
    never_ran = await _failed_job(db, topology, reported=None, pruned=False)
    never_ran_pruned = await _failed_job(db, topology, reported=None, pruned=True)

    report = await check(db, "t", [str(ran), str(never_ran), str(never_ran_pruned)])

    assert report.statuses == {"failed": 3}
    assert report.failed_without_handler == 2
    assert not report.ok
