"""/openapi.json as the API behaves, so generated clients and contract testers work.

FastAPI's document is corrected in four ways: an optional parameter is a value or
absent, never ``null`` (FastAPI writes ``anyOf: [X, null]`` for ``X | None``, which a
query string or header cannot carry); a payload's strings and keys hold no NUL character
(PostgreSQL cannot store one: :func:`services.api.body.check_storable`); every error answer
is problem JSON (:func:`services.api.problems.document_problem_responses`); and the
headers the answers carry are listed with them.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from services.api import problems

_NULL = {"type": "null"}
NO_NUL = r"^[^\x00]*$"


def build_document(app: FastAPI, extra_schemas: dict[str, Any]) -> dict[str, Any]:
    """The app's OpenAPI document, with ``extra_schemas`` (the job types' payload models,
    which the enqueue routes' request bodies refer to) among its components."""
    document = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in extra_schemas.items():
        schemas[name] = without_nul(schema)
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if not parameter.get("required", False):
                    parameter["schema"] = _without_null(parameter["schema"])
    problems.document_problem_responses(document)
    return document


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``{anyOf: [X, null], ...}`` as ``{...X, ...}``: absent is how a parameter is null."""
    variants = schema.get("anyOf")
    if not isinstance(variants, list) or _NULL not in variants:
        return schema
    rest = [variant for variant in variants if variant != _NULL]
    outer = {
        key: value
        for key, value in schema.items()
        if key != "anyOf" and not (key == "default" and value is None)
    }
    if len(rest) == 1:
        return {**rest[0], **outer}
    return {"anyOf": rest, **outer}


def without_nul(schema: Any) -> Any:
    """``schema`` with every string and every object key refusing NUL characters."""
    if isinstance(schema, list):
        return [without_nul(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: without_nul(value) for key, value in schema.items()}
    if out.get("type") == "string" and "format" not in out and "enum" not in out:
        if "pattern" not in out:
            out["pattern"] = NO_NUL
        else:  # both must hold (redundant where the pattern refuses NUL already)
            out["allOf"] = [*out.get("allOf", []), {"pattern": NO_NUL}]
    if out.get("type") == "object" and out.get("additionalProperties") not in (None, False):
        out.setdefault("propertyNames", {"pattern": NO_NUL})
    return out
