"""The one owner of the ``jobs`` table: :class:`JobStore`, a method per operation.

Everything that reads or changes jobs asks :data:`job_store`; only this module imports the
statements (:mod:`jobcore.database.sql.jobs`, an import contract in pyproject.toml). A method takes
the caller's session, unit of work or connection (:mod:`jobcore.database.gateway`) and the
statement's typed parameters, runs the one statement (or, for the claim, the one pipelined round
trip) through the gateway, and returns its rows. It builds no SQL: the statements are
compacted once, at import. The outcome statements the worker retries through a broken
connection are also handed out bound (``*_statement``), for the caller to run again.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import DictRow

from jobcore.database.gateway import (
    AsyncConn,
    Executor,
    Reader,
    UnitOfWork,
    execute,
    fetch_all,
    fetch_all_after,
    fetch_all_behind,
    fetch_all_beside,
    fetch_one,
    in_schema,
    schema_of,
)
from jobcore.database.sql import NoParams, Query, Statement
from jobcore.database.sql.jobs.cancel import (
    CANCEL_CHANNEL,
    JOB_CANCEL_LISTEN,
    JOB_CANCEL_PENDING,
    JOB_CANCEL_REQUESTED,
    JOB_CANCEL_UNLISTEN,
    JOB_LOCK_FOR_CANCEL,
    JOB_REQUEST_CANCEL,
    JobCancelPendingParams,
    JobCancelRequestedParams,
    JobLockForCancelParams,
    JobRequestCancelParams,
)
from jobcore.database.sql.jobs.edit import (
    JOB_EDIT,
    JOB_LOCK_FOR_EDIT,
    JobEditParams,
    JobLockForEditParams,
)
from jobcore.database.sql.jobs.enqueue import (
    JOB_GET_BATCH_HOLDERS,
    JOB_GET_BY_IDEMPOTENCY_KEY,
    JOB_GET_UNIQUE_HOLDER,
    JOB_INSERT,
    JOB_INSERT_APPROXIMATE,
    JOB_INSERT_APPROXIMATE_PLAIN,
    JOB_INSERT_KEYED,
    JOB_INSERT_KEYED_APPROXIMATE,
    JOB_INSERT_KEYED_APPROXIMATE_PLAIN,
    JOB_INSERT_KEYED_PLAIN,
    JOB_INSERT_MANY,
    JOB_INSERT_PLAIN,
    JOB_INSERT_PREVIEW,
    JobGateParams,
    JobGetBatchHoldersParams,
    JobGetByIdempotencyKeyParams,
    JobGetUniqueHolderParams,
    JobInsertKeyedParams,
    JobInsertManyParams,
    JobInsertParams,
    JobInsertPreviewParams,
    JobKeyParams,
)
from jobcore.database.sql.jobs.gates import (
    JOB_LOCK_RELEASABLE,
    JOB_ORDERING_TAKE_PLACE,
    JOB_ORDERING_UNBLOCK,
    JOB_RELEASE_HELD,
    JobLockReleasableParams,
    JobOrderingUnblockParams,
    JobReleaseHeldParams,
)
from jobcore.database.sql.jobs.prune import (
    JOB_FILES_KEPT,
    JOB_PRUNE_BATCH,
    JOB_PRUNE_COUNT,
    JOB_TERMINAL_KINDS,
    JobFilesKeptParams,
    JobPruneBatchParams,
    JobPruneCountParams,
)
from jobcore.database.sql.jobs.reads import (
    JOB_COUNT_BY_TYPE_AND_STATUS,
    JOB_COUNT_OPEN_BY_QUEUE,
    JOB_DONE_LISTEN,
    JOB_GET,
    JOB_GET_ANY_TENANT,
    JOB_GET_PAYLOAD,
    JOB_GET_RESULT,
    JOB_GET_WAITED,
    JOB_HELD_COUNT,
    JOB_LIST,
    JOB_LIST_ALL_TENANTS,
    JOB_LIST_FOR_ENTITY,
    JOB_OVERDUE_BY_QUEUE,
    JOB_PROGRESS_LISTEN,
    JOB_TIMINGS,
    JobGetAnyTenantParams,
    JobGetParams,
    JobGetResultParams,
    JobGetWaitedParams,
    JobListAllTenantsParams,
    JobListParams,
    JobTenantParams,
)
from jobcore.database.sql.jobs.recovery import (
    JOB_FAIL_QUARANTINED,
    JOB_LOCK_EXPIRED,
    JOB_LOCK_STALE,
    JOB_NOTE_DEAD_LETTER,
    JOB_OLDEST_EXPIRED,
    JOB_REAP_EXPIRED,
    JOB_REPUBLISH_STALE,
    JobFailQuarantinedParams,
    JobLockExpiredParams,
    JobLockStaleParams,
    JobNoteDeadLetterParams,
    JobOldestExpiredParams,
    JobReapExpiredParams,
    JobRepublishStaleParams,
)
from jobcore.database.sql.jobs.run import (
    JOB_CLAIM_FROM_OUTBOX,
    JOB_CLAIM_KEYED,
    JOB_CLAIM_MANY,
    JOB_CLAIM_UNGATED,
    JOB_END_RUNNING,
    JOB_GATES_LOCK,
    JOB_HEARTBEAT,
    JOB_NOTE_UNDELIVERABLE,
    JOB_OUTCOME_WRITTEN,
    JOB_PROGRESS_SET,
    JOB_RELEASE,
    JOB_RESUME_TOKENS,
    JOB_RETRY,
    JOB_SNOOZE,
    JOB_SUCCEED_MANY,
    JobClaimFromOutboxParams,
    JobClaimManyParams,
    JobEndRunningParams,
    JobFencedParams,
    JobHeartbeatParams,
    JobNoteUndeliverableParams,
    JobOutcomeWrittenParams,
    JobProgressSetParams,
    JobReleaseParams,
    JobResumeTokensParams,
    JobRetryParams,
    JobSnoozeParams,
    JobSucceedManyParams,
)
from jobcore.kernel.quotas import Admission

__all__ = [
    "CANCEL_CHANNEL",
    "JobCancelPendingParams",
    "JobCancelRequestedParams",
    "JobClaimFromOutboxParams",
    "JobClaimManyParams",
    "JobEditParams",
    "JobEndRunningParams",
    "JobFailQuarantinedParams",
    "JobFencedParams",
    "JobFilesKeptParams",
    "JobGateParams",
    "JobGetAnyTenantParams",
    "JobGetBatchHoldersParams",
    "JobGetByIdempotencyKeyParams",
    "JobGetParams",
    "JobGetResultParams",
    "JobGetUniqueHolderParams",
    "JobGetWaitedParams",
    "JobHeartbeatParams",
    "JobInsertManyParams",
    "JobInsertParams",
    "JobInsertPreviewParams",
    "JobKeyParams",
    "JobListAllTenantsParams",
    "JobListParams",
    "JobLockExpiredParams",
    "JobLockForCancelParams",
    "JobLockReleasableParams",
    "JobLockStaleParams",
    "JobNoteDeadLetterParams",
    "JobNoteUndeliverableParams",
    "JobOldestExpiredParams",
    "JobOrderingUnblockParams",
    "JobOutcomeWrittenParams",
    "JobProgressSetParams",
    "JobPruneBatchParams",
    "JobPruneCountParams",
    "JobReapExpiredParams",
    "JobReleaseHeldParams",
    "JobReleaseParams",
    "JobRepublishStaleParams",
    "JobRequestCancelParams",
    "JobResumeTokensParams",
    "JobRetryParams",
    "JobSnoozeParams",
    "JobStore",
    "JobSucceedManyParams",
    "JobTenantParams",
    "job_store",
]

_NO_PARAMS: NoParams = {}

# A single enqueue's statement by (approximate admission, plain insert): quotas read as
# committed for an application's own transaction, and a plain INSERT for a job with
# neither an idempotency nor a unique key, which can conflict with nothing.
_INSERTS: dict[tuple[bool, bool], Query[JobInsertParams]] = {
    (False, False): JOB_INSERT,
    (True, False): JOB_INSERT_APPROXIMATE,
    (False, True): JOB_INSERT_PLAIN,
    (True, True): JOB_INSERT_APPROXIMATE_PLAIN,
}
_KEYED_INSERTS: dict[tuple[bool, bool], Query[JobInsertKeyedParams]] = {
    (False, False): JOB_INSERT_KEYED,
    (True, False): JOB_INSERT_KEYED_APPROXIMATE,
    (False, True): JOB_INSERT_KEYED_PLAIN,
    (True, True): JOB_INSERT_KEYED_APPROXIMATE_PLAIN,
}


class JobStore:
    """Every operation on jobs, one method each (see the module's docstring)."""

    __slots__ = ()

    # --- enqueue (jobcore.database.sql.jobs.enqueue)
    # ------------------------------------------------

    async def insert(
        self,
        on: Reader,
        params: JobInsertParams,
        *,
        admission: Admission = Admission.EXACT,
        key: JobKeyParams | None = None,
    ) -> DictRow | None:
        """Write one job with its outbox message, quotas checked as ``admission`` says,
        in one statement; with ``key`` (a debounce or throttle key), join the job open to
        it instead when there is one (``joined``)."""
        # Without an idempotency or unique key nothing can conflict: a plain INSERT.
        plain = params["idempotency_key"] is None and params["unique_key"] is None
        flags = (admission is Admission.APPROXIMATE, plain)
        if key is not None:
            keyed: JobInsertKeyedParams = {**params, **key}
            return await fetch_one(on, _KEYED_INSERTS[flags](keyed))
        return await fetch_one(on, _INSERTS[flags](params))

    async def preview_insert(self, on: Reader, params: JobInsertPreviewParams) -> DictRow | None:
        """What :meth:`insert` would meet (the keys' holders, a quota's refusal), read
        without writing; None if the API key is no longer usable."""
        return await fetch_one(on, JOB_INSERT_PREVIEW(params))

    async def insert_many(
        self,
        on: Reader,
        params: JobInsertManyParams,
        *,
        behind: Statement | None = None,
        commit: bool = False,
    ) -> list[DictRow]:
        """Write a batch of one type, as many as the quotas admit: a row per item.
        ``behind``: a statement to run first, in the same round trip (``on`` a unit of
        work: :func:`jobcore.database.gateway.fetch_all_behind`, which with ``commit``
        commits in that round trip too)."""
        if behind is not None and isinstance(on, UnitOfWork):
            return await fetch_all_behind(on, behind, JOB_INSERT_MANY(params), commit=commit)
        if behind is not None:
            await execute(on, behind)
        return await fetch_all(on, JOB_INSERT_MANY(params))

    async def batch_holders(self, on: Reader, params: JobGetBatchHoldersParams) -> list[DictRow]:
        """Per batch item, the jobs that hold its idempotency and unique keys."""
        return await fetch_all(on, JOB_GET_BATCH_HOLDERS(params))

    async def get_by_idempotency_key(
        self, on: Reader, params: JobGetByIdempotencyKeyParams
    ) -> DictRow | None:
        return await fetch_one(on, JOB_GET_BY_IDEMPOTENCY_KEY(params))

    async def get_unique_holder(
        self, on: Reader, params: JobGetUniqueHolderParams
    ) -> DictRow | None:
        return await fetch_one(on, JOB_GET_UNIQUE_HOLDER(params))

    # --- reads (jobcore.database.sql.jobs.reads)
    # ------------------------------------------------------

    async def get(self, on: Reader, params: JobGetParams) -> DictRow | None:
        """One tenant's job with its whereabouts (another tenant's reads as missing)."""
        return await fetch_one(on, JOB_GET(params))

    async def get_any_tenant(self, on: Reader, params: JobGetAnyTenantParams) -> DictRow | None:
        return await fetch_one(on, JOB_GET_ANY_TENANT(params))

    async def list_page(self, on: Reader, params: JobListParams) -> list[DictRow]:
        """A page of a tenant's jobs; of one entity's when ``entity_id`` is set (its own
        statement, so its index serves it)."""
        query = JOB_LIST if params["entity_id"] is None else JOB_LIST_FOR_ENTITY
        return await fetch_all(on, query(params))

    async def get_result(self, on: Reader, params: JobGetResultParams) -> DictRow | None:
        return await fetch_one(on, JOB_GET_RESULT(params))

    async def get_payload(self, on: Reader, params: JobGetResultParams) -> DictRow | None:
        return await fetch_one(on, JOB_GET_PAYLOAD(params))

    async def list_all_tenants(self, on: Reader, params: JobListAllTenantsParams) -> list[DictRow]:
        return await fetch_all(on, JOB_LIST_ALL_TENANTS(params))

    async def count_open_by_queue(self, on: Reader) -> list[DictRow]:
        return await fetch_all(on, JOB_COUNT_OPEN_BY_QUEUE(_NO_PARAMS))

    async def overdue_by_queue(self, on: Reader) -> list[DictRow]:
        return await fetch_all(on, JOB_OVERDUE_BY_QUEUE(_NO_PARAMS))

    async def held_count(self, on: Reader) -> list[DictRow]:
        return await fetch_all(on, JOB_HELD_COUNT(_NO_PARAMS))

    async def listen_done(self, on: Executor) -> None:
        """LISTEN for jobs becoming terminal (jobcore.kernel.channels)."""
        await execute(on, JOB_DONE_LISTEN(_NO_PARAMS))

    async def listen_progress(self, on: Executor) -> None:
        """LISTEN for running jobs' progress."""
        await execute(on, JOB_PROGRESS_LISTEN(_NO_PARAMS))

    async def count_by_type_and_status(self, on: Reader, params: JobTenantParams) -> list[DictRow]:
        """A tenant's jobs counted by type and status (`jobcore demo`)."""
        return await fetch_all(on, JOB_COUNT_BY_TYPE_AND_STATUS(params))

    async def timings(self, on: Reader, params: JobTenantParams) -> list[DictRow]:
        """Every job of a tenant with its timings and attempts (`jobcore demo`)."""
        return await fetch_all(on, JOB_TIMINGS(params))

    async def get_waited(self, on: Reader, params: JobGetWaitedParams) -> list[DictRow]:
        return await fetch_all(on, JOB_GET_WAITED(params))

    # --- cancel (jobcore.database.sql.jobs.cancel)
    # ----------------------------------------------------

    # --- edits (jobcore.database.sql.jobs.edit)

    async def lock_for_edit(self, on: Reader, params: JobLockForEditParams) -> DictRow | None:
        return await fetch_one(on, JOB_LOCK_FOR_EDIT(params))

    async def edit(self, on: Reader, params: JobEditParams) -> DictRow | None:
        return await fetch_one(on, JOB_EDIT(params))

    async def lock_for_cancel(self, on: Reader, params: JobLockForCancelParams) -> DictRow | None:
        return await fetch_one(on, JOB_LOCK_FOR_CANCEL(params))

    async def cancel_pending(self, on: Reader, params: JobCancelPendingParams) -> DictRow | None:
        return await fetch_one(on, JOB_CANCEL_PENDING(params))

    async def request_cancel(self, on: Reader, params: JobRequestCancelParams) -> DictRow | None:
        return await fetch_one(on, JOB_REQUEST_CANCEL(params))

    async def listen_cancel(self, on: Executor) -> None:
        await execute(on, JOB_CANCEL_LISTEN(_NO_PARAMS))

    async def unlisten_cancel(self, on: Executor) -> None:
        await execute(on, JOB_CANCEL_UNLISTEN(_NO_PARAMS))

    async def cancel_requested(self, on: Reader, params: JobCancelRequestedParams) -> list[DictRow]:
        return await fetch_all(on, JOB_CANCEL_REQUESTED(params))

    # --- the worker's run (jobcore.database.sql.jobs.run)
    # -------------------------------------------

    async def claim(
        self, conn: AsyncConn, params: JobClaimManyParams, *, keyed: bool = False
    ) -> list[DictRow]:
        """Claim: a row per message. The messages of jobs with no concurrency or rate key
        are claimed by JOB_CLAIM_UNGATED, one statement committing alone (most jobs: no
        gate row to lock). It leaves the others out, and only they lock their jobs' gate
        rows, then claim: BEGIN, JOB_GATES_LOCK, JOB_CLAIM_MANY and COMMIT in one round
        trip (jobcore.database.gateway.fetch_all_after). Each part is a claim by itself, so a retry
        of the whole after an unanswered commit of either resumes what that part took.

        ``keyed``: the caller expects jobs with a key in the batch (their types declare a
        limit), so both parts go in one round trip: the keyed jobs' transaction first
        (JOB_CLAIM_KEYED, the complement of JOB_CLAIM_UNGATED, behind the lock), then
        JOB_CLAIM_UNGATED committing by itself. Only a cost: the split comes from the job
        rows either way, and a keyed job not expected is claimed by a second round trip."""
        if keyed:
            gated, ungated = await fetch_all_beside(
                conn,
                JOB_GATES_LOCK({"job_ids": params["job_ids"]}),
                JOB_CLAIM_KEYED(params),
                JOB_CLAIM_UNGATED(params),
            )
            return gated + ungated
        rows = await fetch_all(conn, JOB_CLAIM_UNGATED(params))
        # By message, not by count: two rows for one message (two fresh deliveries of one
        # parked job) must not stand in for a keyed message left out.
        answered = {row["message_id"] for row in rows}
        left_out = [
            i for i, message_id in enumerate(params["message_ids"]) if message_id not in answered
        ]
        if not left_out:
            return rows
        rest = _claim_subset(params, left_out)
        rows += await fetch_all_after(
            conn, JOB_GATES_LOCK({"job_ids": rest["job_ids"]}), JOB_CLAIM_MANY(rest)
        )
        return rows

    async def claim_from_outbox(
        self, conn: AsyncConn, params: JobClaimFromOutboxParams
    ) -> list[DictRow]:
        """Take the fresh outbox rows no relay holds and claim their messages, one
        statement committing alone (JOB_CLAIM_FROM_OUTBOX): a row per message taken."""
        return await fetch_all(conn, JOB_CLAIM_FROM_OUTBOX(params))

    async def resume_tokens(self, conn: AsyncConn, params: JobResumeTokensParams) -> list[DictRow]:
        """The jobs running under these lease tokens, their leases renewed (a claim whose
        commit went unanswered: JOB_RESUME_TOKENS)."""
        return await fetch_all(conn, JOB_RESUME_TOKENS(params))

    async def note_undeliverable(self, on: Executor, params: JobNoteUndeliverableParams) -> int:
        return await execute(on, JOB_NOTE_UNDELIVERABLE(params))

    async def heartbeat(self, on: Reader, params: JobHeartbeatParams) -> DictRow | None:
        return await fetch_one(on, JOB_HEARTBEAT(params))

    async def set_progress(self, on: Reader, params: JobProgressSetParams) -> DictRow | None:
        return await fetch_one(on, JOB_PROGRESS_SET(params))

    async def succeed_many(self, on: Reader, params: JobSucceedManyParams) -> list[DictRow]:
        """Record successes, each fenced by its lease token: the jobs whose update won."""
        return await fetch_all(on, JOB_SUCCEED_MANY(params))

    async def outcome_written(self, on: Reader, params: JobOutcomeWrittenParams) -> DictRow | None:
        return await fetch_one(on, JOB_OUTCOME_WRITTEN(params))

    # Bound, for callers that retry them through a broken connection (each returns a row
    # exactly when its fence let it write).

    def succeed_many_statement(self, params: JobSucceedManyParams) -> Statement:
        return JOB_SUCCEED_MANY(params)

    def retry_statement(self, params: JobRetryParams) -> Statement:
        return JOB_RETRY(params)

    def release_statement(self, params: JobReleaseParams) -> Statement:
        return JOB_RELEASE(params)

    def end_running_statement(self, params: JobEndRunningParams) -> Statement:
        return JOB_END_RUNNING(params)

    def snooze_statement(self, params: JobSnoozeParams) -> Statement:
        return JOB_SNOOZE(params)

    # --- recovery (jobcore.database.sql.jobs.recovery)
    # ------------------------------------------------

    async def lock_expired(self, on: Reader, params: JobLockExpiredParams) -> list[DictRow]:
        return await fetch_all(on, JOB_LOCK_EXPIRED(params))

    async def oldest_expired(self, on: Reader, params: JobOldestExpiredParams) -> DictRow | None:
        return await fetch_one(on, JOB_OLDEST_EXPIRED(params))

    async def reap_expired(self, on: Reader, params: JobReapExpiredParams) -> list[DictRow]:
        return await fetch_all(on, JOB_REAP_EXPIRED(params))

    async def fail_quarantined(self, on: Reader, params: JobFailQuarantinedParams) -> list[DictRow]:
        return await fetch_all(on, JOB_FAIL_QUARANTINED(params))

    async def lock_stale(self, on: Reader, params: JobLockStaleParams) -> list[DictRow]:
        return await fetch_all(on, JOB_LOCK_STALE(params))

    async def republish_stale(self, on: Reader, params: JobRepublishStaleParams) -> list[DictRow]:
        return await fetch_all(on, JOB_REPUBLISH_STALE(params))

    async def note_dead_letter(self, on: Reader, params: JobNoteDeadLetterParams) -> DictRow | None:
        return await fetch_one(on, JOB_NOTE_DEAD_LETTER(params))

    # --- gates (jobcore.database.sql.jobs.gates)
    # --------------------------------------------------------

    async def ordering_unblock(
        self, on: Reader, params: JobOrderingUnblockParams
    ) -> DictRow | None:
        return await fetch_one(on, JOB_ORDERING_UNBLOCK(params))

    async def ordering_take_place(
        self, on: Reader, params: JobOrderingUnblockParams
    ) -> DictRow | None:
        return await fetch_one(on, JOB_ORDERING_TAKE_PLACE(params))

    async def lock_releasable(self, on: Reader, params: JobLockReleasableParams) -> list[DictRow]:
        return await fetch_all(on, JOB_LOCK_RELEASABLE(params))

    async def release_held(self, on: Reader, params: JobReleaseHeldParams) -> list[DictRow]:
        return await fetch_all(on, JOB_RELEASE_HELD(params))

    async def explain_lock_releasable(
        self, conn: psycopg.AsyncConnection[Any], params: JobLockReleasableParams
    ) -> Any:
        """The plan of a releaser round, run (EXPLAIN ANALYZE, BUFFERS, JSON): the bench's
        measure of its scan. The caller rolls back what it locked."""
        text = in_schema(JOB_LOCK_RELEASABLE.sql, schema_of(conn))
        cursor = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text, params)
        return await cursor.fetchone()

    # --- prune (jobcore.database.sql.jobs.prune)
    # --------------------------------------------------------

    async def terminal_kinds(self, on: Reader) -> list[DictRow]:
        return await fetch_all(on, JOB_TERMINAL_KINDS(_NO_PARAMS))

    async def prune_count(self, on: Reader, params: JobPruneCountParams) -> list[DictRow]:
        return await fetch_all(on, JOB_PRUNE_COUNT(params))

    async def prune_batch(self, on: Reader, params: JobPruneBatchParams) -> list[DictRow]:
        return await fetch_all(on, JOB_PRUNE_BATCH(params))

    async def files_kept(self, on: Reader, params: JobFilesKeptParams) -> list[DictRow]:
        return await fetch_all(on, JOB_FILES_KEPT(params))


job_store = JobStore()


def _claim_subset(params: JobClaimManyParams, keep: list[int]) -> JobClaimManyParams:
    """The claim of the messages at positions ``keep`` of ``params``."""
    return {
        "consumer": params["consumer"],
        "exchange": params["exchange"],
        "worker_id": params["worker_id"],
        "message_ids": [params["message_ids"][i] for i in keep],
        "job_ids": [params["job_ids"][i] for i in keep],
        "types": [params["types"][i] for i in keep],
        "attempts": [params["attempts"][i] for i in keep],
        "lease_tokens": [params["lease_tokens"][i] for i in keep],
        "leases": [params["leases"][i] for i in keep],
        "published_ats": [params["published_ats"][i] for i in keep],
        "published_bys": [params["published_bys"][i] for i in keep],
    }


"""The store: stateless, so one serves every caller."""
