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
    integer past 64 bits as a float) it would be a rounded one, which is refused instead.

    A copy (the caller's value is left as it is), made without recursion: a document
    nested as deep as the JSON parser allows (1,024 levels) is deeper than Python's
    recursion limit, and must be refused as a client error (pydantic's serializer stops at
    about 255 levels: :class:`UnstorablePayload`), not fail as a RecursionError."""
    root: list[Any] = [value]
    pending: list[tuple[Any, Any]] = [(root, 0)]
    while pending:
        container, key = pending.pop()
        item = container[key]
        if isinstance(item, float) and item.is_integer() and abs(item) <= EXACT_FLOAT_INTEGERS:
            container[key] = int(item)
        elif isinstance(item, dict):
            copied = dict(item)
            container[key] = copied
            pending.extend((copied, name) for name in copied)
        elif isinstance(item, list | tuple):
            listed = list(item)
            container[key] = listed
            pending.extend((listed, index) for index in range(len(listed)))
    return root[0]


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
    # Without recursion, for the reason _integral_floats_as_ints gives: a model field of
    # type Any takes a document nested deeper than Python's recursion limit.
    pending: list[tuple[Any, list[str | int]]] = [(value, loc)]
    while pending:
        item, where = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                errors.append(_nul_at(where))
        elif isinstance(item, float):
            if not math.isfinite(item):
                errors.append(
                    {"loc": where, "msg": "numbers must be finite", "type": "finite_number"}
                )
        elif isinstance(item, dict):
            for key in item:
                if isinstance(key, str) and "\x00" in key:
                    errors.append(_nul_at([*where, key]))
            pending.extend((member, [*where, key]) for key, member in reversed(item.items()))
        elif isinstance(item, list | tuple):
            pending.extend(
                (member, [*where, index]) for index, member in reversed(list(enumerate(item)))
            )


def _nul_at(loc: list[str | int]) -> dict[str, Any]:
    return {"loc": loc, "msg": "NUL characters are not allowed", "type": "nul"}


async def read_payload(store: ResultStore, payload: Any, payload_ref: str | None) -> Any:
    """A claimed job's payload as JSON: the row's ``payload``, or the one stored by
    reference (``payload_ref``, a payload too large to keep inline) read from ``store``.
    OSError (:class:`~jobcore.storage.results.StoreUnavailable`: the object store) or
    :class:`~jobcore.storage.results.ResultNotFound` when it cannot be read."""
    if payload_ref is None:
        return payload
    data = await asyncio.to_thread(store.get, payload_ref)
    return orjson.loads(data)
