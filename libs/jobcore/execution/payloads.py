"""What a payload must be to be enqueued: valid for its job type's model, and storable;
and how a runner of handlers reads a claimed job's payload (:func:`read_payload`).

Every payload entering the system is checked by :func:`validate_payload` (strictly, as
JSON): each API route that takes one, the enqueue in the caller's transaction, an edit of
a queued job, and the testing kit (:mod:`jobcore.testing`), so a handler's test refuses
exactly what the API would; the worker and the testing kit's in-process worker read
payloads stored by reference alike.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import orjson
import pydantic_core
from pydantic import BaseModel

from jobcore.execution.registry import JobType
from jobcore.kernel.errors import InvalidPayload
from jobcore.storage.results import ResultStore


class UnstorablePayload(InvalidPayload):
    """The payload holds values the database cannot store."""

    def __init__(self, errors: list[dict[str, Any]], message: str | None = None) -> None:
        self.errors = errors
        super().__init__(message)


def validate_payload(job_type: JobType[Any], raw_payload: Any) -> BaseModel:
    """A payload entering the system as the job type's model, and storable as it is:
    raises :class:`~jobcore.execution.registry.InvalidPayloadError` or
    :class:`UnstorablePayload`.

    Checked as its JSON, strictly unless the model opts out
    (:meth:`~jobcore.execution.registry.JobType.validate_new_payload`): ``{"rows": "5"}``
    is refused where the model says ``rows: int``. Python values a library caller passes
    (a datetime, a UUID, an enum, a Decimal) count as the JSON pydantic writes of them; a
    non-finite float is written as such, for :func:`check_storable` to refuse rather than
    JSON's ``null`` to slip through. A payload already stored is read by the model's own
    rules instead (:meth:`~jobcore.execution.registry.JobType.validate_payload`)."""
    try:
        document = pydantic_core.to_json(
            _integral_floats_as_ints(raw_payload), inf_nan_mode="constants"
        )
    except pydantic_core.PydanticSerializationError as exc:
        raise UnstorablePayload(
            [{"loc": ["body"], "msg": f"not representable as JSON: {exc}", "type": "json_type"}],
            "the payload is not representable as JSON",
        ) from None
    payload: BaseModel = job_type.validate_new_payload(document)
    check_storable(payload.model_dump(mode="json"))
    return payload


EXACT_FLOAT_INTEGERS = 2**53


def _integral_floats_as_ints(value: Any) -> Any:
    """JSON Schema counts ``5.0`` as an integer (the OpenAPI document promises it), and
    strict validation would refuse it for an ``int``: an integral float is checked as the
    integer it is. ``5.5`` and ``"5"`` are still refused; a ``float`` field takes either.
    Only up to 2**53, where a float is still the integer sent: beyond it (orjson reads an
    integer past 64 bits as a float) it would be a rounded one, which is refused instead."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= EXACT_FLOAT_INTEGERS:
        return int(value)
    if isinstance(value, dict):
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_integral_floats_as_ints(item) for item in value]
    return value


def check_storable(value: Any, loc: tuple[str | int, ...] = ("body",)) -> None:
    """Refuse what PostgreSQL's jsonb cannot hold (NUL in strings, non-finite numbers).

    Valid JSON and valid for the payload model, yet the INSERT would fail: refusing it
    here keeps such input a 422 instead of a server error.
    """
    errors: list[dict[str, Any]] = []
    _collect_unstorable(value, list(loc), errors)
    if errors:
        raise UnstorablePayload(errors, f"the payload cannot be stored ({len(errors)} errors)")


def _collect_unstorable(value: Any, loc: list[str | int], errors: list[dict[str, Any]]) -> None:
    if isinstance(value, str):
        if "\x00" in value:
            errors.append({"loc": loc, "msg": "NUL characters are not allowed", "type": "nul"})
    elif isinstance(value, float):
        if not math.isfinite(value):
            errors.append({"loc": loc, "msg": "numbers must be finite", "type": "finite_number"})
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                errors.append(
                    {"loc": [*loc, key], "msg": "NUL characters are not allowed", "type": "nul"}
                )
            _collect_unstorable(item, [*loc, key], errors)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _collect_unstorable(item, [*loc, index], errors)


async def read_payload(store: ResultStore, payload: Any, payload_ref: str | None) -> Any:
    """A claimed job's payload as JSON: the row's ``payload``, or the one stored by
    reference (``payload_ref``, a payload too large to keep inline) read from ``store``.
    OSError (:class:`~jobcore.storage.results.StoreUnavailable`: the object store) or
    :class:`~jobcore.storage.results.ResultNotFound` when it cannot be read."""
    if payload_ref is None:
        return payload
    data = await asyncio.to_thread(store.get, payload_ref)
    return orjson.loads(data)
