"""The PostgreSQL NOTIFY channels that more than one module names.

A leaf module (it imports nothing of jobcore's), so the statements and the code that
sends or listens can share a name without importing each other.
"""

from __future__ import annotations

# An outbox row is due: the relays wake (sent by enqueue, requeue and the sweeper).
OUTBOX_CHANNEL = "jobcore_outbox"

# A running job's progress was written (the payload is the job id): the API's long-polls
# that asked for progress (`GET /jobs/{id}?wait=30&on=progress`) wake.
JOB_PROGRESS_CHANNEL = "jobcore_job_progress"
