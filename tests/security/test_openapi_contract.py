"""Schemathesis against the API's own OpenAPI document, in-process, with a valid API key
that has every scope (the operator routes under /admin included).

For every operation in /openapi.json, schema-valid and schema-invalid requests: no answer
is a 500, every answer matches the schema (status, content type, headers, body), every
error is problem JSON, and invalid input is refused.

Schemathesis's pytest integration (``from_fixture``) does not run on this pytest, and the
app needs the test's own database, so the operations are walked here, each with its own
Hypothesis run. Two checks are left out, for answers that are right:

- "schema-valid request rejected": the schema cannot say everything the API checks —
  ``run_at`` and ``delay`` exclude each other, ``run_at`` is within a year, a job id must
  exist — and a 422 or 404 for those is the right answer;
- "schema-violating request accepted": the API ignores query parameters it does not know
  and takes the last of a repeated one (as FastAPI does), and refuses an oversized body
  with 413, which schemathesis does not count as a refusal. What the API refuses, and how,
  is checked case by case in test_hostile_input.py and the API's own tests.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
)

from jobcore.db import Database
from jobcore.scopes import Scope
from jobcore.settings import Settings
from jobcore.usecases import keys as key_usecases
from services.api.app import create_app
from services.api.problems import PROBLEM_BASE, PROBLEM_MEDIA_TYPE

# Per operation and generation mode; about 30 s for the whole API on this machine.
EXAMPLES = 25


async def _create_key(settings: Settings) -> str:
    db = Database(settings, min_size=0, max_size=1)
    await db.open(wait=True)
    try:
        return (
            await key_usecases.create_key(
                db, "schemathesis", "contract", scopes=list(Scope), actor="tests"
            )
        ).key
    finally:
        await db.close()


def errors_are_problem_json(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code >= 400:
        content_type = response.headers.get("content-type", [""])
        content_type = content_type[0] if isinstance(content_type, list) else content_type
        assert content_type == PROBLEM_MEDIA_TYPE, f"{response.status_code} as {content_type}"
        body = response.json()
        assert body["status"] == response.status_code, body
        assert body["type"].startswith(PROBLEM_BASE), body
        assert isinstance(body["title"], str), body
        assert isinstance(body["detail"], str), body
    return None


# Two operations per job type (its enqueue and its batch) and the rest: over two minutes
# when the machine is loaded, and a timeout that lands inside Hypothesis's engine reads
# as one of its internal assertions.
@pytest.mark.timeout(600)
def test_the_api_keeps_its_openapi_contract(settings: Settings) -> None:
    headers = {"Authorization": f"Bearer {asyncio.run(_create_key(settings))}"}
    app = create_app(settings)
    failures: list[str] = []
    operations = 0
    admin_operations = 0
    try:
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        for result in schema.get_all_operations():
            operation = result.ok()
            operations += 1
            admin_operations += "/admin/" in operation.label
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                @given(case=operation.as_strategy(generation_mode=mode))
                @hypothesis_settings(
                    max_examples=EXAMPLES,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                def check(case: Any) -> None:
                    case.call_and_validate(
                        headers=headers,
                        additional_checks=[errors_are_problem_json],
                        excluded_checks=[positive_data_acceptance, negative_data_rejection],
                    )

                try:
                    check()
                except Unsatisfiable:
                    # Nothing about this operation can be made invalid (no parameters).
                    assert mode is GenerationMode.NEGATIVE, operation.label
                except (AssertionError, FailureGroup) as exc:
                    failures.append(f"{operation.label} ({mode.value}):\n{exc}"[:4000])
    finally:
        # The app's lifespan (its pool) runs in schemathesis's own event loop thread.
        shutdown_lifespans()
    assert operations >= 16
    assert admin_operations == 8  # jobs: list, show, cancel, retry; outbox: 3; keys
    assert not failures, "\n\n".join(failures)
