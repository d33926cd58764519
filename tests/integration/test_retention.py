"""Retention (jobcore.maintenance.retention): what is pruned, what stays, what goes with a job."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, UnitOfWork
from jobcore.kernel.settings import Settings
from jobcore.maintenance.retention import STALE_FILE_AGE, Retention
from jobcore.storage.results import LocalResultStore
from tests.support.retention import (
    Made,
    age_file,
    audit_entry,
    inbox_row,
    make_job,
    own_rows,
    table_counts,
)

DAY = timedelta(days=1)
GONE = {"jobs": 0, "job_effects": 0, "webhook_deliveries": 0, "outbox": 0}


def kept(*, outbox: int = 0) -> dict[str, int]:
    return {"jobs": 1, "job_effects": 1, "webhook_deliveries": 1, "outbox": outbox}


async def test_each_status_and_type_keeps_its_own_retention(
    db: Database, topology: Topology, settings: Settings
) -> None:
    settings = settings.model_copy(
        update={"retention_types": {"echo": {"succeeded": timedelta(hours=1)}}}
    )
    store = LocalResultStore(settings.result_dir)

    async def job(status: str, age: timedelta | None, job_type: str = "noop") -> Made:
        return await make_job(
            db, topology, status=status, job_type=job_type, age=age, store=store, quarantined=True
        )

    doomed = [
        await job("succeeded", 8 * DAY),  # default 7 days
        await job("failed", 31 * DAY),  # default 30 days
        await job("cancelled", 31 * DAY),
        await job("succeeded", 2 * timedelta(hours=1), "echo"),  # its type's 1 hour
    ]
    spared = [
        await job("succeeded", 6 * DAY),
        await job("failed", 29 * DAY),
        await job("cancelled", 29 * DAY),
        await job("succeeded", timedelta(minutes=30), "echo"),
        await job("failed", 2 * timedelta(hours=1), "echo"),  # echo overrides succeeded only
        # Not finished: never pruned, whatever their timestamps say.
        await job("pending", None),
        await job("running", None),
    ]
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET created_at = now() - interval '400 days', "
            "updated_at = now() - interval '400 days' WHERE status IN ('pending', 'running')"
        )

    report = await Retention(settings, db).prune()

    assert report.complete
    for made in doomed:
        assert await own_rows(db, made.id) == GONE
        assert made.result_ref is not None
        assert not (settings.result_dir / made.result_ref).exists()
    for made in spared:
        assert await own_rows(db, made.id) == kept(outbox=1)
        assert made.result_ref is not None
        assert (settings.result_dir / made.result_ref).exists()
    assert dict(report.jobs) == {
        ("succeeded", "noop"): 1,
        ("failed", "noop"): 1,
        ("cancelled", "noop"): 1,
        ("succeeded", "echo"): 1,
    }
    assert {t: report.tables[t] for t in GONE} == {
        "jobs": 4,
        "job_effects": 4,
        "webhook_deliveries": 4,
        "outbox": 4,
    }
    assert report.tables["result_files"] == 4
    # A second pass finds nothing.
    assert sum((await Retention(settings, db).prune()).tables.values()) == 0


async def test_more_jobs_than_a_batch_go_in_several_short_transactions(
    db: Database, topology: Topology, settings: Settings
) -> None:
    for _ in range(10):
        await make_job(db, topology, effect=False, delivery=False)
    young = await make_job(db, topology, age=DAY)
    # What another session sees at the start of each batch: the earlier batches committed.
    seen: list[int] = []
    rests: list[float] = []

    async def fence(uow: UnitOfWork) -> bool:
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM jobs WHERE finished_at < now() - interval '7 days'"
            )
            row = await cur.fetchone()
        seen.append(int(row["n"]) if row else -1)
        return True

    async def pause(seconds: float) -> bool:
        rests.append(seconds)
        return False

    retention = Retention(settings, db, batch_size=3)
    report = await retention.prune(fence=fence, pause=pause, sweep_files=False)

    assert report.tables["jobs"] == 10
    assert seen[:5] == [10, 7, 4, 1, 0]  # four job batches (3, 3, 3, 1), then the inbox's
    assert len(rests) == 3  # a rest after each full batch, as long as it took
    assert all(seconds > 0 for seconds in rests)
    assert await own_rows(db, young.id) == kept()


async def test_inbox_rows_older_than_the_window_go(db: Database, settings: Settings) -> None:
    window = settings.inbox_retention
    old = [await inbox_row(db, age=window + timedelta(minutes=1)) for _ in range(5)]
    recent = await inbox_row(db, age=window - timedelta(minutes=1))

    report = await Retention(settings, db, batch_size=2).prune()

    assert report.tables["inbox"] == 5
    async with db.connection() as conn:
        cur = await conn.execute("SELECT message_id FROM inbox")
        left = {row["message_id"] for row in await cur.fetchall()}
    assert left == {recent}
    assert not left & set(old)


async def test_a_stopped_pass_is_reported_incomplete(
    db: Database, topology: Topology, settings: Settings
) -> None:
    for _ in range(4):
        await make_job(db, topology, effect=False, delivery=False)

    async def stop(_: float) -> bool:
        return True  # shutting down

    report = await Retention(settings, db, batch_size=2).prune(pause=stop)

    assert (report.complete, report.tables["jobs"]) == (False, 2)


async def test_leftover_result_files_are_swept_and_nothing_else(
    db: Database, topology: Topology, settings: Settings
) -> None:
    store = LocalResultStore(settings.result_dir)
    root = settings.result_dir
    stale = timedelta(seconds=STALE_FILE_AGE + 60)
    # A process died between a batch's commit and its unlinks: the row is gone, the file not.
    crashed = await make_job(db, topology, store=store)
    async with db.connection() as conn:
        await conn.execute("DELETE FROM jobs WHERE id = %s", (crashed.id,))
    assert crashed.result_ref is not None
    age_file(root / crashed.result_ref, stale)
    # The same, just now: the sweep waits until it has been unchanged long enough.
    recent = await make_job(db, topology, store=store)
    async with db.connection() as conn:
        await conn.execute("DELETE FROM jobs WHERE id = %s", (recent.id,))
    # A job still kept (a pending one), whose file is old.
    alive = await make_job(db, topology, status="pending", age=None, store=store)
    assert alive.result_ref is not None
    age_file(root / alive.result_ref, stale)
    # A temporary file an interrupted write left, and files that are not the store's.
    (root / ".tmp-abc123").write_bytes(b"half")
    age_file(root / ".tmp-abc123", stale)
    (root / "notes.txt").write_text("mine")
    age_file(root / "notes.txt", stale)
    (root / "outbox-mail").mkdir()

    dry = await Retention(settings, db).count()
    assert dry.tables["result_files"] == 2
    assert (root / crashed.result_ref).exists()

    report = await Retention(settings, db).prune()

    assert report.tables["result_files"] == 2
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [str(recent.result_ref), alive.result_ref, "notes.txt", "outbox-mail"]
    )
    # A pruned job's own file goes with it, sweep or not (the workers sweep hourly).
    await make_job(db, topology, store=store)
    assert (await Retention(settings, db).prune(sweep_files=False)).tables["result_files"] == 1


async def test_dry_run_counts_what_a_pass_deletes_and_changes_nothing(
    db: Database, topology: Topology, settings: Settings
) -> None:
    store = LocalResultStore(settings.result_dir)
    for status in ("succeeded", "succeeded", "failed"):
        await make_job(db, topology, status=status, age=31 * DAY, store=store, quarantined=True)
    await make_job(db, topology, age=DAY, store=store)
    await inbox_row(db, age=settings.inbox_retention + DAY)
    await audit_entry(db, age=settings.audit_retention + DAY)
    await audit_entry(db, age=settings.audit_retention - DAY)  # kept
    before = await table_counts(db)
    files = sorted(Path(settings.result_dir).iterdir())

    dry = await Retention(settings, db).count()

    assert await table_counts(db) == before
    assert sorted(Path(settings.result_dir).iterdir()) == files
    assert dry.dry_run
    assert dict(dry.jobs) == {("succeeded", "noop"): 2, ("failed", "noop"): 1}
    expected = {
        "jobs": 3,
        "job_effects": 3,
        "webhook_deliveries": 3,
        "outbox": 3,
        "inbox": 1,
        "audit_log": 1,
        "job_gates": 0,
        "job_keys": 0,
        "batches": 0,
        "workflows": 0,
        "result_files": 3,
    }
    assert dry.as_dict()["tables"] == expected
    done = await Retention(settings, db).prune()
    assert done.as_dict()["tables"] == expected
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM audit_log")
        assert await cur.fetchone() == {"n": 1}  # the recent entry


async def test_the_cascades_that_take_a_jobs_rows_are_index_backed(db: Database) -> None:
    """Every foreign key to jobs deletes with it, and has an index leading with its column
    (else each pruned job would scan the referencing table)."""
    async with db.connection() as conn:
        cur = await conn.execute(
            """
            SELECT c.conrelid::regclass::text AS tab, a.attname AS col, c.confdeltype,
                   EXISTS (
                       SELECT 1 FROM pg_index i
                       WHERE i.indrelid = c.conrelid AND i.indkey[0] = c.conkey[1]
                         AND i.indpred IS NULL
                   ) AS indexed
            FROM pg_constraint c
            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
            WHERE c.contype = 'f' AND c.confrelid = 'jobs'::regclass
            ORDER BY 1
            """
        )
        rows = [dict(r) for r in await cur.fetchall()]
    assert rows == [
        {"tab": "job_effects", "col": "job_id", "confdeltype": "c", "indexed": True},
        # The idempotency keys of requests that joined a debounced or throttled job.
        {"tab": "job_key_joins", "col": "job_id", "confdeltype": "c", "indexed": True},
        # No job_events: its rows are deleted by the pruner's own statement (migration 0019).
        # The example job type credit_account's entries (migration 0013).
        {"tab": "ledger_entries", "col": "job_id", "confdeltype": "c", "indexed": True},
        {"tab": "webhook_deliveries", "col": "job_id", "confdeltype": "c", "indexed": True},
    ]


async def test_a_pruned_jobs_timeline_goes_with_it(
    db: Database, topology: Topology, settings: Settings
) -> None:
    doomed = await make_job(db, topology, status="succeeded", age=8 * DAY)
    spared = await make_job(db, topology, status="succeeded", age=6 * DAY)
    # Events as the worker's outcome writes them (`accepted` is the job row itself). No
    # foreign key cascades them (migration 0019): the pruner deletes them by the job's id.
    async with db.connection() as conn:
        for made in (doomed, spared):
            await conn.execute(
                "INSERT INTO job_events (job_id, kind, attempt, detail)"
                " VALUES (%s, 'claimed', 1, '{}'), (%s, 'finished', 1, '{}')",
                (made.id, made.id),
            )

    async def events(made: Made) -> list[str]:
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT kind FROM job_events WHERE job_id = %s ORDER BY id", (made.id,)
            )
            return [row["kind"] for row in await cur.fetchall()]

    assert await events(doomed) == await events(spared) == ["claimed", "finished"]
    report = await Retention(settings, db).prune()
    assert report.complete
    assert await own_rows(db, doomed.id) == GONE
    assert await events(doomed) == []
    assert await events(spared) == ["claimed", "finished"]
