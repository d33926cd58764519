"""A claimed job: the type the runner, the consumer, the metrics and the tracing share.

A leaf module (it imports nothing of the worker's), so none of them imports another for it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobcore.registry import JobType


@dataclass(frozen=True, slots=True)
class Claim:
    """A job this worker holds the lease of (what the claim statement returned)."""

    job_id: uuid.UUID
    job_type: JobType[Any]
    raw_payload: Any
    attempt: int
    max_attempts: int
    lease_token: uuid.UUID
    cancel_requested: bool
    trace_headers: dict[str, str]
    # For the tracing and the time-to-start / time-to-complete metrics.
    message_id: uuid.UUID | None = None
    created_at: datetime | None = None
    # When the job became due: created_at, or the run_at it was scheduled for.
    due_at: datetime | None = None
    # The payload's key in the result store when it was too large to keep inline
    # (raw_payload is then {}): the runner reads it before the handler runs.
    payload_ref: str | None = None
    # Times an object-store outage gave the job back already (jobcore.outcomes.store_failed).
    store_give_backs: int = 0

    @property
    def log_fields(self) -> dict[str, Any]:
        return {"job_id": str(self.job_id), "job_type": self.job_type.name, "attempt": self.attempt}
