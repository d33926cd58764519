"""A handler's memory is bounded by its payload's schema: every field of every job type
jobcore ships is bounded, and the export's worst case is what docs/handlers.md computes."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from jobcore.examples.jobtypes import (
    EXPORT_CHUNK_BYTES,
    EXPORT_MAX_COLUMN_NAME,
    EXPORT_MAX_COLUMNS,
    EXPORT_MAX_ROW_BYTES,
    EXPORT_MAX_ROWS,
    ExportCsvPayload,
    csv_chunks,
)
from jobcore.execution.registry import JobType, load_job_modules

SHIPPED_MODULES = ("jobcore.examples.jobtypes", "jobcore.examples.demo", "jobcore.testing.jobtypes")


def shipped_job_types() -> list[JobType[Any]]:
    registry = load_job_modules(SHIPPED_MODULES)
    return [t for t in registry if t.handler.__module__ in SHIPPED_MODULES]


def unbounded(schema: dict[str, Any], defs: dict[str, Any], path: str) -> list[str]:
    """Every place in a JSON schema where a value's size has no upper bound."""
    if "$ref" in schema:
        return unbounded(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, path)
    if "const" in schema or "enum" in schema:
        return []
    found: list[str] = []
    for key in ("anyOf", "oneOf", "allOf"):
        for index, branch in enumerate(schema.get(key, [])):
            found += unbounded(branch, defs, f"{path}/{key}/{index}")
    kind = schema.get("type")
    if kind == "string" and "maxLength" not in schema:
        found.append(f"{path}: a string without maxLength")
    if kind in ("integer", "number"):
        if "maximum" not in schema and "exclusiveMaximum" not in schema:
            found.append(f"{path}: a {kind} without maximum")
        if "minimum" not in schema and "exclusiveMinimum" not in schema:
            found.append(f"{path}: a {kind} without minimum")
    if kind == "array":
        if "maxItems" not in schema:
            found.append(f"{path}: an array without maxItems")
        found += unbounded(schema.get("items", {}), defs, f"{path}/items")
    if kind == "object":
        if schema.get("additionalProperties") is not False:
            found.append(f"{path}: an object that takes any other property")
        for name, sub in schema.get("properties", {}).items():
            found += unbounded(sub, defs, f"{path}/{name}")
    if kind is None and not any(key in schema for key in ("anyOf", "oneOf", "allOf")):
        found.append(f"{path}: a value of any type")
    return found


def test_the_walker_finds_what_is_unbounded() -> None:
    # The check below is only as good as this: an unbounded field is found.
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "n": {"type": "integer", "minimum": 0},
            "a": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 1}},
            "o": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
            "x": {},
        },
    }
    assert unbounded(schema, {}, "") == [
        ": an object that takes any other property",
        "/s: a string without maxLength",
        "/n: a integer without maximum",
        "/x: a value of any type",
    ]


def test_every_shipped_job_types_payload_bounds_every_field() -> None:
    job_types = shipped_job_types()
    assert {"export_csv", "send_email", "noop", "flaky", "doomed", "slow", "echo"} <= {
        t.name for t in job_types
    }
    problems = {}
    for job_type in job_types:
        schema = job_type.payload_model.model_json_schema()
        if found := unbounded(schema, schema.get("$defs", {}), job_type.name):
            problems[job_type.name] = found
    assert problems == {}


def worst_export() -> ExportCsvPayload:
    names = [f"c{i:02d}".ljust(EXPORT_MAX_COLUMN_NAME, "x") for i in range(EXPORT_MAX_COLUMNS)]
    return ExportCsvPayload(rows=EXPORT_MAX_ROWS, columns=names, seed=1)


def test_the_worst_export_row_is_what_the_bound_says() -> None:
    payload = worst_export()
    first = next(csv_chunks(payload.model_copy(update={"rows": 1})))
    header, row, _ = first.split(b"\n")
    assert len(row) + 1 == EXPORT_MAX_ROW_BYTES  # no longer: the docs' arithmetic holds
    assert len(header) + 1 <= EXPORT_MAX_ROW_BYTES


@pytest.mark.parametrize(
    "field",
    [
        {"columns": ["x" * 5000] * 50},
        {"columns": ["x" * (EXPORT_MAX_COLUMN_NAME + 1)]},
        {"columns": ["a"] * (EXPORT_MAX_COLUMNS + 1)},
        {"columns": ['needs,"quoting"']},
        {"rows": EXPORT_MAX_ROWS + 1},
        {"seed": 2**63},
    ],
)
def test_export_payloads_beyond_the_bounds_are_refused(field: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ExportCsvPayload.model_validate(field)


column_names = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,31}\Z")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(column_names, min_size=1, max_size=EXPORT_MAX_COLUMNS),
    st.integers(1, 3000),
    st.integers(-(2**63), 2**63 - 1),
)
def test_every_export_chunk_is_within_its_bound_and_the_chunks_are_the_csv(
    columns: list[str], rows: int, seed: int
) -> None:
    payload = ExportCsvPayload(rows=rows, columns=columns, seed=seed)
    chunks = list(csv_chunks(payload))
    assert all(len(chunk) <= EXPORT_CHUNK_BYTES + EXPORT_MAX_ROW_BYTES for chunk in chunks)
    parsed = list(csv.reader(io.StringIO(b"".join(chunks).decode())))
    assert parsed[0] == columns
    assert len(parsed) == rows + 1
    assert all(len(",".join(r)) + 1 <= EXPORT_MAX_ROW_BYTES for r in parsed)
