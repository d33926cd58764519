"""Workflows: named jobs with dependencies between them, written in one transaction.

A workflow's *steps* are jobs, each checked as a single enqueue checks its request
(:class:`~jobcore.usecases.enqueue.submit.EnqueueRequest`: the type's payload model, the
attempts); its *edges* say which step waits for which, and with what policy:
``on_success`` (the default: the dependency succeeded), ``on_complete`` (it ended, however)
and ``on_failure`` (it failed: a compensation step). A ``finally`` step waits for every
other step to end. The graph may have diamonds; a cycle, an unknown or duplicate name is
refused (:class:`InvalidWorkflow`, 422) and nothing is written.

What happens when a step settles is counted by the database, in the transaction of the
settle (migration 0031's trigger): here are creation, the reads, cancel and retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import orjson
from psycopg.types.json import Jsonb

from jobcore.access.apikeys import InvalidApiKey
from jobcore.access.audit import AuditAction, AuditedWork, Target, audited
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, Reader, Session, UnitOfWork
from jobcore.database.store import CANCEL_CHANNEL, tenant_store
from jobcore.database.store.workflows import WorkflowInsertParams, workflow_store
from jobcore.execution.registry import JobType
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.envelope import JobMessage
from jobcore.kernel.errors import (
    IdempotencyConflict,
    InvalidWorkflow,
    JobNotRetryable,
    TransientConflict,
    WorkflowNotFound,
    WorkflowStepNotFound,
)
from jobcore.kernel.quotas import UNLIMITED, Quotas, RateLimit, rate_headers
from jobcore.telemetry.traces import capture_trace_headers
from jobcore.usecases.enqueue.submit import EnqueueRequest, check_idempotency_key
from jobcore.usecases.enqueue.write_one import job_gates, quota_refusal, seconds_of

# The most steps one workflow may have (one statement writes them all).
MAX_WORKFLOW_STEPS = 20_000
# How many passes a cancel makes over steps other transactions held at the time.
CANCEL_PASSES = 50


class EdgePolicy(StrEnum):
    ON_SUCCESS = "on_success"
    ON_COMPLETE = "on_complete"
    ON_FAILURE = "on_failure"


@dataclass(frozen=True, slots=True)
class Dependency:
    name: str
    policy: EdgePolicy = EdgePolicy.ON_SUCCESS


@dataclass(frozen=True, slots=True)
class WorkflowStep:
    """One step: its name in the workflow, its job's request (checked when it was built),
    the steps it depends on, and whether it is a ``finally`` step."""

    name: str
    request: EnqueueRequest
    depends_on: Sequence[Dependency] = ()
    is_finally: bool = False


@dataclass(frozen=True, slots=True)
class WorkflowCreated:
    id: uuid.UUID
    created_at: datetime
    # Each step's job id, by name.
    jobs: dict[str, uuid.UUID]
    # The steps published at once (no dependency).
    published: int
    rate_headers: dict[str, str] = field(default_factory=dict)
    # The workflow an earlier request with the same idempotency key and request created:
    # nothing was written this time.
    replayed: bool = False


def check_graph(steps: Sequence[WorkflowStep]) -> list[str]:
    """The steps' names in an order where each comes after its dependencies; or
    :class:`InvalidWorkflow` for a duplicate name, an unknown dependency, a step depending
    on itself or twice on one step, a ``finally`` step with dependencies or depended on,
    or a cycle (named)."""
    if not 1 <= len(steps) <= MAX_WORKFLOW_STEPS:
        raise InvalidWorkflow("jobs", f"a workflow has 1 to {MAX_WORKFLOW_STEPS} jobs", kind="size")
    index: dict[str, int] = {}
    for n, step in enumerate(steps):
        if step.name in index:
            raise InvalidWorkflow(
                "jobs", f"duplicate job name {step.name!r}", kind="duplicate", path=(n, "name")
            )
        index[step.name] = n
    finals = {step.name for step in steps if step.is_finally}
    dependents: dict[str, list[str]] = {step.name: [] for step in steps}
    remaining: dict[str, int] = {}
    for n, step in enumerate(steps):
        seen: set[str] = set()
        if step.is_finally and step.depends_on:
            raise InvalidWorkflow(
                "jobs",
                f"finally job {step.name!r} runs after every other job; it takes no depends_on",
                kind="finally",
                path=(n, "depends_on"),
            )
        for dependency in step.depends_on:
            where = (n, "depends_on")
            if dependency.name not in index:
                raise InvalidWorkflow(
                    "jobs",
                    f"job {step.name!r} depends on unknown job {dependency.name!r}",
                    kind="unknown",
                    path=where,
                )
            if dependency.name == step.name:
                raise InvalidWorkflow(
                    "jobs", f"job {step.name!r} depends on itself", kind="cycle", path=where
                )
            if dependency.name in seen:
                raise InvalidWorkflow(
                    "jobs",
                    f"job {step.name!r} depends on {dependency.name!r} twice",
                    kind="duplicate",
                    path=where,
                )
            if dependency.name in finals:
                raise InvalidWorkflow(
                    "jobs",
                    f"job {step.name!r} depends on finally job {dependency.name!r}",
                    kind="finally",
                    path=where,
                )
            seen.add(dependency.name)
            dependents[dependency.name].append(step.name)
        remaining[step.name] = len(seen)
    # Kahn's algorithm: what is left once no step is free is on a cycle.
    order = [name for name, count in remaining.items() if count == 0]
    for name in order:
        for dependent in dependents[name]:
            remaining[dependent] -= 1
            if remaining[dependent] == 0:
                order.append(dependent)
    if len(order) < len(steps):
        stuck = sorted(name for name, count in remaining.items() if count > 0)
        shown = ", ".join(repr(name) for name in stuck[:10])
        raise InvalidWorkflow(
            "jobs", f"the dependencies form a cycle through {shown}", kind="cycle"
        )
    return order


def workflow_fingerprint(steps: Sequence[WorkflowStep], name: str | None) -> str:
    """A stable hash of a workflow request: its name and, in order, each step's name,
    type, request (:func:`~jobcore.usecases.enqueue.submit.request_fingerprint`: the
    payload as sent, attempts, entity), edges and ``finally``. What an idempotency key is
    matched on; stored with the workflow, so a change here turns every client's retry of
    an earlier request into a different request."""
    document = {
        "name": name,
        "jobs": [
            {
                "name": step.name,
                "type": step.request.job_type.name,
                "request": step.request.fingerprint,
                "depends_on": [[d.name, d.policy.value] for d in step.depends_on],
                "finally": step.is_finally,
            }
            for step in steps
        ],
    }
    return hashlib.sha256(orjson.dumps(document, option=orjson.OPT_SORT_KEYS)).hexdigest()


async def create_workflow(
    uow: Session,
    topology: Topology,
    *,
    tenant: str,
    steps: Sequence[WorkflowStep],
    name: str | None = None,
    quotas: Quotas = UNLIMITED,
    key_id: uuid.UUID | None = None,
    idempotency_key: str | None = None,
) -> WorkflowCreated:
    """Write the workflow, every step and every edge through ``uow`` (the caller commits):
    all of them, or nothing when the graph is invalid or the tenant's quotas do not admit
    every step (:class:`~jobcore.kernel.errors.QuotaExceeded`).

    ``idempotency_key`` (per tenant): a request whose key a workflow of the tenant already
    holds writes nothing and uses no quota; it answers that workflow (``replayed``) when
    the request is the same (:func:`workflow_fingerprint`), and
    :class:`~jobcore.kernel.errors.IdempotencyConflict` when it is not. Two requests racing
    with one key make one workflow (a unique index): the second answers the first's."""
    check_idempotency_key(idempotency_key)
    check_graph(steps)
    fingerprint = workflow_fingerprint(steps, name)
    ids = {step.name: uuid.uuid4() for step in steps}
    trace = capture_trace_headers()
    types: list[JobType[Any]] = [step.request.job_type for step in steps]
    gates = [
        job_gates(t, tenant=tenant, payload=step.request.document, ordering_key=None)
        for t, step in zip(types, steps, strict=True)
    ]
    edges = [
        (ids[dependency.name], ids[step.name], dependency.policy.value)
        for step in steps
        for dependency in step.depends_on
    ]
    workflow_id = uuid.uuid4()
    params: WorkflowInsertParams = {
        "id": workflow_id,
        "tenant": tenant,
        "name": name,
        "exchange": topology.jobs_exchange,
        "key_id": key_id,
        "channel": OUTBOX_CHANNEL,
        "ids": [ids[step.name] for step in steps],
        "names": [step.name for step in steps],
        "types": [t.name for t in types],
        "queues": [t.queue for t in types],
        "routing_keys": [topology.routing_key(t.queue) for t in types],
        "payloads": [Jsonb(step.request.document) for step in steps],
        "fingerprints": [step.request.fingerprint for step in steps],
        "entity_ids": [step.request.entity_id for step in steps],
        "max_attempts": [
            step.request.max_attempts or t.max_attempts
            for step, t in zip(steps, types, strict=True)
        ],
        "priorities": [
            int(t.priority if step.request.priority is None else step.request.priority)
            for step, t in zip(steps, types, strict=True)
        ],
        "finals": [step.is_finally for step in steps],
        "waiting": [len(step.depends_on) for step in steps],
        "message_ids": [uuid.uuid4() for _ in steps],
        "bodies": [
            JobMessage(job_id=ids[step.name], attempt=1, type=t.name).encode()
            for step, t in zip(steps, types, strict=True)
        ],
        "concurrency_keys": [gate["concurrency_key"] for gate in gates],
        "concurrency_limits": [None if t.concurrency is None else t.concurrency.n for t in types],
        "rate_keys": [gate["rate_key"] for gate in gates],
        "rate_per_seconds": [None if t.rate is None else t.rate.per_second for t in types],
        "rate_bursts": [None if t.rate is None else t.rate.burst for t in types],
        "traceparent": trace.get("traceparent"),
        "tracestate": trace.get("tracestate"),
        "headers": Jsonb(trace),
        "edge_upstreams": [e[0] for e in edges],
        "edge_downstreams": [e[1] for e in edges],
        "edge_policies": [e[2] for e in edges],
        "default_rate": quotas.enqueue_rate,
        "default_burst": quotas.enqueue_burst,
        "default_max_unfinished": quotas.max_unfinished,
        "default_max_long_polls": quotas.max_long_polls,
        "idempotency_key": idempotency_key,
        "request_fingerprint": fingerprint,
    }
    row = await workflow_store.insert(
        uow, params, behind=tenant_store.lock_usage_statement({"tenant": tenant})
    )
    if row is None:
        raise InvalidApiKey()
    limit = RateLimit(float(row["rate"]), int(row["burst"]))
    headers = rate_headers(limit, seconds_of(row["rate_tat"]), row["now"].timestamp())
    if row["id"] is not None:
        return WorkflowCreated(row["id"], row["created_at"], ids, int(row["published"]), headers)
    if idempotency_key is not None:
        holder: Mapping[str, Any] | None = None
        if row["existing_id"] is not None:
            holder = {
                "id": row["existing_id"],
                "request_fingerprint": row["existing_fingerprint"],
                "created_at": row["existing_created_at"],
            }
        elif row["refusal"] is None:
            # The insert met a key committed after its statement's snapshot (ON CONFLICT
            # DO NOTHING): a statement of its own, with a later snapshot, sees it.
            holder = await workflow_store.get_by_idempotency_key(
                uow, {"tenant": tenant, "idempotency_key": idempotency_key}
            )
            if holder is None:  # pragma: no cover - a held key's workflow is never deleted
                raise IdempotencyConflict("the idempotency key's workflow disappeared; retry")
        if holder is not None:
            if holder["request_fingerprint"] != fingerprint:
                raise IdempotencyConflict(
                    f"idempotency key already used for workflow {holder['id']} with a "
                    "different request"
                )
            jobs = await workflow_store.step_ids(uow, {"id": holder["id"]})
            return WorkflowCreated(holder["id"], holder["created_at"], jobs, 0, headers, True)
    raise quota_refusal(row, limit, headers)


async def get_workflow(on: Reader, workflow_id: uuid.UUID, *, tenant: str | None) -> dict[str, Any]:
    """The workflow with its steps (each its status and incoming edges) and counts by
    status; :class:`WorkflowNotFound` if it is not the tenant's (``tenant`` None: any)."""
    row = await workflow_store.get(on, {"id": workflow_id, "tenant": tenant})
    if row is None:
        raise WorkflowNotFound(f"no workflow {workflow_id}")
    steps = [dict(step) for step in await workflow_store.steps(on, {"id": workflow_id})]
    counts: dict[str, int] = {}
    for step in steps:
        counts[step["status"]] = counts.get(step["status"], 0) + 1
        step["waiting_for_dependencies"] = (
            step["status"] == "pending" and step["held_reason"] == "dependencies"
        )
    return {**dict(row), "counts": counts, "jobs": steps}


async def list_workflows(
    on: Reader, *, tenant: str | None, status: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    if tenant is None:
        rows = await workflow_store.list_workflows(on, {"status": status, "limit": limit})
    else:
        rows = await workflow_store.list_for_tenant(
            on, {"tenant": tenant, "status": status, "limit": limit}
        )
    return [dict(row) for row in rows]


@dataclass(slots=True)
class _Work:
    """A workflow operation's unit of work, audited when it has an actor (``audit``)."""

    uow: UnitOfWork
    audit: AuditedWork | None

    def note(self, tenant: str, **details: Any) -> None:
        if self.audit is not None:
            self.audit.entry.tenant = tenant
            self.audit.entry.details.update(details)

    async def commit(self) -> None:
        if self.audit is not None:
            await self.audit.commit()
        else:
            await self.uow.commit()


@contextlib.asynccontextmanager
async def _work(
    db: Database, actor: str | None, action: AuditAction, target: Target
) -> AsyncIterator[_Work]:
    """As a single job's operation is (jobcore.usecases.jobs): with an actor, the entry is
    written in the operation's transaction, and a refusal is recorded as refused."""
    if actor is None:
        async with db.unit_of_work() as uow:
            yield _Work(uow, None)
    else:
        async with audited(db, actor=actor, action=action, target=target) as audit:
            yield _Work(audit.uow, audit)


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    id: uuid.UUID
    cancelled: int
    asked_to_stop: int


async def cancel_workflow(
    db: Database, workflow_id: uuid.UUID, *, tenant: str | None, actor: str | None = None
) -> CancelOutcome:
    """Cancel every step that has not ended: pending ones at once, running ones asked to
    stop (their workers end them cancelled), `finally` steps included. First the workflow
    is marked (from then on no settle publishes a step of it), then passes over its
    steps, each a short transaction, until none is left.

    ``actor``: an operator's cancel (the CLI, the console), audited as
    ``workflow.cancel``: the entry commits with the mark, which decides the cancel (the
    passes only carry it out). A tenant cancelling its own workflow is not audited, as
    its cancel of its own job is not."""
    target = Target("workflow", str(workflow_id))
    async with _work(db, actor, AuditAction.WORKFLOW_CANCEL, target) as work:
        marked = await workflow_store.request_cancel(
            work.uow, {"id": workflow_id, "tenant": tenant}
        )
        if marked is None:
            raise WorkflowNotFound(f"no workflow {workflow_id}")
        work.note(marked["tenant"], status=marked["status"])
        await work.commit()
    cancelled = asked = 0
    for turn in range(CANCEL_PASSES):
        try:
            async with db.unit_of_work() as uow:
                row = await workflow_store.cancel_steps(
                    uow, {"id": workflow_id, "cancel_channel": CANCEL_CHANNEL}
                )
                await uow.commit()
        except TransientConflict:
            row = None
        if row is not None:
            cancelled += int(row["cancelled"])
            asked += int(row["asked"])
            if row["left"] == 0:
                break
        # A step another transaction held: it is being settled or claimed right now.
        await asyncio.sleep(min(0.01 * (turn + 1), 0.2))
    return CancelOutcome(workflow_id, cancelled, asked)


@dataclass(frozen=True, slots=True)
class RetryStepOutcome:
    workflow_id: uuid.UUID
    name: str
    job_id: uuid.UUID


async def retry_step(
    db: Database,
    topology: Topology,
    workflow_id: uuid.UUID,
    name: str,
    *,
    tenant: str | None,
    actor: str | None = None,
) -> RetryStepOutcome:
    """Run a failed (or cancelled) step again, in place: the same job, as many attempts
    again as it had. The steps it had made unreachable wait for its new outcome, and run
    if it allows them. A step cancelled as unreachable is not retried itself
    (:class:`~jobcore.kernel.errors.JobNotRetryable` names the dependency to retry).

    ``actor``: who asked, audited as ``workflow.retry`` in the retry's transaction (a
    refusal recorded as refused), as a single job's retry is."""
    target = Target("workflow", str(workflow_id))
    async with _work(db, actor, AuditAction.WORKFLOW_RETRY, target) as work:
        uow = work.uow
        workflow = await workflow_store.get(uow, {"id": workflow_id, "tenant": tenant})
        if workflow is None:
            raise WorkflowNotFound(f"no workflow {workflow_id}")
        work.note(workflow["tenant"], name=name)
        row = await workflow_store.retry_step(
            uow,
            {
                "workflow_id": workflow_id,
                "name": name,
                "tenant": tenant,
                "message_id": uuid.uuid4(),
                "exchange": topology.jobs_exchange,
                "channel": OUTBOX_CHANNEL,
            },
        )
        if row is None:
            raise WorkflowStepNotFound(f"workflow {workflow_id} has no job named {name!r}")
        if not row["retried"]:
            if row["cancel_requested_at"] is not None:
                raise JobNotRetryable(f"workflow {workflow_id} was cancelled")
            if row["blocked_by"] is not None:
                raise JobNotRetryable(
                    f"job {name!r} was cancelled because its dependency (job "
                    f"{row['blocked_by']}) did not allow it to run; retry that one"
                )
            raise JobNotRetryable(
                f"job {name!r} is {row['status_before']}; only failed or cancelled jobs"
            )
        work.note(workflow["tenant"], job_id=row["id"])
        await work.commit()
    return RetryStepOutcome(workflow_id, name, row["id"])


def steps_from_documents(
    documents: Sequence[Mapping[str, Any]],
    resolve: Any,
    tenant: str,
) -> list[WorkflowStep]:
    """Steps from their JSON documents (``name``, ``type``, ``payload``, ``depends_on``:
    names or ``{"name", "policy"}``, ``finally``, ``max_attempts``, ``entity_id``);
    ``resolve(type_name, payload)`` gives the job type and its validated payload."""
    steps = []
    for n, document in enumerate(documents):
        job_type, payload = resolve(document["type"], document.get("payload", {}), n)
        request = EnqueueRequest(
            tenant=tenant,
            job_type=job_type,
            payload=payload,
            sent=document.get("payload", {}),
            entity_id=document.get("entity_id"),
            max_attempts=document.get("max_attempts"),
        )
        depends_on = []
        for dependency in document.get("depends_on") or ():
            if isinstance(dependency, str):
                depends_on.append(Dependency(dependency))
            else:
                depends_on.append(
                    Dependency(
                        dependency["name"], EdgePolicy(dependency.get("policy", "on_success"))
                    )
                )
        steps.append(
            WorkflowStep(
                name=document["name"],
                request=request,
                depends_on=depends_on,
                is_finally=bool(document.get("finally", False)),
            )
        )
    return steps


def payload_size(document: Any) -> int:
    return len(orjson.dumps(document))


def graph_levels(jobs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """A workflow's jobs (as :func:`get_workflow` lists them) in columns: each job one
    column right of its furthest dependency, `finally` jobs in a last column of their own.
    What the CLI and the console draw the graph from."""
    depends = {job["name"]: [edge["name"] for edge in job["depends_on"]] for job in jobs}
    level: dict[str, int] = {}

    def depth(name: str) -> int:
        # Iterative: a 10,000-job chain is deeper than Python's recursion limit.
        stack = [name]
        while stack:
            top = stack[-1]
            pending = [d for d in depends[top] if d not in level]
            if pending:
                stack.extend(pending)
                continue
            level[top] = 1 + max((level[d] for d in depends[top]), default=-1)
            stack.pop()
        return level[name]

    finals = [job["name"] for job in jobs if job.get("is_finally")]
    columns: dict[int, list[str]] = {}
    for job in jobs:
        if not job.get("is_finally"):
            columns.setdefault(depth(job["name"]), []).append(job["name"])
    ordered = [columns[n] for n in sorted(columns)]
    if finals:
        ordered.append(finals)
    return ordered
