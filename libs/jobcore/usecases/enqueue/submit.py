"""The enqueue use case: one :class:`EnqueueRequest` per job, for one job
(:func:`enqueue`) or a batch of them (:func:`enqueue_many`).

It sits beside :mod:`jobcore.usecases`, not in it, because both layers that call into each
other need it: the maintenance package's scheduler enqueues its ticks, and the use cases
call the maintenance package (a prune, a schedule triggered by hand), so a module inside
either package would close an import circle between them.

Every caller that enqueues builds the request: ``POST /jobs/{type}`` and its batch route,
the scheduler's ticks (:mod:`jobcore.maintenance.schedule_ticks`), a retry
(:mod:`jobcore.usecases.jobs`), the testing kit (:mod:`jobcore.testing`) and the bench.
Building it checks its fields (the rules are here and nowhere else) and computes what
follows from them: when the job is due, its unique key, and the fingerprint an
idempotency key is matched on. A field that breaks a rule raises
:class:`~jobcore.kernel.errors.InvalidField` naming the field; where the field came from (a
query parameter, a batch item) is for the caller to say.

Writing is :mod:`jobcore.usecases.enqueue.write_one` (the job and its outbox message in one
statement, invariant 1 of docs/design.md) and :mod:`jobcore.usecases.enqueue.write_many` (many in
one transaction). The payload itself is checked before the request is built
(:func:`jobcore.execution.payloads. validate_payload`), so that the API can answer a bad body before
its query.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import orjson
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from jobcore.access.apikeys import InvalidApiKey
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, Session
from jobcore.database.store import JobInsertParams, JobKeyParams
from jobcore.execution.job_messages import job_message_row
from jobcore.execution.registry import JobType
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.errors import (
    IdempotencyConflict,
    InvalidField,
    InvalidIdempotencyKey,
    InvalidUniqueKey,
    JobcoreError,
    QuotaExceeded,
    UniqueJobExists,
)
from jobcore.kernel.priorities import Priority
from jobcore.kernel.quotas import UNLIMITED, Admission, Quotas, rate_headers
from jobcore.storage.results import ResultStore
from jobcore.telemetry.traces import capture_trace_headers
from jobcore.usecases.enqueue.wakeups import RelayWakeups
from jobcore.usecases.enqueue.write_many import (
    BatchItem,
    BatchResult,
    ItemOutcome,
    ItemStatus,
    write_batch,
)
from jobcore.usecases.enqueue.write_one import (
    EnqueueResult,
    answer_before_upload,
    forget_upload,
    job_gates,
    job_key_params,
    write_job,
)

log = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY_LENGTH = 255
MAX_UNIQUE_KEY_LENGTH = 255
# How far ahead a job may be scheduled.
MAX_SCHEDULE_AHEAD = timedelta(days=366)


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """What one enqueue asks for, checked when built (:class:`~jobcore.kernel.errors.InvalidField`).

    A plain frozen dataclass, not a pydantic model: it is built once per ``POST /jobs``,
    from values the caller has parsed already (the payload validated by its job type's
    model, the API's query by its own schema), so what is left to check is a handful of
    rules between fields, cheaper written out than run through a validator.

    ``payload``: the job type's model, validated (:func:`jobcore.execution.payloads.
    validate_payload`); ``sent``: the payload as the client sent it, parsed, when it came
    as JSON (the fingerprint covers what was sent, so that a model gaining a defaulted
    field in a deploy does not turn a client's retry into a different request); None: the
    payload's own JSON.

    ``idempotency_key``: with a key already used for this tenant and type, the enqueue
    answers that job when the request's fingerprint is the same, and refuses it
    (:class:`~jobcore.kernel.errors.IdempotencyConflict`) when it differs. ``unique_key``: while a
    pending or running job of the tenant and type holds the key, no job is written
    (:class:`~jobcore.kernel.errors.UniqueJobExists`); without one, the job type's
    ``unique_field`` of the payload, if it names one. ``run_at`` (with a time zone) or
    ``delay`` (seconds from now), as sent: when the job may first run. ``priority``: the
    job type's unless given. Jobs of the tenant with the same ``ordering_key`` start one
    after another in enqueue order (:mod:`jobcore.kernel.gates`). ``callback_url`` (checked by
    the caller: :func:`jobcore.execution.completion_webhooks.check_callback_url`) receives the
    completion webhook; without one, the tenant's default endpoint does.

    Not from clients: ``key_id``, the API key the request came with, checked usable in
    the statement that writes (:class:`~jobcore.access.apikeys.InvalidApiKey` if it was revoked
    or expired by then); ``origin``, for the job's ``accepted`` event (the schedule that
    enqueued it, the job it retries: a few short strings, never payload data);
    ``ordering_seq``, a place in the ordering key (a retry taking the place of the failed
    job that blocks its key, :func:`jobcore.usecases.jobs.retry_job`) instead of the next;
    ``batch_id``, the batch the job joins (:mod:`jobcore.usecases.batches`, whose caller
    holds the batch's row and counts the job in it).
    """

    tenant: str
    job_type: JobType[Any]
    payload: BaseModel
    sent: Any = None
    idempotency_key: str | None = None
    unique_key: str | None = None
    entity_id: str | None = None
    max_attempts: int | None = None
    run_at: datetime | None = None
    delay: float | None = None
    priority: Priority | None = None
    ordering_key: str | None = None
    callback_url: str | None = None
    key_id: uuid.UUID | None = None
    origin: Mapping[str, str] | None = None
    ordering_seq: int | None = None
    batch_id: uuid.UUID | None = None
    # What follows from the fields above, set when the request is built.
    # The payload as JSON: what is stored.
    document: Any = field(init=False, repr=False, compare=False)
    # When the job may first run (None: now).
    due_at: datetime | None = field(init=False, repr=False, compare=False)
    # The unique key the job holds: unique_key, else the payload's unique field, else none.
    held_key: str | None = field(init=False, repr=False, compare=False)
    # What an idempotency key is matched on (request_fingerprint).
    fingerprint: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The order the API reports a request's first error in: its key, when it runs,
        # its unique key.
        check_idempotency_key(self.idempotency_key)
        document = self.payload.model_dump(mode="json")
        object.__setattr__(self, "document", document)
        if self.job_type.debounce is not None and (
            self.run_at is not None or self.delay is not None
        ):
            # Its key's enqueues decide when it runs (jobcore.kernel.keyed).
            given = "run_at" if self.run_at is not None else "delay"
            raise InvalidField(
                given,
                "a debounced job type's jobs run a period after their key's last enqueue; "
                "it takes no run_at or delay",
                kind="conflict",
            )
        keyed = self.job_type.debounce is not None or self.job_type.throttle is not None
        if keyed and self.batch_id is not None:
            # A batch counts each of its members once; an enqueue of a key may join a job
            # that is not a member of the batch (or is another batch's).
            raise InvalidField(
                "type",
                "a job type debounced or throttled by key cannot be a batch member",
                kind="conflict",
            )
        object.__setattr__(self, "due_at", _due_at(self.run_at, self.delay))
        object.__setattr__(self, "held_key", _held_key(self.job_type, document, self.unique_key))
        object.__setattr__(self, "fingerprint", request_fingerprint(self))


class PayloadUploads(Protocol):
    """What an enqueue reports of its payload uploads (the API's metrics take it): each
    upload's size, and each upload whose job was then not written (deleted at once)."""

    def uploaded(self, size: int) -> None: ...

    def unused(self) -> None: ...


def check_idempotency_key(key: str | None) -> None:
    """1 to 255 printable ASCII characters (space to tilde), or no key at all."""
    if key is None:
        return
    if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        raise InvalidIdempotencyKey()


def _due_at(run_at: datetime | None, delay: float | None) -> datetime | None:
    """When a job may first run: ``run_at``, or now + ``delay`` seconds, or now (None)."""
    if run_at is not None and delay is not None:
        raise InvalidField("delay", "give run_at or delay, not both", kind="conflict")
    if delay is not None:
        return datetime.now(UTC) + timedelta(seconds=delay)
    if run_at is None:
        return None
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidField("run_at", "needs a time zone offset", kind="timezone")
    try:
        when = run_at.astimezone(UTC)
    except OverflowError:
        when = None
    if when is None or when - datetime.now(UTC) > MAX_SCHEDULE_AHEAD:
        reason = f"must be within {MAX_SCHEDULE_AHEAD.days} days from now"
        raise InvalidField("run_at", reason, kind="range")
    return when


def _held_key(job_type: JobType[Any], document: Any, explicit: str | None) -> str | None:
    """The job's unique key: ``explicit`` (the request's ``unique_key``), else the value of
    the payload field the job type names (``unique_field``; a string as it is, anything
    else as canonical JSON), else none. ``document``: the validated payload as JSON."""
    if explicit is not None:
        if not 1 <= len(explicit) <= MAX_UNIQUE_KEY_LENGTH or "\x00" in explicit:
            raise InvalidUniqueKey(
                "unique_key", "a unique key is 1 to 255 characters, without NUL", kind="unique_key"
            )
        return explicit
    if job_type.unique_field is None:
        return None
    value = document.get(job_type.unique_field) if isinstance(document, dict) else None
    if value is None:
        return None
    key = value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if isinstance(key, bytes):
        key = key.decode()
    if len(key) > MAX_UNIQUE_KEY_LENGTH:
        raise InvalidUniqueKey(
            "payload",
            f"the job type's unique key is this field, at most {MAX_UNIQUE_KEY_LENGTH} "
            "characters (as JSON unless a string)",
            kind="unique_key",
            path=(job_type.unique_field,),
        )
    return key


def request_fingerprint(request: EnqueueRequest) -> str:
    """A stable hash of the request as the client sent it: the payload's JSON (key order
    and whitespace do not matter) and every field that changes the job. The only place an
    enqueue's fingerprint is computed (it is stored with the job, so a change here turns
    every client's retry of an earlier request into a different request).

    The payload as sent (``sent``), else its JSON. ``delay`` is kept as sent (the same
    delay is the same request, whenever it is retried); ``run_at`` as an instant in UTC.
    ``unique_key``, ``priority`` and ``ordering_key`` count only when given, so requests
    without them hash as they did before those existed (their retries still replay).
    """
    fields: dict[str, Any] = {
        "payload": request.document if request.sent is None else request.sent,
        "callback_url": request.callback_url,
        "run_at": None if request.run_at is None else _instant(request.run_at),
        "delay": request.delay,
        "max_attempts": request.max_attempts,
        "entity_id": request.entity_id,
    }
    if request.unique_key is not None:
        fields["unique_key"] = request.unique_key
    if request.priority is not None:
        fields["priority"] = int(request.priority)
    if request.ordering_key is not None:
        fields["ordering_key"] = request.ordering_key
    canonical = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def _instant(when: datetime) -> str:
    return (when.astimezone(UTC) if when.tzinfo is not None else when).isoformat()


def _job_params(
    topology: Topology,
    request: EnqueueRequest,
    *,
    quotas: Quotas,
    payload_store: ResultStore | None,
    inline_payload_max_bytes: int | None,
    trace: dict[str, str] | None,
) -> tuple[JobInsertParams, bytes | None]:
    """The insert's parameters for ``request``, and the payload to upload first (None:
    the payload goes in the row)."""
    if trace is None:
        trace = capture_trace_headers()
    job_type = request.job_type
    job_id = uuid.uuid4()
    upload: bytes | None = None
    if payload_store is not None and inline_payload_max_bytes is not None:
        encoded = orjson.dumps(request.document)
        if len(encoded) > inline_payload_max_bytes:
            if job_type.debounce is not None:
                # A joining enqueue's payload is merged into the row of the job it joins.
                raise InvalidField(
                    "payload",
                    "a debounced job type's payload is kept in the job row: at most "
                    f"{inline_payload_max_bytes} bytes as JSON",
                    kind="size",
                )
            upload = encoded
    params: JobInsertParams = {
        "id": job_id,
        "tenant": request.tenant,
        "type": job_type.name,
        "queue": job_type.queue,
        "idempotency_key": request.idempotency_key,
        "key_id": request.key_id,
        "payload_fingerprint": request.fingerprint,
        # A payload stored by reference leaves {} (the column is NOT NULL) beside its key.
        "payload": Jsonb({} if upload is not None else request.document),
        "payload_ref": None,
        "entity_id": request.entity_id,
        "max_attempts": request.max_attempts or job_type.max_attempts,
        "priority": int(job_type.priority if request.priority is None else request.priority),
        "run_at": request.due_at,
        "callback_url": request.callback_url,
        "event_detail": Jsonb(dict(request.origin or {})),
        "traceparent": trace.get("traceparent"),
        "tracestate": trace.get("tracestate"),
        "channel": OUTBOX_CHANNEL,
        "notify": True,
        "default_rate": quotas.enqueue_rate,
        "default_burst": quotas.enqueue_burst,
        "default_max_unfinished": quotas.max_unfinished,
        "default_max_long_polls": quotas.max_long_polls,
        "unique_key": request.held_key,
        **job_gates(
            job_type,
            tenant=request.tenant,
            payload=request.document,
            ordering_key=request.ordering_key,
        ),
        "ordering_seq": request.ordering_seq,
        "batch_id": request.batch_id,
        # The job's first message has the job's id (job_message_row says why).
        **job_message_row(
            topology,
            job_id=job_id,
            job_type=job_type,
            attempt=1,
            trace_headers=trace,
            message_id=job_id,
        ),
    }
    return params, upload


def _key_of(request: EnqueueRequest) -> tuple[JobKeyParams | None, bool]:
    """The debounce or throttle key ``request`` joins (None: its type declares neither),
    and whether a new trailing job asks the key's running job to stop."""
    job_type = request.job_type
    key = job_key_params(job_type, tenant=request.tenant, payload=request.document)
    return key, job_type.debounce is not None and job_type.debounce.cancel_running


async def enqueue(
    uow: Session,
    topology: Topology,
    request: EnqueueRequest,
    *,
    quotas: Quotas = UNLIMITED,
    wakeups: RelayWakeups | None = None,
    payload_store: ResultStore | None = None,
    inline_payload_max_bytes: int | None = None,
    uploads: PayloadUploads | None = None,
    trace: dict[str, str] | None = None,
    admission: Admission = Admission.EXACT,
) -> EnqueueResult:
    """Write a pending job and its outbox message through ``uow``.

    The job and its message are one statement, so on a :class:`~jobcore.database.gateway.Session`
    they commit together on their own; in a unit of work, the caller commits.

    A replay (the request's idempotency key and fingerprint match a job) answers that job,
    whatever the quotas and the unique key. ``quotas``: the defaults for a tenant without
    overrides (``tenant_quotas``); over its rate limit or its cap of unfinished jobs the
    job is not written and :class:`~jobcore.kernel.errors.EnqueueRateExceeded` or
    :class:`~jobcore.kernel.errors.TooManyUnfinishedJobs` is raised. A live job holding the
    request's unique key: :class:`~jobcore.kernel.errors.UniqueJobExists` (checked after the
    idempotency key); neither uses quota.

    ``wakeups``: on a session, while other enqueues of the process are in flight, the
    statement does not NOTIFY the relays; they are woken through it once the job
    committed (why: :mod:`jobcore.usecases.enqueue.wakeups`). Alone, in a unit of work, or without
    it, the statement NOTIFYs, and the relays hear it when it commits.

    ``payload_store``: a payload whose JSON is larger than ``inline_payload_max_bytes``
    is stored there first (``payloads/<job id>.json``) and the row keeps its key in
    ``payload_ref``; :class:`~jobcore.storage.results.StoreUnavailable` (nothing written) when the
    store cannot take it. What the enqueue would answer without writing (a replay, a key
    taken, a quota's refusal) is read first
    (:func:`jobcore.usecases.enqueue.write_one.answer_before_upload`) and answered with no upload.
    An upload whose job is still not written (the same, decided between that read and the insert;
    the statement failed) is deleted at once when possible, else by the pruner's sweep. ``uploads``
    counts them; each is also logged with its tenant and size, the per-tenant account of what went
    to the store. Here ``uow``'s connection stays checked out during the upload; :func:`enqueue_on`
    holds none meanwhile, for a job committed alone.

    ``trace``: the trace context the job carries; None: the caller's current one.
    ``admission``: how the quotas are checked (:class:`~jobcore.kernel.quotas.Admission`).
    """
    params, upload = _job_params(
        topology,
        request,
        quotas=quotas,
        payload_store=payload_store,
        inline_payload_max_bytes=inline_payload_max_bytes,
        trace=trace,
    )
    key, cancel = _key_of(request)
    if upload is None or payload_store is None:
        return await write_job(
            uow,
            params,
            legacy=request.payload,
            wakeups=wakeups,
            admission=admission,
            key=key,
            cancel_running=cancel,
        )
    answered = await answer_before_upload(uow, params, legacy=request.payload)
    if answered is not None:
        return answered
    payload_ref = await _upload(payload_store, params, upload, request.tenant, uploads)
    return await _write_uploaded(
        write_job(
            uow,
            params,
            legacy=request.payload,
            wakeups=wakeups,
            admission=admission,
            key=key,
            cancel_running=cancel,
        ),
        params,
        payload_store,
        payload_ref,
        uploads,
    )


async def enqueue_on(
    db: Database,
    topology: Topology,
    request: EnqueueRequest,
    *,
    quotas: Quotas = UNLIMITED,
    wakeups: RelayWakeups | None = None,
    payload_store: ResultStore | None = None,
    inline_payload_max_bytes: int | None = None,
    uploads: PayloadUploads | None = None,
    trace: dict[str, str] | None = None,
) -> EnqueueResult:
    """:func:`enqueue` on sessions of ``db``'s pool, the job committed alone, holding no
    connection while a payload uploads: the read before the upload has a session of its
    own, given back before the upload starts, and the insert another once it is done.
    An upload takes as long as the object store does; a pooled connection held meanwhile
    is one fewer for every other request, and a few slow uploads would drain the pool."""
    params, upload = _job_params(
        topology,
        request,
        quotas=quotas,
        payload_store=payload_store,
        inline_payload_max_bytes=inline_payload_max_bytes,
        trace=trace,
    )
    key, cancel = _key_of(request)
    if upload is None or payload_store is None:
        async with db.session() as session:
            return await write_job(
                session,
                params,
                legacy=request.payload,
                wakeups=wakeups,
                key=key,
                cancel_running=cancel,
            )
    async with db.session() as session:
        answered = await answer_before_upload(session, params, legacy=request.payload)
    if answered is not None:
        return answered
    payload_ref = await _upload(payload_store, params, upload, request.tenant, uploads)

    async def write() -> EnqueueResult:
        async with db.session() as session:
            return await write_job(
                session,
                params,
                legacy=request.payload,
                wakeups=wakeups,
                key=key,
                cancel_running=cancel,
            )

    return await _write_uploaded(write(), params, payload_store, payload_ref, uploads)


async def _upload(
    store: ResultStore,
    params: JobInsertParams,
    upload: bytes,
    tenant: str,
    uploads: PayloadUploads | None,
) -> str:
    """Store the payload of the job ``params`` describe; its key, set in ``params``."""
    payload_ref = await asyncio.to_thread(store.put_payload, params["id"], upload)
    params["payload_ref"] = payload_ref
    log.info(
        "payload stored by reference",
        extra={"tenant": tenant, "job_id": str(params["id"]), "bytes": len(upload)},
    )
    if uploads is not None:
        uploads.uploaded(len(upload))
    return payload_ref


async def _write_uploaded(
    write: Awaitable[EnqueueResult],
    params: JobInsertParams,
    store: ResultStore,
    payload_ref: str,
    uploads: PayloadUploads | None,
) -> EnqueueResult:
    """Await ``write``, the insert of a job whose payload was uploaded, deleting the
    upload when no job of it was written."""
    try:
        outcome = await write
    except (InvalidApiKey, QuotaExceeded, IdempotencyConflict, UniqueJobExists):
        # Refused: no job was written. After any other error (a lost connection, a
        # cancellation) the job may have committed: the sweep decides, by its row.
        await _forget(store, payload_ref, uploads)
        raise
    if outcome.job_id != params["id"]:  # a replay answered with the earlier job
        await _forget(store, payload_ref, uploads)
    return outcome


async def _forget(store: ResultStore, key: str, uploads: PayloadUploads | None) -> None:
    if uploads is not None:
        uploads.unused()
    await forget_upload(store, key)


async def enqueue_many(
    uow: Session,
    topology: Topology,
    requests: Sequence[EnqueueRequest],
    *,
    quotas: Quotas = UNLIMITED,
    commit: bool = False,
) -> BatchResult:
    """Write the jobs of 1 to :data:`~jobcore.usecases.enqueue.write_many.MAX_BATCH_ITEMS` requests
    through ``uow``, a unit of work the caller commits: each request's outcome, in order
    (:func:`jobcore.usecases.enqueue.write_many.write_batch`). ``commit``: the caller
    commits right after, and the insert may commit ``uow`` itself (write_batch's
    ``commit``); ``uow.commit()`` then does nothing.

    The requests are of one tenant, job type and callback URL, with the job type's
    priority, no ordering key and no API key to check (what one multi-row statement
    writes); anything else is a ValueError.
    """
    if not requests:
        raise ValueError("a batch holds at least one request")
    first = requests[0]
    for request in requests:
        if (request.tenant, request.job_type, request.callback_url, request.batch_id) != (
            first.tenant,
            first.job_type,
            first.callback_url,
            first.batch_id,
        ):
            raise ValueError(
                "a batch's requests share their tenant, job type, callback URL and batch"
            )
        if (
            request.priority is not None
            or request.ordering_key is not None
            or request.ordering_seq is not None
            or request.key_id is not None
            or request.origin
        ):
            raise ValueError("a batch's requests take no priority, ordering key, API key or origin")
    if first.job_type.debounce is not None or first.job_type.throttle is not None:
        return await _enqueue_keyed_batch(uow, topology, requests, quotas=quotas)
    # A member of a batch says so in its `accepted` event.
    joined = {} if first.batch_id is None else {"event_detail": {"batch_id": str(first.batch_id)}}
    items = [_batch_item(request, **joined) for request in requests]
    return await write_batch(
        uow,
        topology,
        tenant=first.tenant,
        job_type=first.job_type,
        items=items,
        callback_url=first.callback_url,
        quotas=quotas,
        batch_id=first.batch_id,
        commit=commit,
    )


async def _enqueue_keyed_batch(
    uow: Session, topology: Topology, requests: Sequence[EnqueueRequest], *, quotas: Quotas
) -> BatchResult:
    """A batch of a debounced or throttled type: each request written in turn, as a single
    enqueue, in ``uow`` (each takes its turn on its key's row, so the batch's items of one
    key join one another as separate requests would)."""
    outcomes: list[ItemOutcome] = []
    headers: dict[str, str] = {}
    for request in requests:
        try:
            result = await enqueue(uow, topology, request, quotas=quotas)
        except (UniqueJobExists, QuotaExceeded, IdempotencyConflict) as exc:
            status = (
                ItemStatus.UNIQUE_CONFLICT
                if isinstance(exc, UniqueJobExists)
                else ItemStatus.REFUSED
                if isinstance(exc, QuotaExceeded)
                else ItemStatus.INVALID
            )
            job_id = uuid.UUID(str(exc.job_id)) if isinstance(exc, UniqueJobExists) else None
            outcomes.append(ItemOutcome(status, job_id, error=exc))
            continue
        headers = result.rate_headers
        if result.joined:
            status = ItemStatus.JOINED
        elif result.replayed:
            status = ItemStatus.REPLAYED
        else:
            status = ItemStatus.CREATED
        outcomes.append(ItemOutcome(status, result.job_id, result.status, result.created_at))
    return BatchResult(requests[0].tenant, outcomes, headers)


def _batch_item(request: EnqueueRequest, **more: Any) -> BatchItem:
    """The columns of ``request``'s job as a :class:`~jobcore.usecases.enqueue.write_many.BatchItem`
    (``more``: the per-item ones a coalesced write sets and a batch takes from its type)."""
    return BatchItem(
        payload=request.document,
        fingerprint=request.fingerprint,
        idempotency_key=request.idempotency_key,
        unique_key=request.held_key,
        entity_id=request.entity_id,
        max_attempts=request.max_attempts,
        run_at=request.due_at,
        **more,
    )


def coalescable(request: EnqueueRequest, inline_payload_max_bytes: int | None) -> bool:
    """Whether :func:`enqueue_coalesced` writes ``request`` exactly as :func:`enqueue`
    would: not with an ordering key (its place is taken in the single statement), nor a
    payload that goes to the object store (larger than ``inline_payload_max_bytes``)."""
    if request.ordering_key is not None or request.ordering_seq is not None:
        return False
    if request.job_type.debounce is not None or request.job_type.throttle is not None:
        # Each enqueue of a key takes its turn on the key's row (write_one).
        return False
    if request.batch_id is not None:  # its batch is counted in its own transaction
        return False
    if inline_payload_max_bytes is None:
        return True
    return len(orjson.dumps(request.document)) <= inline_payload_max_bytes


def coalescing_key(request: EnqueueRequest) -> tuple[str, str, uuid.UUID | None]:
    """Requests :func:`enqueue_coalesced` may write together share this: the tenant, the
    job type and the API key (the statement checks one key)."""
    return (request.tenant, request.job_type.name, request.key_id)


async def enqueue_coalesced(
    db: Database,
    topology: Topology,
    requests: Sequence[EnqueueRequest],
    traces: Sequence[dict[str, str]],
    *,
    quotas: Quotas = UNLIMITED,
    wakeups: RelayWakeups | None = None,
) -> list[EnqueueResult | JobcoreError]:
    """Write the jobs of several single enqueues (one :func:`coalescing_key`, each
    :func:`coalescable`, no two with the same idempotency or unique key) in one
    transaction, and answer each as :func:`enqueue` would have answered it alone had they
    come one after another in this order: its :class:`EnqueueResult` (with the RateLimit
    headers of its own turn), or the error it would have raised
    (:class:`~jobcore.kernel.errors.UniqueJobExists`, a
    :class:`~jobcore.kernel.errors.QuotaExceeded`,
    :class:`~jobcore.kernel.errors.IdempotencyConflict`). ``traces``: each request's trace context
    (captured where its request was served).

    Each job is written as :func:`enqueue` writes it (the same columns, its own outbox
    message and trace context); they commit together, with one lock of the tenant's usage
    row and one commit (:func:`jobcore.usecases.enqueue.write_many.write_batch`). A failure of the
    transaction (:class:`~jobcore.kernel.errors.DatabaseUnavailable`,
    :class:`~jobcore.access.apikeys.InvalidApiKey` for a key revoked since) is raised: it is every
    request's answer. ``wakeups``: as for
    :func:`enqueue`, for the transaction as a whole.
    """
    if not requests or len(requests) != len(traces):
        raise ValueError("one trace context per request, at least one request")
    first = requests[0]
    key = coalescing_key(first)
    idempotency_keys: set[str] = set()
    unique_keys: set[str] = set()
    for request in requests:
        if coalescing_key(request) != key or not coalescable(request, None):
            raise ValueError("coalesced requests share tenant, job type and API key")
        for taken, value in (
            (idempotency_keys, request.idempotency_key),
            (unique_keys, request.held_key),
        ):
            if value is not None:
                if value in taken:
                    raise ValueError("coalesced requests hold different keys")
                taken.add(value)
    items = [
        _batch_item(
            request,
            priority=None if request.priority is None else int(request.priority),
            callback_url=request.callback_url,
            trace=trace,
            event_detail=dict(request.origin or {}),
            legacy_replay=True,
        )
        for request, trace in zip(requests, traces, strict=True)
    ]
    alone = True
    with contextlib.ExitStack() as stack:
        if wakeups is not None:
            alone = stack.enter_context(wakeups.enqueuing())
        async with db.unit_of_work(begin_with_first_statement=True) as uow:
            result = await write_batch(
                uow,
                topology,
                tenant=first.tenant,
                job_type=first.job_type,
                items=items,
                quotas=quotas,
                key_id=first.key_id,
                notify=alone,
            )
            await uow.commit()
    created = result.count(ItemStatus.CREATED)
    if wakeups is not None and not alone and created:
        wakeups.wake()
    return _single_answers(result, created)


def _single_answers(result: BatchResult, created: int) -> list[EnqueueResult | JobcoreError]:
    """Each item's outcome as its single enqueue's answer; the RateLimit headers as they
    stood after its own turn (the jobs created before it in the group's order)."""
    answers: list[EnqueueResult | JobcoreError] = []
    seen = 0
    for outcome in result.outcomes:
        if outcome.status is ItemStatus.CREATED:
            seen += 1
        if outcome.error is not None:
            answers.append(outcome.error)
            continue
        assert outcome.job_id is not None
        assert outcome.job_status is not None
        assert outcome.created_at is not None
        headers = result.rate_headers
        limit, tat = result.limit, result.rate_tat
        if limit is not None and limit.limited and tat is not None and seen < created:
            headers = rate_headers(limit, tat - (created - seen) / limit.rate, result.now)
        answers.append(
            EnqueueResult(
                result.tenant,
                outcome.job_id,
                outcome.job_status,
                outcome.created_at,
                outcome.status is ItemStatus.REPLAYED,
                headers,
            )
        )
    return answers
