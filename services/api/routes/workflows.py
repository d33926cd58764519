"""Workflows: ``POST /workflows`` (named jobs and the edges between them, in one
transaction), ``GET /workflows/{id}`` (status and a summary per job), and the operations:
cancel the workflow, retry one of its jobs.

The body of ``POST /workflows`` is checked whole before anything is written: each job's
payload by its type (as ``POST /jobs/{type}`` checks it), then the graph (a cycle, an
unknown or duplicate name: 422 ``invalid-workflow``).
"""

# No `from __future__ import annotations` here: FastAPI reads the routes' signatures.

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from jobcore.execution.payloads import UnstorablePayload, validate_payload
from jobcore.execution.registry import MAX_ATTEMPTS_LIMIT, InvalidPayloadError, JobType, Registry
from jobcore.kernel.envelope import PRINTABLE_TEXT
from jobcore.kernel.errors import InvalidField, InvalidPayload, UnknownJobType
from jobcore.usecases import workflows as workflow_usecases
from services.api.auth import ActorDep, CancelRoute, EnqueueRoute, ReadRoute, TenantDep
from services.api.deps import DbDep, SessionDep, StateDep
from services.api.problems import located, payload_located
from services.api.routes.enqueue import idempotency_key_dependency
from services.api.schemas import Problem
from services.api.views import JsonBody

Policy = Literal["on_success", "on_complete", "on_failure"]


class DependencyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    policy: Policy = Field(
        default="on_success",
        description="on_success: the dependency succeeded; on_complete: it ended, however; "
        "on_failure: it failed (a compensation job).",
    )


class WorkflowJobIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=200, pattern=PRINTABLE_TEXT)
    type: str = Field(min_length=1, max_length=200)
    payload: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[str | DependencyIn] = Field(
        default_factory=list,
        description="The jobs this one waits for: names (on_success), or {name, policy}.",
    )
    is_finally: bool = Field(
        default=False,
        alias="finally",
        description="Runs once every other job of the workflow has ended, whatever its outcome.",
    )
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS_LIMIT)
    entity_id: str | None = Field(
        default=None, min_length=1, max_length=255, pattern=PRINTABLE_TEXT
    )


class WorkflowIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, max_length=200)
    jobs: list[WorkflowJobIn] = Field(min_length=1, max_length=workflow_usecases.MAX_WORKFLOW_STEPS)


class WorkflowCreatedOut(BaseModel):
    id: uuid.UUID
    status: Literal["running"] = "running"
    created_at: datetime
    jobs: dict[str, uuid.UUID] = Field(description="Each job's id, by name.")


class EdgeView(BaseModel):
    name: str
    job_id: uuid.UUID
    policy: Policy
    state: Literal["waiting", "satisfied", "unsatisfiable"]


class WorkflowJobView(BaseModel):
    id: uuid.UUID
    name: str
    type: str
    status: str
    waiting_for_dependencies: bool
    is_finally: bool
    attempts: int
    max_attempts: int
    last_error: str | None = None
    blocked_by: uuid.UUID | None = Field(
        default=None, description="The dependency that made this job unreachable."
    )
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    depends_on: list[EdgeView]


class WorkflowView(BaseModel):
    id: uuid.UUID
    name: str | None = None
    status: Literal["running", "succeeded", "failed", "cancelled"]
    jobs_total: int
    open_jobs: int
    failed_jobs: int
    counts: dict[str, int]
    cancel_requested_at: datetime | None = None
    created_at: datetime
    finished_at: datetime | None = None
    jobs: list[WorkflowJobView]


class WorkflowCancelOut(BaseModel):
    id: uuid.UUID
    cancelled: int
    asked_to_stop: int


class WorkflowRetryOut(BaseModel):
    workflow_id: uuid.UUID
    name: str
    job_id: uuid.UUID
    status: Literal["pending"] = "pending"


WorkflowIdempotencyKeyDep = Annotated[
    str | None,
    Depends(
        idempotency_key_dependency(
            "Makes retries safe: the same key (per tenant) and the same request (the "
            "workflow's name and every job: name, type, payload, depends_on, finally, "
            "max_attempts, entity_id) answer the workflow the first request created, with "
            "`Idempotent-Replayed: true`, and write nothing; a different request answers "
            "422 `idempotency-key-reused`. Two requests racing with one key make one "
            "workflow. A key is kept as long as its workflow. 1 to 255 printable ASCII "
            "characters, else 400 `invalid-idempotency-key`."
        )
    ),
]


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": Problem} for status in (401, 403, 503, *statuses)}


def build_router(registry: Registry) -> APIRouter:
    router = APIRouter(tags=["workflows"], default_response_class=JsonBody)

    def resolve(type_name: str, payload: Any, n: int) -> tuple[JobType[Any], Any]:
        try:
            job_type = registry.get(type_name)
        except UnknownJobType:
            raise InvalidField(
                "jobs", f"unknown job type {type_name!r}", kind="unknown_job_type", path=(n, "type")
            ) from None
        try:
            return job_type, validate_payload(job_type, payload)
        except InvalidPayload as exc:
            # Located at its job, as the route's other errors are: which of the jobs it
            # is matters as much as which field.
            if isinstance(exc, InvalidField):
                raise located(exc, ["jobs", n]) from None
            if isinstance(exc, InvalidPayloadError | UnstorablePayload):
                raise payload_located(exc, ["jobs", n]) from None
            raise

    async def create_workflow(
        body: WorkflowIn,
        tenant: TenantDep,
        db_session: SessionDep,
        state: StateDep,
        key: WorkflowIdempotencyKeyDep,
    ) -> Response:
        """Create a workflow: every job and edge in one transaction, or nothing. With an
        `Idempotency-Key`, a retry of the same request answers the same workflow."""
        documents = [job.model_dump(by_alias=True) for job in body.jobs]
        steps = workflow_usecases.steps_from_documents(documents, resolve, tenant)
        async with db_session.transaction() as uow:
            created = await workflow_usecases.create_workflow(
                uow,
                state.topology,
                tenant=tenant,
                steps=steps,
                name=body.name,
                quotas=state.settings.quota_defaults,
                idempotency_key=key,
            )
            await uow.commit()
        answer = WorkflowCreatedOut(id=created.id, created_at=created.created_at, jobs=created.jobs)
        headers = dict(created.rate_headers)
        if created.replayed:
            headers["Idempotent-Replayed"] = "true"
        # A replay answers as the first request was answered (201, the same body).
        return JsonBody(answer.model_dump(mode="json"), status_code=201, headers=headers)

    async def get_workflow(
        workflow_id: uuid.UUID, tenant: TenantDep, db_session: SessionDep
    ) -> Response:
        """The workflow's status, and each job's state and edges."""
        workflow = await workflow_usecases.get_workflow(db_session, workflow_id, tenant=tenant)
        return JsonBody(WorkflowView.model_validate(workflow).model_dump(mode="json"))

    async def cancel_workflow(workflow_id: uuid.UUID, tenant: TenantDep, db: DbDep) -> Response:
        """Cancel every job that has not ended (running ones are asked to stop)."""
        outcome = await workflow_usecases.cancel_workflow(db, workflow_id, tenant=tenant)
        answer = WorkflowCancelOut(
            id=outcome.id, cancelled=outcome.cancelled, asked_to_stop=outcome.asked_to_stop
        )
        return JsonBody(answer.model_dump(mode="json"), status_code=202)

    async def retry_job(
        workflow_id: uuid.UUID,
        name: str,
        tenant: TenantDep,
        db: DbDep,
        state: StateDep,
        actor: ActorDep,
    ) -> Response:
        """Run a failed or cancelled job of the workflow again, in place; the jobs it made
        unreachable then wait for its new outcome. Audited (`workflow.retry`), as a job's
        retry is."""
        outcome = await workflow_usecases.retry_step(
            db, state.topology, workflow_id, name, tenant=tenant, actor=actor
        )
        answer = WorkflowRetryOut(
            workflow_id=outcome.workflow_id, name=outcome.name, job_id=outcome.job_id
        )
        return JsonBody(answer.model_dump(mode="json"), status_code=202)

    router.add_api_route(
        "/workflows",
        create_workflow,
        methods=["POST"],
        status_code=201,
        response_model=WorkflowCreatedOut,
        responses=_problems(400, 413, 415, 422, 429),
        route_class_override=EnqueueRoute,
    )
    router.add_api_route(
        "/workflows/{workflow_id}",
        get_workflow,
        methods=["GET"],
        response_model=WorkflowView,
        responses=_problems(404, 422),
        route_class_override=ReadRoute,
    )
    router.add_api_route(
        "/workflows/{workflow_id}/cancel",
        cancel_workflow,
        methods=["POST"],
        status_code=202,
        response_model=WorkflowCancelOut,
        responses=_problems(404, 422),
        route_class_override=CancelRoute,
    )
    router.add_api_route(
        "/workflows/{workflow_id}/jobs/{name}/retry",
        retry_job,
        methods=["POST"],
        status_code=202,
        response_model=WorkflowRetryOut,
        responses=_problems(404, 409, 422),
        route_class_override=EnqueueRoute,
    )
    return router
