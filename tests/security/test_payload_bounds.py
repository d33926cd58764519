"""Payloads past their schema's bounds are refused at the door (422 problem JSON), before
a worker could spend memory on them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from jobcore.database.gateway import Database
from tests.integration.api.support import assert_problem, counts, enqueue

# The payload that used to be accepted and asked a worker for ~250 GB: 50 column names of
# 5,000 characters each, a million rows. It fits in the default 256 KiB body limit.
HOSTILE_EXPORT = {"rows": 1_000_000, "columns": ["x" * 5000] * 50}


async def test_the_old_hostile_export_is_a_422(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    response = await enqueue(api_client, auth, "export_csv", payload=HOSTILE_EXPORT)
    body = assert_problem(response, 422, "invalid-payload")
    assert body["errors"]
    assert all(error["loc"][0] == "columns" for error in body["errors"]), body["errors"]
    assert "x" * 100 not in response.text  # the input is not echoed back
    assert (await counts(db))["jobs"] == 0


@pytest.mark.parametrize(
    ("job_type", "payload"),
    [
        ("export_csv", {"columns": ["a" * 33]}),
        ("export_csv", {"columns": ["a"] * 21}),
        ("export_csv", {"rows": 1_000_001}),
        ("export_csv", {"seed": 2**63}),
        ("send_email", {"to": "a@example.com", "subject": "hi\r\nBcc: all@example.com"}),
        ("send_email", {"to": "a" * 250 + "@example.com", "subject": "hi"}),
        ("send_email", {"to": "a@example.com", "subject": "hi", "body": "x" * 100_001}),
    ],
)
async def test_every_bound_is_enforced_by_the_api(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    db: Database,
    job_type: str,
    payload: dict[str, Any],
) -> None:
    response = await enqueue(api_client, auth, job_type, payload=payload)
    assert_problem(response, 422, "invalid-payload")
    assert (await counts(db))["jobs"] == 0


async def test_the_largest_export_within_bounds_is_accepted(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    columns = [f"c{i:02d}".ljust(32, "x") for i in range(20)]
    response = await enqueue(
        api_client, auth, "export_csv", payload={"rows": 1_000_000, "columns": columns}
    )
    assert response.status_code == 202, response.text
    assert (await counts(db))["jobs"] == 1
