"""Rows and outcomes turned into response bodies (the shapes of :mod:`services.api.schemas`),
serialised with orjson: on the enqueue path that is measurably cheaper than validating
the answer through a response model."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from starlette.responses import JSONResponse

from jobcore.kernel.priorities import Priority
from jobcore.kernel.states import JobStatus
from jobcore.usecases.enqueue.write_one import EnqueueResult
from jobcore.usecases.jobs import CancelOutcome
from jobcore.usecases.whereabouts import JobTimeline, whereabouts


class JsonBody(JSONResponse):
    """JSON by orjson (a JSONResponse, so FastAPI documents the response model)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def etag(version: str) -> str:
    """The ETag of a job's version (jobcore.database.sql.jobs.reads.VERSION)."""
    return f'"{version}"'


def job_answer(row: dict[str, Any]) -> JsonBody:
    """A job's view, with the ETag of the version read (an edit's If-Match)."""
    version = row.get("version")
    headers = None if version is None else {"ETag": etag(version)}
    return JsonBody(job_view(row), headers=headers)


def job_path(job_id: uuid.UUID) -> str:
    return f"/jobs/{job_id}"


def links(job_id: uuid.UUID) -> dict[str, str]:
    path = job_path(job_id)
    return {
        "self": path,
        "result": f"{path}/result",
        "cancel": f"{path}/cancel",
        "timeline": f"{path}/timeline",
        "payload": f"{path}/payload",
    }


def accepted(result: EnqueueResult) -> dict[str, Any]:
    return {
        "job_id": result.job_id,
        "status": result.status.value,
        "joined": result.joined,
        "links": links(result.job_id),
    }


_SUMMARY_COLUMNS = (
    "id",
    "type",
    "status",
    "entity_id",
    "attempts",
    "max_attempts",
    "last_error",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "cancel_requested_at",
)


def job_summary(row: dict[str, Any]) -> dict[str, Any]:
    body = {column: row[column] for column in _SUMMARY_COLUMNS}
    body["links"] = links(row["id"])
    return body


def job_view(row: dict[str, Any]) -> dict[str, Any]:
    body = job_summary(row)
    body.update(
        idempotency_key=row["idempotency_key"],
        unique_key=row["unique_key"],
        # A payload stored by reference leaves {} in the row: answered as null beside its
        # key, so that no client takes it for an empty payload (links.payload reads it).
        payload=None if row["payload_ref"] is not None else row["payload"],
        payload_ref=row["payload_ref"],
        run_at=row["next_attempt_at"],
        result=row["result"],
        result_ref=row["result_ref"],
        progress=progress_view(row),
        priority=Priority(row["priority"]).label,
        waiting_for=waiting_for(row),
        where=whereabouts(row),
        ordering_key=row["ordering_key"],
        version=row.get("version"),
        debounce_key=row.get("debounce_key"),
        debounce_count=row.get("debounce_count"),
    )
    # A held reason outlives the wait only on a job cancelled while held: not shown then.
    held = row["status"] == "pending" and row["held_reason"] is not None
    body.update(
        held_reason=row["held_reason"] if held else None,
        held_since=row["held_since"] if held else None,
    )
    return body


def waiting_for(row: dict[str, Any]) -> str | None:
    """Why a pending job does not start: ``"queue paused"`` or ``"job type paused"``
    (`jobcore queues pause` / `jobcore types pause`); None otherwise."""
    kind = row.get("paused")
    if row["status"] != JobStatus.PENDING or kind is None:
        return None
    return "queue paused" if kind == "queue" else "job type paused"


def timeline_view(timeline: JobTimeline) -> dict[str, Any]:
    body = timeline.as_dict()
    del body["tenant"]  # the caller's own
    return body


def progress_view(row: dict[str, Any]) -> dict[str, Any] | None:
    """What the handler last reported (``ctx.progress``), or None if it never did."""
    if row["progress_updated_at"] is None:
        return None
    return {
        "fraction": row["progress_fraction"],
        "message": row["progress_message"],
        "attempt": row["progress_attempt"],
        "updated_at": row["progress_updated_at"],
    }


def cancel_answer(outcome: CancelOutcome) -> dict[str, Any]:
    return {
        "job_id": outcome.job_id,
        "status": outcome.status.value,
        "cancel_requested": outcome.cancel_requested_at is not None,
        "cancel_requested_at": outcome.cancel_requested_at,
        "links": links(outcome.job_id),
    }
