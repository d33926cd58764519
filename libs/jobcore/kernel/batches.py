"""What a batch's callback job receives under its payload's ``batch`` field
(jobcore.usecases.batches): a callback job type declares ``batch: BatchOutcome`` in its
payload model.

The counts are of the batch's own members (a child batch counts as one) when the
callback fired; ``failed_job_ids`` lists up to 1,000 failed jobs of the batch and of its
child batches.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

# The most failed job ids a callback's payload lists (its counts are exact).
FAILED_IDS_LISTED = 1000


# Bounded in the JSON schema too (a payload's every field is: docs/handlers.md).
Uuid = Annotated[uuid.UUID, WithJsonSchema({"type": "string", "format": "uuid", "maxLength": 36})]
Count = Annotated[int, Field(ge=0, le=2**31 - 1)]


class BatchOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Uuid
    # success: every member succeeded; complete: every member settled; death: the first
    # member failed for good (``first_death_job_id``).
    event: Literal["success", "complete", "death"]
    total: Count
    succeeded: Count
    failed: Count
    cancelled: Count
    pending: Count
    first_death_job_id: Uuid | None = None
    failed_job_ids: list[Uuid] = Field(default_factory=list, max_length=FAILED_IDS_LISTED)
