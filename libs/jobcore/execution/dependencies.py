"""``ctx.dependency_results()``: what a workflow step's dependencies ended with, by name.

Each dependency's status and result: inline JSON as the job row holds it, or read from the
result store when it was stored by reference (as ``GET /jobs/{id}/result`` serves it; a
``.json`` file parsed, any other file as bytes). A job outside a workflow has none.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import orjson

from jobcore.database.gateway import AsyncConn
from jobcore.database.store.workflows import workflow_store
from jobcore.storage.results import ResultStore


@dataclass(frozen=True, slots=True)
class DependencyResult:
    """A dependency of a workflow step, as it ended (or is, for an edge that does not
    wait for it to end: none does, so it has always ended)."""

    name: str
    job_id: uuid.UUID
    status: str
    # The edge's policy: on_success, on_complete or on_failure.
    policy: str
    # What the dependency returned (None unless it succeeded, or returned nothing).
    result: Any
    # Why it did not succeed (its last error), or None.
    error: str | None


async def read_dependency_results(
    connection: Callable[[], AbstractAsyncContextManager[AsyncConn]],
    result_store: ResultStore,
    job_id: uuid.UUID,
) -> dict[str, DependencyResult]:
    """The dependencies of ``job_id`` by name."""
    async with connection() as conn:
        rows = await workflow_store.dependency_results(conn, {"job_id": job_id})
    answer: dict[str, DependencyResult] = {}
    for row in rows:
        result = row["result"]
        if row["result_ref"] is not None:
            data = await asyncio.to_thread(result_store.get, row["result_ref"])
            result = orjson.loads(data) if row["result_ref"].endswith(".json") else data
        answer[row["name"]] = DependencyResult(
            name=row["name"],
            job_id=row["id"],
            status=row["status"],
            policy=row["policy"],
            result=result,
            error=row["last_error"] if row["status"] != "succeeded" else None,
        )
    return answer
