"""``workflows``, ``workflow_jobs`` and ``workflow_edges``, and a workflow's steps in
``jobs``: :class:`WorkflowStore` runs :mod:`jobcore.database.sql.workflows`."""

from __future__ import annotations

import uuid

from psycopg.rows import DictRow

from jobcore.database.gateway import (
    Reader,
    Session,
    UnitOfWork,
    execute,
    fetch_all,
    fetch_all_behind,
    fetch_one,
)
from jobcore.database.sql import Statement
from jobcore.database.sql.workflows import (
    WORKFLOW_CANCEL_STEPS,
    WORKFLOW_DEPENDENCY_RESULTS,
    WORKFLOW_GET,
    WORKFLOW_GET_BY_IDEMPOTENCY_KEY,
    WORKFLOW_INSERT,
    WORKFLOW_LIST,
    WORKFLOW_LIST_FOR_TENANT,
    WORKFLOW_PRUNE_BATCH,
    WORKFLOW_REQUEST_CANCEL,
    WORKFLOW_RETRY_STEP,
    WORKFLOW_STEP_IDS,
    WORKFLOW_STEPS,
    WorkflowByKeyParams,
    WorkflowCancelStepsParams,
    WorkflowDependencyResultsParams,
    WorkflowGetParams,
    WorkflowIdParams,
    WorkflowInsertParams,
    WorkflowListForTenantParams,
    WorkflowListParams,
    WorkflowPruneParams,
    WorkflowRequestCancelParams,
    WorkflowRetryStepParams,
)

__all__ = [
    "WorkflowByKeyParams",
    "WorkflowCancelStepsParams",
    "WorkflowDependencyResultsParams",
    "WorkflowGetParams",
    "WorkflowIdParams",
    "WorkflowInsertParams",
    "WorkflowListForTenantParams",
    "WorkflowListParams",
    "WorkflowPruneParams",
    "WorkflowRequestCancelParams",
    "WorkflowRetryStepParams",
    "WorkflowStore",
    "workflow_store",
]


class WorkflowStore:
    __slots__ = ()

    async def insert(
        self, on: Session, params: WorkflowInsertParams, *, behind: Statement | None = None
    ) -> DictRow | None:
        """Write a workflow with all its steps and edges, or nothing if a quota refuses
        (``refusal``); no row if the API key is no longer usable. ``behind``: a statement
        to run first, in the same round trip on a unit of work."""
        if behind is not None and isinstance(on, UnitOfWork):
            rows = await fetch_all_behind(on, behind, WORKFLOW_INSERT(params))
            return rows[0] if rows else None
        if behind is not None:
            await execute(on, behind)
        return await fetch_one(on, WORKFLOW_INSERT(params))

    async def get(self, on: Reader, params: WorkflowGetParams) -> DictRow | None:
        """A workflow, or None."""
        return await fetch_one(on, WORKFLOW_GET(params))

    async def get_by_idempotency_key(
        self, on: Reader, params: WorkflowByKeyParams
    ) -> DictRow | None:
        """The tenant's workflow holding an idempotency key (its id, request fingerprint
        and creation time), or None."""
        return await fetch_one(on, WORKFLOW_GET_BY_IDEMPOTENCY_KEY(params))

    async def step_ids(self, on: Reader, params: WorkflowIdParams) -> dict[str, uuid.UUID]:
        """Each step's job id, by name."""
        rows = await fetch_all(on, WORKFLOW_STEP_IDS(params))
        return {row["name"]: row["job_id"] for row in rows}

    async def steps(self, on: Reader, params: WorkflowIdParams) -> list[DictRow]:
        """A workflow's steps with their state and incoming edges."""
        return await fetch_all(on, WORKFLOW_STEPS(params))

    async def list_workflows(self, on: Reader, params: WorkflowListParams) -> list[DictRow]:
        """The newest workflows of every tenant."""
        return await fetch_all(on, WORKFLOW_LIST(params))

    async def list_for_tenant(
        self, on: Reader, params: WorkflowListForTenantParams
    ) -> list[DictRow]:
        """A tenant's newest workflows."""
        return await fetch_all(on, WORKFLOW_LIST_FOR_TENANT(params))

    async def request_cancel(
        self, on: Session, params: WorkflowRequestCancelParams
    ) -> DictRow | None:
        """Mark a workflow as being cancelled; None if there is no such workflow."""
        return await fetch_one(on, WORKFLOW_REQUEST_CANCEL(params))

    async def cancel_steps(self, on: Session, params: WorkflowCancelStepsParams) -> DictRow:
        """One pass of a cancel: what it cancelled, asked to stop, and left."""
        row = await fetch_one(on, WORKFLOW_CANCEL_STEPS(params))
        assert row is not None
        return row

    async def retry_step(self, on: Session, params: WorkflowRetryStepParams) -> DictRow | None:
        """Run a failed or cancelled step again in place; None if no such step."""
        return await fetch_one(on, WORKFLOW_RETRY_STEP(params))

    async def dependency_results(
        self, on: Reader, params: WorkflowDependencyResultsParams
    ) -> list[DictRow]:
        """A step's dependencies, with their results."""
        return await fetch_all(on, WORKFLOW_DEPENDENCY_RESULTS(params))

    async def prune_batch(self, on: Session, params: WorkflowPruneParams) -> DictRow:
        """Delete up to ``limit`` finished workflows past retention, with their steps."""
        row = await fetch_one(on, WORKFLOW_PRUNE_BATCH(params))
        assert row is not None
        return row


workflow_store = WorkflowStore()
