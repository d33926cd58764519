"""Running a job type's handler inline, in the test's own task: no broker, no database, no
worker (Celery's eager mode; River's ``rivertest.Worker``; Oban's ``perform_job``).

``await run_inline("send_email", {"to": ..., "subject": ...})`` does what a job goes
through on its way to the handler and back, minus the transport:

- the payload is checked as the API checks a request body (sent as JSON, validated by the
  job type's model, storable): a payload the API would answer ``422`` raises
  :class:`~jobcore.execution.registry.InvalidPayloadError` or
  :class:`~jobcore.execution.payloads.UnstorablePayload`;
- the handler gets the payload the worker would give it (the stored JSON, validated again)
  in a real :class:`~jobcore.execution.registry.JobContext` (result store, settings, effects);
- it runs under its job type's timeout (:class:`~jobcore.execution.attempts.JobTimedOut`), and its
  error is raised as it is;
- its result and effects must be storable as the worker stores them
  (:class:`~jobcore.execution.attempts.UnstorableOutcome` otherwise); a result over
  ``JOBCORE_INLINE_RESULT_MAX_BYTES`` goes to the result store, as in the worker.

The result comes back as clients will read it (through JSON). Nothing is retried: an
attempt that fails raises; pass ``attempt=`` to run a later one. To run jobs through the
database (claim, retries, outcomes), use :class:`jobcore.testing.draining.InlineWorker`.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from jobcore.execution.attempts import UnstorableOutcome, call_handler
from jobcore.execution.outcomes import Fail, OutcomeLimits, success
from jobcore.execution.payloads import validate_payload
from jobcore.execution.registry import Effect, JobContext, Registry, default_registry
from jobcore.kernel.settings import Settings, load_settings
from jobcore.storage.results import LocalResultStore


@dataclass(slots=True)
class InlineRun:
    """One inline attempt: its result (as clients read it) and the context it ran with."""

    result: Any
    context: JobContext[Any]
    heartbeats: int = 0
    stored_result: bytes | None = field(default=None, repr=False)

    @property
    def effects(self) -> list[Effect]:
        return list(self.context.effects)

    @property
    def result_ref(self) -> str | None:
        return self.context.result_ref


def as_sent(payload: Any) -> Any:
    """``payload`` as the API would parse it from a request body (a model as its JSON)."""
    if isinstance(payload, BaseModel):
        return payload.model_dump(mode="json")
    return orjson.loads(orjson.dumps(payload))


async def run_inline_job(
    job_type: str,
    payload: Any,
    *,
    registry: Registry = default_registry,
    settings: Settings | None = None,
    result_dir: Path | None = None,
    attempt: int = 1,
    max_attempts: int | None = None,
    job_id: uuid.UUID | None = None,
    cancel_requested: bool = False,
) -> InlineRun:
    """Run one attempt of ``job_type``'s handler on ``payload``; see the module's doc.

    ``settings`` is what the handler's context carries (default: from the environment);
    ``result_dir`` replaces its ``result_dir`` (where result files go).
    ``cancel_requested`` sets ``ctx.cancel_requested`` before the handler starts.
    """
    kind = registry.get(job_type)
    model = validate_payload(kind, as_sent(payload))
    stored_payload = model.model_dump(mode="json")
    config = settings or load_settings()
    if result_dir is not None:
        config = config.model_copy(update={"result_dir": result_dir})
    store = LocalResultStore(config.result_dir)
    beats = 0

    async def heartbeat() -> None:  # no lease to extend: counted, for the test to check
        nonlocal beats
        beats += 1

    the_id = job_id or uuid.uuid4()
    context: JobContext[Any] = JobContext(
        job_id=the_id,
        job_type=kind.name,
        payload=kind.validate_payload(stored_payload),
        attempt=attempt,
        max_attempts=max_attempts or kind.max_attempts,
        idempotency_key=str(the_id),
        heartbeat=heartbeat,
        result_store=store,
        settings=config,
    )
    if cancel_requested:
        context.cancel_requested.set()
    result = await call_handler(kind, context)
    # What the worker would record (jobcore.execution.outcomes): refused as it would refuse it.
    outcome = success(result, context, uuid.uuid4(), OutcomeLimits.from_settings(config))
    if isinstance(outcome, Fail):
        raise UnstorableOutcome(outcome.error)
    encoded = outcome.to_store
    if encoded is not None:
        context.result_ref = await asyncio.to_thread(store.put, the_id, encoded, suffix="json")
    elif outcome.result is not None:
        encoded = outcome.result.encode()
    shown = None if encoded is None else orjson.loads(encoded)
    return InlineRun(result=shown, context=context, heartbeats=beats, stored_result=encoded)


async def run_inline(job_type: str, payload: Any, **options: Any) -> Any:
    """The result of one inline attempt of ``job_type`` on ``payload``, as clients read
    it; raises what the handler raised. Takes :func:`run_inline_job`'s options."""
    return (await run_inline_job(job_type, payload, **options)).result
