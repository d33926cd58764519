"""What a batch's callback job receives under its payload's ``batch`` field
(jobcore.usecases.batches): a callback job type declares ``batch: BatchOutcome`` in its
payload model.

The counts are of the batch's own members (a child batch counts as one) when the
callback fired; ``failed_job_ids`` lists up to 1,000 failed jobs of the batch and of its
child batches.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The most failed job ids a callback's payload lists (its counts are exact).
FAILED_IDS_LISTED = 1000


class BatchOutcome(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    id: uuid.UUID
    # success: every member succeeded; complete: every member settled; death: the first
    # member failed for good (``first_death_job_id``).
    event: Literal["success", "complete", "death"]
    total: int = Field(ge=0)
    succeeded: int = Field(ge=0)
    failed: int = Field(ge=0)
    cancelled: int = Field(ge=0)
    pending: int = Field(ge=0)
    first_death_job_id: uuid.UUID | None = None
    failed_job_ids: list[uuid.UUID] = Field(default_factory=list, max_length=FAILED_IDS_LISTED)
