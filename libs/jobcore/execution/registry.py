"""The handler registry: what a job type is, and where the services look it up.

A job type has a name, a queue, a pydantic payload model, max attempts, a timeout and a
lease length. The API uses the registry to validate payloads and route jobs to queues;
the worker uses it to run handlers. Modules listed in ``JOBCORE_JOB_MODULES`` are
imported at start-up and register their types on :data:`default_registry`.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from jobcore.amqp.topology import WEBHOOKS_QUEUE
from jobcore.execution.progress import checked_progress
from jobcore.execution.transaction import Fence, JobTransaction
from jobcore.kernel.errors import (
    ConfigurationError,
    DuplicateRegistration,
    InvalidPayload,
    ServiceStateError,
    UnknownJobType,
)
from jobcore.kernel.gates import Limit, OrderingOnFailure, Rate
from jobcore.kernel.keyed import Debounce, Throttle
from jobcore.kernel.priorities import DEFAULT_PRIORITY, Priority

if TYPE_CHECKING:
    from jobcore.kernel.settings import Settings
    from jobcore.storage.results import ResultStore

P = TypeVar("P", bound=BaseModel)

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

MAX_ATTEMPTS_LIMIT = 100
MAX_SNOOZES_LIMIT = 100_000
# Queues jobcore consumes for its own messages: a job type there would be read as one.
RESERVED_QUEUES = frozenset({WEBHOOKS_QUEUE})


@dataclass(slots=True)
class JobContext(Generic[P]):
    """What a handler gets: the job, its validated payload, and hooks into the worker."""

    job_id: uuid.UUID
    job_type: str
    payload: P
    attempt: int
    max_attempts: int
    # Stable across retries of the same job: pass it to external APIs that deduplicate.
    idempotency_key: str
    heartbeat: Callable[[], Awaitable[None]]
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)
    extras: dict[str, Any] = field(default_factory=dict)
    # A job type debounced with payloads="all" (jobcore.kernel.keyed): every payload its job
    # coalesced, validated, in enqueue order (``payload`` is the last). Empty otherwise.
    payloads: list[P] = field(default_factory=list)
    # Set by the worker. Effects are buffered here and written to ``job_effects`` in the
    # transaction that records success, so a failed or abandoned attempt leaves none.
    effects: list[Effect] = field(default_factory=list)
    result_store: ResultStore | None = None
    result_ref: str | None = None
    settings: Settings | None = None
    # Set by the worker: this attempt's lease token (ctx.fence), what opens a transaction
    # committed with this attempt's success (ctx.transaction), and where progress goes.
    lease_token: uuid.UUID | None = None
    open_transaction: Callable[[], AbstractAsyncContextManager[JobTransaction]] | None = None
    report_progress: Callable[[float, str | None], None] | None = None
    # Times the job was snoozed before this run (jobcore.kernel.errors.Snooze): a snooze
    # keeps the attempt number, and this tells a handler how long it has been waiting.
    snoozes: int = 0
    # Set by the worker: what reads a workflow step's dependencies (ctx.dependency_results).
    read_dependencies: Callable[[], Awaitable[dict[str, Any]]] | None = None

    async def dependency_results(self) -> dict[str, Any]:
        """A workflow step's dependencies by name, each a
        :class:`~jobcore.execution.dependencies.DependencyResult` (status, result inline or
        read from the result store, error); empty for a job outside a workflow."""
        if self.read_dependencies is None:
            raise ServiceStateError("this context reads no dependencies (it runs outside a worker)")
        return await self.read_dependencies()

    @property
    def fence(self) -> Fence:
        """This attempt's job id, attempt number and lease token, for writes to other stores
        made conditional on them (docs/handlers.md)."""
        if self.lease_token is None:
            raise ServiceStateError("this context holds no lease (it runs outside a worker)")
        return Fence(self.job_id, self.attempt, self.lease_token)

    def transaction(self) -> AbstractAsyncContextManager[JobTransaction]:
        """``async with ctx.transaction() as tx:`` a transaction on the jobcore database
        whose commit also records this attempt's success, fenced by its lease
        (:mod:`jobcore.execution.transaction`); :class:`~jobcore.kernel.errors.LeaseLost` when the
        lease was lost, with nothing committed. One per attempt; the job has succeeded once it
        commits."""
        if self.open_transaction is None:
            raise ServiceStateError("this context has no transaction (it runs outside a worker)")
        return self.open_transaction()

    async def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far the job is (``fraction`` in [0, 1], an optional ``message`` of at
        most 500 characters). Cheap to call often: the worker writes the latest report at
        most every 250 ms, and what is pending before the outcome; ValueError when out of
        bounds."""
        value, text = checked_progress(fraction, message)
        if self.report_progress is not None:
            self.report_progress(value, text)

    def record_effect(self, kind: str, detail: dict[str, Any] | None = None) -> None:
        """Note a side effect; it is committed only if this attempt succeeds.

        Checked here, so a bad effect fails this handler's attempt instead of the
        statement that records a whole batch of successes.
        """
        if not isinstance(kind, str) or not 1 <= len(kind) <= 200 or "\x00" in kind:
            raise TypeError("an effect kind is a string of 1-200 characters without NUL")
        detail = dict(detail or {})
        try:
            encoded = orjson.dumps(detail)
        except TypeError as exc:
            raise TypeError(f"an effect's detail must be JSON: {exc}") from None
        if b"\\u0000" in encoded:
            raise TypeError("an effect's detail cannot contain NUL characters (PostgreSQL jsonb)")
        self.effects.append(Effect(kind, detail))

    async def put_result(self, data: bytes, *, suffix: str) -> str:
        """Store a result file for this job; the job's ``result_ref`` will name it.

        The key names this attempt's lease token, so an attempt that lost its lease while
        its upload still ran never replaces the result of the attempt that succeeded; the
        pruner's sweep deletes the files of attempts that did not.
        """
        if self.result_store is None:
            raise ServiceStateError("this context has no result store")
        key = await asyncio.to_thread(
            self.result_store.put, self.job_id, data, suffix=suffix, lease_token=self.lease_token
        )
        self.result_ref = key
        return key

    async def put_result_chunks(self, chunks: Iterable[bytes], *, suffix: str) -> tuple[str, int]:
        """Store a result made by ``chunks`` as they come (the whole never in memory);
        its key and size. ``chunks`` is consumed in a thread: produce them with plain,
        blocking code."""
        if self.result_store is None:
            raise ServiceStateError("this context has no result store")
        key, size = await asyncio.to_thread(
            self.result_store.put_chunks,
            self.job_id,
            chunks,
            suffix=suffix,
            lease_token=self.lease_token,
        )
        self.result_ref = key
        return key, size


@dataclass(frozen=True, slots=True)
class Effect:
    kind: str
    detail: dict[str, Any]


Handler = Callable[[JobContext[Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class JobType(Generic[P]):
    name: str
    queue: str
    payload_model: type[P]
    handler: Handler
    max_attempts: int = 5
    timeout: float = 300.0
    lease: float = 60.0
    # A payload field whose value is the job's unique key: at most one pending or running
    # job of this type per tenant and value (a request's own unique_key wins over it).
    unique_field: str | None = None
    # What its jobs get unless the request names one (jobcore.kernel.priorities).
    priority: Priority = DEFAULT_PRIORITY
    # Flow control (jobcore.kernel.gates): at most so many running, so many starts a second, and
    # whether a failed job of an ordering key blocks the jobs after it.
    concurrency: Limit | None = None
    rate: Rate | None = None
    ordering: OrderingOnFailure = "block"
    # Snoozes one job may have (jobcore.kernel.errors.Snooze); None: JOBCORE_MAX_SNOOZES.
    max_snoozes: int | None = None
    # Debounce or throttle by key (jobcore.kernel.keyed): what an enqueue of a key does while
    # another job of the key is open to it. At most one of the two.
    debounce: Debounce | None = None
    throttle: Throttle | None = None

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"job type name {self.name!r} must match {_NAME_RE.pattern}")
        if not _NAME_RE.match(self.queue):
            raise ValueError(f"queue name {self.queue!r} must match {_NAME_RE.pattern}")
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise ValueError(f"max_attempts must be within 1..{MAX_ATTEMPTS_LIMIT}")
        if self.timeout <= 0 or self.lease <= 0:
            raise ValueError("timeout and lease must be positive")
        if self.unique_field is not None and self.unique_field not in (
            self.payload_model.model_fields
        ):
            raise ValueError(
                f"unique_field {self.unique_field!r} is not a field of "
                f"{self.payload_model.__name__}"
            )
        if self.max_snoozes is not None and not 0 <= self.max_snoozes <= MAX_SNOOZES_LIMIT:
            raise ValueError(f"max_snoozes must be within 0..{MAX_SNOOZES_LIMIT}")
        if self.ordering not in ("block", "skip"):
            raise ValueError("ordering must be 'block' or 'skip'")
        if self.debounce is not None and self.throttle is not None:
            raise ValueError("a job type debounces or throttles, not both")
        for keyed in (self.debounce, self.throttle):
            if (
                keyed is not None
                and keyed.per != "tenant"
                and keyed.per not in (self.payload_model.model_fields)
            ):
                raise ValueError(
                    f"per {keyed.per!r} is not a field of {self.payload_model.__name__}"
                )

    @property
    def model_sets_strict(self) -> bool:
        """Whether the payload model sets ``strict`` in its own ``model_config``: then it
        decides how strictly a new payload is validated (``strict=False`` opts the type
        out, and its fields' and nested models' own ``strict`` apply); otherwise a new
        payload is validated strictly whole, which overrides theirs."""
        return "strict" in self.payload_model.model_config

    def validate_payload(self, raw: object) -> P:
        """A stored payload as the model: by the model's own rules, lax unless it says
        otherwise, as a job enqueued before payloads were strict was accepted (the
        worker runs it, an operator's retry copies it). A payload entering the system is
        checked by :meth:`validate_new_payload`."""
        try:
            return self.payload_model.model_validate(raw)
        except ValidationError as exc:
            raise InvalidPayloadError(self.name, exc) from None

    def validate_new_payload(self, document: bytes | str) -> P:
        """A payload entering the system (an enqueue, an edit), as JSON text, in
        pydantic's strict mode (``"5"`` is not an int, ``1`` not a bool) unless the model
        decides itself (:attr:`model_sets_strict`). As JSON rather than Python objects:
        a date-time or a UUID is a JSON string, which strict validation of Python objects
        would refuse. docs/handlers.md, "Payloads are validated strictly"."""
        strict = None if self.model_sets_strict else True
        try:
            return self.payload_model.model_validate_json(document, strict=strict)
        except ValidationError as exc:
            raise InvalidPayloadError(self.name, exc) from None


class InvalidPayloadError(InvalidPayload):
    """The payload does not validate against the job type's model."""

    def __init__(self, job_type: str, error: ValidationError) -> None:
        self.job_type = job_type
        self.errors: list[dict[str, Any]] = [
            {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
            for e in error.errors(include_url=False, include_input=False)
        ]
        super().__init__(f"payload for {job_type!r} is invalid ({len(self.errors)} errors)")


class Registry:
    def __init__(self) -> None:
        self._types: dict[str, JobType[Any]] = {}

    def register(self, job_type: JobType[Any]) -> JobType[Any]:
        if job_type.queue in RESERVED_QUEUES:
            raise ConfigurationError(
                f"JOBCORE_JOB_MODULES: job type {job_type.name!r} "
                f"({job_type.handler.__module__}) is on the queue {job_type.queue!r}, which "
                "is reserved (the worker's completion webhooks consume it); pick another queue"
            )
        existing = self._types.get(job_type.name)
        if existing is not None and existing != job_type:
            raise DuplicateRegistration(f"job type {job_type.name!r} is already registered")
        self._types[job_type.name] = job_type
        return job_type

    def job(
        self,
        name: str,
        *,
        payload: type[BaseModel],
        queue: str = "default",
        max_attempts: int = 5,
        timeout: float = 300.0,
        lease: float = 60.0,
        unique_field: str | None = None,
        priority: Priority | str | int = DEFAULT_PRIORITY,
        concurrency: Limit | None = None,
        rate: Rate | None = None,
        ordering: OrderingOnFailure = "block",
        max_snoozes: int | None = None,
        debounce: Debounce | None = None,
        throttle: Throttle | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator: ``@registry.job("send_email", payload=Email, queue="mail")``;
        ``unique_field="account_id"``: one live job per tenant and account id; ``priority``
        (``"high"``, ``"normal"``, ``"low"``) is its jobs' default; ``debounce`` /
        ``throttle``: by key (:mod:`jobcore.kernel.keyed`)."""
        level = Priority.parse(priority)

        def decorate(handler: Handler) -> Handler:
            self.register(
                JobType(
                    name=name,
                    queue=queue,
                    payload_model=payload,
                    handler=handler,
                    max_attempts=max_attempts,
                    timeout=timeout,
                    lease=lease,
                    unique_field=unique_field,
                    priority=level,
                    concurrency=concurrency,
                    rate=rate,
                    ordering=ordering,
                    max_snoozes=max_snoozes,
                    debounce=debounce,
                    throttle=throttle,
                )
            )
            return handler

        return decorate

    def get(self, name: str) -> JobType[Any]:
        try:
            return self._types[name]
        except KeyError:
            raise UnknownJobType(f"unknown job type {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def __iter__(self) -> Iterator[JobType[Any]]:
        return iter(sorted(self._types.values(), key=lambda t: t.name))

    def __len__(self) -> int:
        return len(self._types)

    def queues(self) -> set[str]:
        return {t.queue for t in self._types.values()}


default_registry = Registry()
job = default_registry.job


# The job modules jobcore ships, by the names they had before the library was grouped into
# packages: a JOBCORE_JOB_MODULES written for an older release (or kept through a rolling
# upgrade) still loads them.
MOVED_JOB_MODULES = {
    "jobcore.jobtypes": "jobcore.examples.jobtypes",
    "jobcore.demojobs": "jobcore.examples.demo",
}


def load_job_modules(modules: Iterable[str]) -> Registry:
    """Import each module so its job types register; return the default registry."""
    for module in modules:
        importlib.import_module(MOVED_JOB_MODULES.get(module, module))
    return default_registry
