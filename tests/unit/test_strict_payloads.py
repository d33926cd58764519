"""A payload entering the system is checked strictly, as JSON (jobcore.execution.payloads.
validate_payload); a stored one is read by its model's own rules (JobType.validate_payload),
so a job accepted before payloads were strict still runs."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from jobcore.examples.jobtypes import ExportCsvPayload
from jobcore.execution.payloads import UnstorablePayload, validate_payload
from jobcore.execution.registry import InvalidPayloadError, JobContext, JobType


class Colour(Enum):
    RED = "red"


class Inner(BaseModel):
    n: int


class Payload(BaseModel):
    n: int = 0
    ratio: float = 0.0
    on: bool = False
    at: datetime | None = None
    ref: uuid.UUID | None = None
    colour: Colour | None = None
    pair: tuple[int, int] | None = None
    inner: Inner | None = None
    maybe: float | None = None


class LaxPayload(BaseModel):
    """Opts out: it sets strict in its own config."""

    model_config = ConfigDict(strict=False)

    n: int = 0
    # Its own field's rule applies when the model decides.
    exact: int = Field(default=0, strict=True)


class StrictByItself(BaseModel):
    model_config = ConfigDict(strict=True)

    n: int = 0


async def handler(ctx: JobContext[Any]) -> None:
    return None


def job_type(model: type[BaseModel]) -> JobType[Any]:
    return JobType(name="t", queue="q", payload_model=model, handler=handler)


def test_a_string_where_an_int_is_declared_is_refused_naming_the_field() -> None:
    export_csv = job_type(ExportCsvPayload)
    with pytest.raises(InvalidPayloadError) as refused:
        validate_payload(export_csv, {"rows": "5"})
    assert [(e["loc"], e["type"]) for e in refused.value.errors] == [(["rows"], "int_type")]
    model = validate_payload(export_csv, {"rows": 5})
    assert isinstance(model, ExportCsvPayload)
    assert model.rows == 5


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"n": "5"}, "n"),
        ({"n": 5.5}, "n"),
        ({"n": True}, "n"),
        ({"on": 1}, "on"),
        ({"on": "true"}, "on"),
        ({"ratio": "1.5"}, "ratio"),
        ({"inner": {"n": "5"}}, "inner"),
    ],
)
def test_values_of_another_json_type_are_refused(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidPayloadError) as refused:
        validate_payload(job_type(Payload), raw)
    assert [e["loc"][0] for e in refused.value.errors] == [field]


def test_an_integral_float_is_the_integer_json_schema_says_it_is() -> None:
    """The OpenAPI document's schemas let ``5.0`` stand for an integer: it is taken as 5."""
    model = validate_payload(job_type(ExportCsvPayload), {"rows": 5.0})
    assert isinstance(model, ExportCsvPayload)
    assert model.rows == 5
    assert isinstance(model.rows, int)


def test_json_spellings_of_python_types_are_still_taken() -> None:
    """Strict as JSON, not as Python: a date-time, a UUID and an enum are JSON strings,
    a tuple a JSON array, and an integer is a number where a float is declared."""
    ref = uuid.uuid4()
    model = validate_payload(
        job_type(Payload),
        {
            "n": 3,
            "ratio": 2,
            "at": "2030-01-02T03:04:05+00:00",
            "ref": str(ref),
            "colour": "red",
            "pair": [1, 2],
            "inner": {"n": 1},
        },
    )
    assert isinstance(model, Payload)
    assert (model.ratio, model.ref, model.colour, model.pair) == (2.0, ref, Colour.RED, (1, 2))
    assert model.at == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_python_values_of_a_library_caller_count_as_their_json() -> None:
    ref = uuid.uuid4()
    at = datetime(2030, 1, 2, tzinfo=UTC)
    model = validate_payload(
        job_type(Payload), {"at": at, "ref": ref, "colour": Colour.RED, "pair": (1, 2)}
    )
    assert isinstance(model, Payload)
    assert (model.at, model.ref, model.colour, model.pair) == (at, ref, Colour.RED, (1, 2))
    # A Decimal is a JSON string, which an int is not.
    with pytest.raises(InvalidPayloadError):
        validate_payload(job_type(Payload), {"n": Decimal(5)})


def test_a_non_finite_float_is_refused_rather_than_stored_as_null() -> None:
    with pytest.raises(UnstorablePayload) as refused:
        validate_payload(job_type(Payload), {"maybe": math.nan})
    assert refused.value.errors[0]["loc"] == ["body", "maybe"]


def test_a_value_with_no_json_is_refused_as_invalid() -> None:
    with pytest.raises(UnstorablePayload) as refused:
        validate_payload(job_type(Payload), {"n": object()})
    assert refused.value.errors[0]["type"] == "json_type"


def test_a_model_that_sets_strict_itself_decides() -> None:
    lax = job_type(LaxPayload)
    assert lax.model_sets_strict
    model = validate_payload(lax, {"n": "5"})
    assert isinstance(model, LaxPayload)
    assert model.n == 5
    with pytest.raises(InvalidPayloadError) as refused:
        validate_payload(lax, {"exact": "5"})
    assert refused.value.errors[0]["loc"] == ["exact"]

    strict = job_type(StrictByItself)
    assert strict.model_sets_strict  # its own config says strict: the same outcome
    with pytest.raises(InvalidPayloadError):
        validate_payload(strict, {"n": "5"})
    assert not job_type(Payload).model_sets_strict


def test_a_stored_payload_is_read_by_the_models_own_rules() -> None:
    """A job accepted before payloads were strict ({"rows": "5"} then converted, or
    written by SQL unchecked) still validates when the worker reads it."""
    export_csv = job_type(ExportCsvPayload)
    stored = export_csv.validate_payload({"rows": "5"})
    assert isinstance(stored, ExportCsvPayload)
    assert stored.rows == 5


class Document(BaseModel):
    body: Any = None


def test_a_document_nested_deeper_than_pythons_recursion_limit_is_a_client_error() -> None:
    # As deep as the API's JSON parser lets through (orjson: 1,024 levels), deeper than
    # Python's recursion limit: refused as a payload, never a RecursionError (a 500).
    deep: Any = 7.0
    for _ in range(1_023):
        deep = [deep]
    with pytest.raises(UnstorablePayload) as refused:
        validate_payload(job_type(Document), {"body": deep})
    assert refused.value.errors[0]["type"] == "json_type"


def test_a_nested_document_is_checked_down_to_its_innermost_value() -> None:
    depth = 100
    nested: Any = 7.0
    for _ in range(depth):
        nested = [nested]
    model = validate_payload(job_type(Document), {"body": nested})
    innermost = model.model_dump()["body"]
    for _ in range(depth):
        innermost = innermost[0]
    assert innermost == 7
    assert isinstance(innermost, int)

    poisoned: Any = "a\x00b"
    for _ in range(depth):
        poisoned = {"k": poisoned}
    with pytest.raises(UnstorablePayload) as refused:
        validate_payload(job_type(Document), {"body": poisoned})
    assert [error["loc"] for error in refused.value.errors] == [["body", "body", *["k"] * depth]]
