"""``POST /jobs/{type}/batch``: up to 1,000 jobs of one type in one request and one
transaction, each item answered on its own.

An :class:`~services.api.auth.EnqueueRoute` like the single enqueue: the key and its
``enqueue`` scope are checked before the body is read. The answer is ``200`` whenever the
batch itself could be read (a JSON object whose ``items`` holds 1 to 1,000 entries): an
invalid item is reported in its place and does not stop the others, since refusing the
whole batch for one bad item would make a client resend the valid ones (idempotency keys
make that safe, but not cheap). What is wrong with the batch as a whole answers as the
single enqueue does (401, 403, 404 unknown type, 413, 415, 400, 422, 503).
"""

# No `from __future__ import annotations`: FastAPI reads the route's signature, which
# refers to a dependency local to the function that builds it.

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Depends, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError
from pydantic_core import PydanticCustomError
from starlette.responses import Response

from jobcore.execution.payloads import validate_payload
from jobcore.execution.registry import MAX_ATTEMPTS_LIMIT, JobType
from jobcore.kernel.envelope import PRINTABLE_TEXT
from jobcore.kernel.errors import InvalidField, JobcoreError, QuotaExceeded, UnknownJobType
from jobcore.usecases.enqueue.submit import MAX_IDEMPOTENCY_KEY_LENGTH, EnqueueRequest, enqueue_many
from jobcore.usecases.enqueue.write_many import MAX_BATCH_ITEMS, BatchResult, ItemStatus
from services.api.auth import TenantDep
from services.api.body import read_json
from services.api.callbacks import CallbackUrlDep
from services.api.deps import ApiState, SessionDep, StateDep
from services.api.problems import BodyTooLarge, InvalidRequest, located, problem_document
from services.api.tracing import enqueue_span
from services.api.views import JsonBody

MAX_DELAY_SECONDS = 366 * 24 * 3600
M = TypeVar("M", bound=BaseModel)


def json_integer(value: Any) -> Any:
    """An integer field's value as the OpenAPI document's ``integer`` takes it: a number
    without a fraction, 2.0 as much as 2 (which a strict field refuses), never a string or
    a boolean (which a lax one converts). Before a lax (``Strict(False)``) int, with its
    bounds between them so that the document still states them."""
    if isinstance(value, str | bool):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


# A job of /batches is one of these with its type (services.api.routes.batches.BatchJobFields):
# one definition of what a job of a request takes besides its type.
class BatchItemFields(BaseModel):
    """One item of a batch: the job's payload and the parameters the single enqueue takes
    as its Idempotency-Key header and its query (``callback_url`` is the batch's)."""

    # Strict, and read as JSON (parse_json_strictly): a value of another JSON type than the
    # schema's ("3" for an integer, 0 for a boolean) is refused as the schema refuses it,
    # not converted; a date-time is still a JSON string, and 3.0 an integer (json_integer).
    model_config = ConfigDict(extra="forbid", strict=True)

    payload: Any = Field(description="The job's payload, as the body of `POST /jobs/{type}`.")
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_IDEMPOTENCY_KEY_LENGTH,
        pattern=r"^[ -~]+$",
        description="As the Idempotency-Key header: the same key and job answer the same "
        "job (`replayed`), and another job with it is refused (idempotency-key-reused). In "
        "a batch of `/batches` it must be a job of that batch: a key of a job outside it "
        "refuses the request.",
    )
    unique_key: str | None = Field(
        default=None, min_length=1, max_length=255, pattern=PRINTABLE_TEXT
    )
    entity_id: str | None = Field(
        default=None, min_length=1, max_length=255, pattern=PRINTABLE_TEXT
    )
    max_attempts: (
        Annotated[
            int,
            Strict(False),
            Field(ge=1, le=MAX_ATTEMPTS_LIMIT),
            BeforeValidator(json_integer),
        ]
        | None
    ) = None
    run_at: datetime | None = None
    delay: float | None = Field(default=None, ge=0, le=MAX_DELAY_SECONDS)


def parse_json_strictly(model: type[M], value: Any) -> M:
    """``value`` (parsed JSON) as ``model`` (strict by its config) with JSON's types: a
    date-time or a UUID is a string there, which strict validation of Python objects would
    refuse. Raises ValidationError as the model's own validation does."""
    return model.model_validate_json(orjson.dumps(value))


class Invalid(Exception):
    """An item that cannot be enqueued, with the error its problem describes."""

    def __init__(self, error: JobcoreError) -> None:
        self.error = error


def request_schema(payload_ref: dict[str, Any]) -> dict[str, Any]:
    """The batch's request body for /openapi.json: items whose payload is the type's."""
    item = BatchItemFields.model_json_schema()
    item["properties"]["payload"] = {**payload_ref, "description": "The job's payload."}
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["items"],
                        "properties": {
                            "items": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": MAX_BATCH_ITEMS,
                                "items": item,
                            }
                        },
                    }
                }
            },
        }
    }


def _items_of(body: Any) -> list[Any]:
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH_ITEMS or len(body) != 1:
        raise InvalidRequest(
            [
                {
                    "loc": ["body", "items"],
                    "msg": f'the body is {{"items": [...]}} with 1 to {MAX_BATCH_ITEMS} items',
                    "type": "batch",
                }
            ],
            "the batch is not an object with 1 to 1000 items",
        )
    return items


def _checked_item(
    job_type: JobType[Any],
    tenant: str,
    index: int,
    raw: Any,
    callback_url: str | None,
    max_payload: int,
) -> EnqueueRequest:
    """The item's request, or :class:`Invalid`."""
    try:
        fields = parse_json_strictly(BatchItemFields, raw)
    except ValidationError as exc:
        errors = [
            {"loc": ["items", index, *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_input=False)
        ]
        raise Invalid(InvalidRequest(errors, f"item {index} is invalid")) from None
    try:
        if len(orjson.dumps(fields.payload)) > max_payload:
            raise BodyTooLarge(f"item {index}'s payload is larger than {max_payload} bytes")
        return EnqueueRequest(
            tenant=tenant,
            job_type=job_type,
            payload=validate_payload(job_type, fields.payload),
            sent=fields.payload,
            idempotency_key=fields.idempotency_key,
            unique_key=fields.unique_key,
            entity_id=fields.entity_id,
            max_attempts=fields.max_attempts,
            run_at=fields.run_at,
            delay=fields.delay,
            callback_url=callback_url,
        )
    except InvalidField as exc:
        # The single enqueue's query parameters are this item's fields; its payload's
        # fields are located in the item as its other invalid-payload errors are.
        where: list[str | int] = ["items", index]
        error = located(exc, where if exc.field == "payload" else [*where, exc.field])
        raise Invalid(error) from None
    except (JobcoreError, orjson.JSONEncodeError) as exc:
        raise Invalid(exc if isinstance(exc, JobcoreError) else BodyTooLarge(str(exc))) from None


@dataclass(frozen=True, slots=True)
class CheckedItems:
    """A batch's items checked: the valid ones ready to write, the others' errors (both
    by index in the request)."""

    total: int
    valid: list[tuple[int, EnqueueRequest]]
    invalid: dict[int, JobcoreError]


def batch_route(job_type: JobType[Any]) -> Callable[..., Awaitable[Response]]:
    # Dependencies, resolved in order: the body is read and every item checked before
    # the route takes a pooled connection (the key was checked before all).
    async def checked_items(
        request: Request, tenant: TenantDep, state: StateDep, callback_url: CallbackUrlDep
    ) -> CheckedItems:
        raw_items = _items_of(await read_json(request, state.settings.max_batch_body_bytes))
        checked = CheckedItems(len(raw_items), [], {})
        for index, raw in enumerate(raw_items):
            try:
                item = _checked_item(
                    job_type, tenant, index, raw, callback_url, state.settings.max_body_bytes
                )
            except Invalid as exc:
                checked.invalid[index] = exc.error
            else:
                checked.valid.append((index, item))
        if checked.invalid:
            raise _refused_batch(checked.invalid)
        return checked

    async def enqueue_batch(
        tenant: TenantDep,
        items: Annotated[CheckedItems, Depends(checked_items)],
        # Each item's request holds it (checked_items); named here as /openapi.json has it.
        callback_url: CallbackUrlDep,
        db_session: SessionDep,
        state: StateDep,
    ) -> Response:
        result: BatchResult | None = None
        if items.valid:
            with enqueue_span(job_type.name) as span:
                # BEGIN goes out with the insert, and so does COMMIT when nothing can
                # follow it: one round trip for a batch without keys (write_batch).
                async with db_session.transaction(begin_with_first_statement=True) as uow:
                    result = await enqueue_many(
                        uow,
                        state.topology,
                        [item for _, item in items.valid],
                        quotas=state.settings.quota_defaults,
                        commit=True,
                    )
                    await uow.commit()
                if span is not None:
                    valid = len(items.valid)
                    span.set_attributes(
                        {"tenant": tenant, "batch.items": items.total, "batch.valid": valid}
                    )
        _count(state, job_type.name, result)
        headers = result.rate_headers if result is not None else {}
        return JsonBody(_answers(items, result), headers=headers)

    return enqueue_batch


def _refused_batch(invalid: dict[int, JobcoreError]) -> InvalidRequest:
    """A batch with an item the schema refuses is refused whole, every such item's errors
    located under ``items``: the OpenAPI document describes each item, so a client (or a
    contract tester) can rely on a schema-invalid request being a 422, never a 200."""
    errors: list[dict[str, Any]] = []
    for index, error in sorted(invalid.items()):
        document = problem_document(error)
        slug = str(document["type"]).rsplit("/", 1)[-1]
        found = document.get("errors") or [{"loc": [], "msg": document["detail"], "type": slug}]
        for found_error in found:
            loc = list(found_error.get("loc") or [])
            if loc[:2] != ["items", index]:
                loc = ["items", index, *loc]
            errors.append({**found_error, "loc": loc})
    count = "1 item is" if len(invalid) == 1 else f"{len(invalid)} items are"
    return InvalidRequest(errors, f"{count} invalid; nothing was written")


def _answers(checked: CheckedItems, result: BatchResult | None) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{} for _ in range(checked.total)]
    for index, error in checked.invalid.items():
        items[index] = _item(index, ItemStatus.INVALID, None, None, error)
    if result is not None:
        for (index, _), outcome in zip(checked.valid, result.outcomes, strict=True):
            items[index] = _item(
                index, outcome.status, outcome.job_id, outcome.job_status, outcome.error
            )
    counts = {status.value: 0 for status in ItemStatus}
    for item in items:
        counts[item["status"]] += 1
    return {"items": items, "counts": counts}


def _item(
    index: int, status: ItemStatus, job_id: Any, job_status: Any, error: JobcoreError | None
) -> dict[str, Any]:
    return {
        "index": index,
        "status": status.value,
        "job_id": job_id,
        "job_status": None if job_status is None else job_status.value,
        "joined": status is ItemStatus.JOINED,
        "problem": None if error is None else problem_document(error),
    }


def _count(state: ApiState, job_type: str, result: BatchResult | None) -> None:
    if result is None:
        return
    state.metrics.count_enqueued(job_type, replayed=False, jobs=result.count(ItemStatus.CREATED))
    state.metrics.count_enqueued(job_type, replayed=True, jobs=result.count(ItemStatus.REPLAYED))
    state.metrics.count_enqueued(
        job_type, replayed=False, joined=True, jobs=result.count(ItemStatus.JOINED)
    )
    for outcome in result.outcomes:
        if isinstance(outcome.error, QuotaExceeded):
            state.metrics.count_refusal(outcome.error.reason)


async def enqueue_batch_unknown_type(job_type: str) -> Response:
    # An EnqueueRoute: a caller without a valid key gets 401, not this 404.
    raise UnknownJobType(f"unknown job type {job_type!r}")
