"""Retention: finished jobs, settled batches, inbox rows, result files, audit entries, idle
gate rows and spent debounce and throttle keys go once their time is up; open batches left
idle are closed, to settle and go in turn.

The use case behind the workers' pruner, ``jobcore prune`` and (later) a console: one
*pass* deletes everything past its retention (``JOBCORE_RETENTION_*``,
``JOBCORE_BATCH_RETENTION``, ``JOBCORE_BATCH_OPEN_TIMEOUT``, ``JOBCORE_INBOX_RETENTION``,
``JOBCORE_AUDIT_RETENTION``, ``JOBCORE_GATE_RETENTION``: jobcore.database.store.GateStore,
which also bounds ``job_keys``: jobcore.database.store.JobKeyStore), in batches of
``JOBCORE_PRUNER_BATCH_SIZE``, each batch its own short transaction, with a rest after
each batch as long as the batch took, so a backlog drains at about half the database's
deleting speed instead of in one storm.

What goes with a job: its webhook deliveries, its recorded effects, its quarantined outbox
rows (all in the job's transaction) and its result file (just after that commits). A
process that dies between the commit and the unlink leaves the file behind; so does an
attempt that stored a result and then failed or lost its lease (each attempt writes a
file of its own, jobcore.storage.results.result_key). The *file sweep* deletes such files once
unchanged for :data:`STALE_FILE_AGE`: result files whose job is gone, or ended naming
another file, and temporary files of interrupted writes. No file outlives its job, or the
end of its job's last attempt, by more than that plus one sweep.

Pruning a job deletes nothing another process needs: a message still on its way for a
pruned job finds no job and is acknowledged with no effect, and an inbox row pruned after
the window leaves a very late redelivery to the claim's fence, which lets no message run
an attempt twice.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from jobcore.database.gateway import UnitOfWork, lock_wait_ran_out
from jobcore.database.store import (
    JobFilesKeptParams,
    JobPruneCountParams,
    MaintenanceLeaseParams,
    audit_log_store,
    batch_store,
    database_store,
    gate_store,
    inbox_store,
    job_key_store,
    job_store,
    maintenance_lease_store,
)
from jobcore.database.store.audit_log import AuditLogPruneCountParams
from jobcore.database.store.batches import BatchIdleParams
from jobcore.database.store.gates import JobGatesPruneCountParams
from jobcore.database.store.inbox import InboxPruneCountParams
from jobcore.database.store.workflows import workflow_store
from jobcore.kernel.errors import DatabaseUnavailable, JobcoreError
from jobcore.kernel.settings import Settings
from jobcore.maintenance.connection import Transactions
from jobcore.storage.objectstore import open_result_store
from jobcore.storage.results import ResultStore

log = logging.getLogger(__name__)

# The maintenance lease (maintenance_leases.name) every pruner takes: the workers' and
# `jobcore prune`'s, so only one runs at a time.
LEASE_NAME = "pruner"
# What a pass counts, by table (result files count as "result_files").
TABLES = (
    "jobs",
    "job_effects",
    "webhook_deliveries",
    "outbox",
    "inbox",
    "audit_log",
    "job_gates",
    "batches",
    "job_keys",
    "workflows",
    "result_files",
)
# A result file is swept only when unchanged this long: a write in progress (a temporary
# file) or a result whose job row is being written is never mistaken for a leftover.
STALE_FILE_AGE = 3600.0
# Job ids looked up per statement by the file sweep.
SWEEP_CHUNK = 1000

# Run first in each batch's transaction (the lease renewal); False: stop the pass there.
Fence = Callable[[UnitOfWork], Awaitable[bool]]
# Called after each batch with how long it took; True: stop the pass (shutting down).
Pause = Callable[[float], Awaitable[bool]]
# Called with each committed batch's counts by table.
BatchHook = Callable[[collections.Counter[str]], None]


class PrunerBusy(JobcoreError):
    """Another pruner holds the pruner lease."""


@dataclass(frozen=True)
class Kind:
    """One (status, type) of finished jobs, its retention and its oldest job's age."""

    status: str
    type: str
    keep: timedelta
    oldest_age: float

    @property
    def overdue(self) -> float:
        """Seconds its oldest job is past its retention (0: none is)."""
        return max(0.0, self.oldest_age - self.keep.total_seconds())


@dataclass
class PruneReport:
    """What one pass deleted (or, dry, would delete)."""

    dry_run: bool
    kinds: list[Kind]
    jobs: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    tables: collections.Counter[str] = field(default_factory=collections.Counter)
    batches: int = 0
    # Open batches closed for having taken no member for JOBCORE_BATCH_OPEN_TIMEOUT (dry:
    # that would be). Not a deletion: each is pruned once settled, as any batch.
    batches_closed: int = 0
    # False when the pass stopped early (its lease was lost, or the process is stopping),
    # or left a step for next time (a batch waited for a lock past the pass's lock_timeout).
    complete: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "complete": self.complete,
            "jobs": [
                {
                    "status": kind.status,
                    "type": kind.type,
                    "retention_seconds": kind.keep.total_seconds(),
                    "oldest_age_seconds": round(kind.oldest_age, 3),
                    "jobs": self.jobs[(kind.status, kind.type)],
                }
                for kind in self.kinds
            ],
            "tables": {table: self.tables[table] for table in TABLES},
            "batches": self.batches,
            "batches_closed": self.batches_closed,
        }


@dataclass
class _Batch:
    """One batch: rows deleted by table (and finished jobs by status and type), whether it
    was full (look again), and the result files to delete once it committed."""

    counts: collections.Counter[str]
    full: bool
    jobs: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    files: list[str] = field(default_factory=list)
    # Open batches it closed (the idle-batch step's).
    closed: int = 0


async def _rest(seconds: float) -> bool:
    await asyncio.sleep(seconds)
    return False


class Retention:
    """Prune once, count what would be pruned, or survey the finished jobs."""

    def __init__(
        self,
        settings: Settings,
        db: Transactions,
        *,
        store: ResultStore | None = None,
        batch_size: int | None = None,
        lock_timeout: float | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.store = store if store is not None else open_result_store(settings)
        self.batch_size = batch_size or settings.pruner_batch_size
        # How long a batch waits for a lock before it gives its step up until the next pass
        # (None: as long as it takes). The maintenance leader's pruner shares one connection
        # with every other service: a batch waiting for a row someone holds (a webhook
        # delivery being updated, say) would keep their turns until it got it.
        self.lock_timeout = lock_timeout

    async def survey(self) -> list[Kind]:
        """Every (status, type) of finished jobs, with its retention and oldest job."""
        async with self.db.session() as session:
            rows = await job_store.terminal_kinds(session)
        return [
            Kind(
                status=row["status"],
                type=row["type"],
                keep=self.settings.retention(row["status"], row["type"]),
                oldest_age=float(row["oldest_age"]),
            )
            for row in rows
        ]

    async def count(self) -> PruneReport:
        """What :meth:`prune` would delete now, changing nothing (``--dry-run``)."""
        kinds = await self.survey()
        report = PruneReport(dry_run=True, kinds=kinds)
        async with self.db.unit_of_work() as uow:
            if kinds:
                for row in await job_store.prune_count(uow, _rules(kinds)):
                    report.jobs[(row["status"], row["type"])] = row["jobs"]
                    for table in ("jobs", "job_effects", "webhook_deliveries", "outbox"):
                        report.tables[table] += row[table]
                    report.tables["result_files"] += row["result_files"]
            inbox = await inbox_store.prune_count(uow, self._inbox_params())
            report.tables["inbox"] = inbox["inbox"] if inbox else 0
            audit = await audit_log_store.prune_count(uow, self._audit_params())
            report.tables["audit_log"] = audit["audit_log"] if audit else 0
            gates = await gate_store.prune_count(uow, self._gates_params())
            report.tables["job_gates"] = gates["job_gates"] if gates else 0
            keys = await job_key_store.prune_count(uow, self._gates_params())
            report.tables["job_keys"] = keys["job_keys"] if keys else 0
            report.batches_closed = await batch_store.idle_count(uow, self._idle_params())
            report.tables["batches"] = await batch_store.prune_count(
                uow, {"keep": self.settings.batch_retention.total_seconds()}
            )
        orphans, _ = await self._sweep_files(None, delete=False)
        report.tables["result_files"] += orphans
        return report

    async def prune(
        self,
        *,
        fence: Fence | None = None,
        pause: Pause = _rest,
        on_batch: BatchHook | None = None,
        sweep_files: bool = True,
    ) -> PruneReport:
        """One full pass: finished jobs (with what goes with them), then inbox rows, then
        audit entries, then (with ``sweep_files``) leftover result files. Stops early,
        ``complete=False``, when ``fence`` or ``pause`` says so."""
        kinds = await self.survey()
        report = PruneReport(dry_run=False, kinds=kinds)

        def committed(batch: _Batch) -> None:
            report.batches += 1
            report.batches_closed += batch.closed
            report.tables.update(batch.counts)
            report.jobs.update(batch.jobs)
            if on_batch is not None:
                on_batch(batch.counts)

        async def jobs_batch(uow: UnitOfWork) -> _Batch:
            rows = await job_store.prune_batch(uow, {**_rules(kinds), "limit": self.batch_size})
            batch = _Batch(collections.Counter(jobs=len(rows)), len(rows) >= self.batch_size)
            for table in ("job_effects", "webhook_deliveries", "outbox"):
                batch.counts[table] = rows[0][table] if rows else 0
            batch.jobs.update((row["status"], row["type"]) for row in rows)
            # Its result and a payload stored by reference go with the job.
            batch.files = [
                ref for row in rows for ref in (row["result_ref"], row["payload_ref"]) if ref
            ]
            return batch

        async def inbox_batch(uow: UnitOfWork) -> _Batch:
            deleted = await inbox_store.prune_batch(
                uow, {**self._inbox_params(), "limit": self.batch_size}
            )
            return _Batch(collections.Counter(inbox=deleted), deleted >= self.batch_size)

        async def audit_batch(uow: UnitOfWork) -> _Batch:
            deleted = await audit_log_store.prune_batch(
                uow, {**self._audit_params(), "limit": self.batch_size}
            )
            return _Batch(collections.Counter(audit_log=deleted), deleted >= self.batch_size)

        async def gates_batch(uow: UnitOfWork) -> _Batch:
            deleted = await gate_store.prune_batch(
                uow, {**self._gates_params(), "limit": self.batch_size}
            )
            return _Batch(collections.Counter(job_gates=deleted), deleted >= self.batch_size)

        async def keys_batch(uow: UnitOfWork) -> _Batch:
            deleted = await job_key_store.prune_batch(
                uow, {**self._gates_params(), "limit": self.batch_size}
            )
            return _Batch(collections.Counter(job_keys=deleted), deleted >= self.batch_size)

        async def idle_batches_batch(uow: UnitOfWork) -> _Batch:
            # An open batch nobody closes would never settle, nor be pruned: after
            # JOBCORE_BATCH_OPEN_TIMEOUT without a new member it is closed, its callbacks
            # firing as for any close. One a transaction (see BATCH_CLOSE_IDLE).
            closed = await batch_store.close_idle(uow, self._idle_params())
            done = _Batch(collections.Counter(), full=closed is not None)
            done.closed = int(closed is not None)
            return done

        async def batches_batch(uow: UnitOfWork) -> _Batch:
            row = await batch_store.prune(
                uow,
                {"keep": self.settings.batch_retention.total_seconds(), "limit": self.batch_size},
            )
            gone, members = (int(row["batches"]), int(row["jobs"])) if row else (0, 0)
            return _Batch(collections.Counter(batches=gone, jobs=members), gone >= self.batch_size)

        async def workflows_batch(uow: UnitOfWork) -> _Batch:
            # A finished workflow goes whole, its jobs with it, once the longest retention
            # of its jobs' statuses has passed.
            keep = max(
                self.settings.retention(status, "").total_seconds()
                for status in ("succeeded", "failed", "cancelled")
            )
            row = await workflow_store.prune_batch(uow, {"keep": keep, "limit": self.batch_size})
            gone = int(row["workflows"])
            batch = _Batch(
                collections.Counter(workflows=gone, jobs=int(row["jobs"])), gone >= self.batch_size
            )
            batch.files = [*(row["result_refs"] or ()), *(row["payload_refs"] or ())]
            return batch

        # Gates after jobs: an ordering key's row goes once its last job has gone.
        steps = [jobs_batch] if kinds else []
        # Idle open batches are closed before the settled ones are pruned: one closed with
        # its members settled is settled now, and is pruned JOBCORE_BATCH_RETENTION later.
        steps += [
            workflows_batch,
            idle_batches_batch,
            batches_batch,
            inbox_batch,
            audit_batch,
            gates_batch,
            keys_batch,
        ]
        for step in steps:
            try:
                if not await self._batches(step, fence, pause, committed):
                    report.complete = False
                    return report
            except DatabaseUnavailable as exc:
                if not lock_wait_ran_out(exc):
                    raise
                # The batch rolled back: what it would have deleted waits for the next pass.
                log.info(
                    "a prune batch waited for a lock past its lock_timeout; its step is left "
                    "for the next pass",
                    extra={"step": step.__name__, "lock_timeout": self.lock_timeout},
                )
                report.complete = False
        if sweep_files:
            _, report.complete = await self._sweep_files(fence, delete=True, on_chunk=committed)
        return report

    async def _batches(
        self,
        step: Callable[[UnitOfWork], Awaitable[_Batch]],
        fence: Fence | None,
        pause: Pause,
        committed: Callable[[_Batch], None],
    ) -> bool:
        """Run ``step`` in one transaction after another until a batch is not full;
        False if the fence or the pause stopped it first."""
        while True:
            started = time.monotonic()
            async with self.db.unit_of_work() as uow:
                if fence is not None and not await fence(uow):
                    return False
                if self.lock_timeout is not None:
                    # After the fence: only the batch's own statements give up.
                    milliseconds = max(1, round(self.lock_timeout * 1000))
                    await database_store.set_lock_timeout(uow, {"milliseconds": milliseconds})
                batch = await step(uow)
                await uow.commit()
            # Only now: a batch that rolled back keeps its jobs, so it keeps their files.
            if batch.files:
                batch.counts["result_files"] = await self._delete_files(batch.files)
            committed(batch)
            if not batch.full:
                return True
            if await pause(time.monotonic() - started):
                return False

    def _idle_params(self) -> BatchIdleParams:
        return {"idle": self.settings.batch_open_timeout.total_seconds()}

    def _inbox_params(self) -> InboxPruneCountParams:
        return {"keep": self.settings.inbox_retention.total_seconds()}

    def _audit_params(self) -> AuditLogPruneCountParams:
        return {"keep": self.settings.audit_retention.total_seconds()}

    def _gates_params(self) -> JobGatesPruneCountParams:
        return {"keep": self.settings.gate_retention.total_seconds()}

    async def _delete_files(self, names: Sequence[str]) -> int:
        """Delete result-store files off the event loop; a failure is logged, never raised
        (the next file sweep tries again)."""

        def delete_all() -> int:
            deleted = 0
            for name in names:
                try:
                    deleted += self.store.delete(name)
                except OSError as exc:
                    log.warning(
                        "could not delete a result file; the file sweep tries again",
                        extra={"file": name, "error": str(exc)},
                    )
            return deleted

        return await asyncio.to_thread(delete_all)

    async def _sweep_files(
        self,
        fence: Fence | None,
        *,
        delete: bool,
        on_chunk: Callable[[_Batch], None] | None = None,
    ) -> tuple[int, bool]:
        """Find (and with ``delete``, delete) stale result-store files no job needs
        (``JOB_FILES_KEPT``), and stale temporary files. The directory is read in a thread, a
        chunk at a time. Returns the files found and whether the sweep finished."""
        listing: Iterator[tuple[str, uuid.UUID | None]] = self.store.stale_files(STALE_FILE_AGE)

        def next_chunk() -> list[tuple[str, uuid.UUID | None]]:
            return list(itertools.islice(listing, SWEEP_CHUNK))

        found = 0
        try:
            while chunk := await asyncio.to_thread(next_chunk):
                owned = [(job_id, name) for name, job_id in chunk if job_id is not None]
                params: JobFilesKeptParams = {
                    "ids": [job_id for job_id, _ in owned],
                    "keys": [name for _, name in owned],
                }
                async with self.db.unit_of_work() as uow:
                    if fence is not None and not await fence(uow):
                        return found, False
                    rows = await job_store.files_kept(uow, params) if owned else []
                    await uow.commit()
                kept = {row["key"] for row in rows}
                orphans = [name for name, _ in chunk if name not in kept]
                found += len(orphans)
                if delete and orphans:
                    deleted = await self._delete_files(orphans)
                    if on_chunk is not None:
                        on_chunk(_Batch(collections.Counter(result_files=deleted), full=False))
        except OSError as exc:
            log.warning(
                "could not read the result store; the file sweep tries again later",
                extra={"error": str(exc)},
            )
        return found, True


def _rules(kinds: Sequence[Kind]) -> JobPruneCountParams:
    """The retention rules as the statements take them: parallel arrays, one per kind."""
    return {
        "statuses": [kind.status for kind in kinds],
        "types": [kind.type for kind in kinds],
        "keep": [kind.keep.total_seconds() for kind in kinds],
    }


async def prune_exclusively(
    retention: Retention, *, owner: str, ttl: float, dry_run: bool = False
) -> PruneReport:
    """One pass (or a count) under the pruner lease, so it never runs beside a worker's
    pruner; :class:`PrunerBusy` if another holds it. A dry run changes nothing and takes
    no lease."""
    if dry_run:
        return await retention.count()
    token = uuid.uuid4()
    params: MaintenanceLeaseParams = {
        "name": LEASE_NAME,
        "owner": owner,
        "ttl": ttl,
        "token": token,
    }
    async with retention.db.unit_of_work() as uow:
        taken = await maintenance_lease_store.acquire(uow, params)
        holder = None if taken else await maintenance_lease_store.get_holder(uow, params)
        await uow.commit()
    if not taken:
        who = (
            f"{holder['owner']} until {holder['expires_at']:%Y-%m-%d %H:%M:%S%z}"
            if holder
            else "another pruner"
        )
        raise PrunerBusy(
            f"the pruner lease is held by {who} (a worker's pruner runs every "
            f"JOBCORE_PRUNER_INTERVAL); nothing was pruned; --dry-run shows what is due"
        )

    async def renew(uow: UnitOfWork) -> bool:
        return await maintenance_lease_store.renew(uow, params) is not None

    try:
        return await retention.prune(fence=renew)
    finally:
        async with retention.db.unit_of_work() as uow:
            await maintenance_lease_store.release(uow, params)
            await uow.commit()
