"""A typed Python client for jobcore's HTTP API, blocking (:class:`Client`) or asyncio
(:class:`AsyncClient`)::

    from jobcore.client import Client

    with Client("https://jobs.example.com", api_key) as jobs:
        accepted = jobs.enqueue("export_csv", {"rows": 500})
        job = jobs.wait(accepted.job_id, timeout=300)
        if job.status == "succeeded":
            csv_bytes = jobs.result(job.id).content
            jobs.save_result(job.id, "export.csv")  # or stream_result(), a chunk at a time

``enqueue`` sends an ``Idempotency-Key`` (a new UUID per call unless given) and retries
``503``, ``429`` and connection errors with that same key, so a call made while the
database is down returns exactly one job once it is back (or raises when its
:class:`RetryPolicy` runs out). Errors are :class:`ApiError` subclasses carrying the
API's problem JSON. :func:`verify_webhook` checks a webhook's Standard Webhooks signature.
The client imports nothing of the services: it needs only httpx, pydantic and orjson.

Its modules: :mod:`.sync` (:class:`Client`) and :mod:`.aio` (:class:`AsyncClient`), both
over :mod:`.core` (every operation written once, without I/O), the blocking one generated
from the asyncio one, :mod:`.primitives` being what differs between them; :mod:`.models` (the API's
answers), :mod:`.errors` (what it raises), :mod:`.retries` (when it tries a request again)
and :mod:`.webhook_signatures` (:func:`verify_webhook`).
"""

from jobcore.client.aio import AsyncClient, AsyncResultStream
from jobcore.client.core import JobFilter
from jobcore.client.errors import (
    ApiError,
    BadRequest,
    ClientError,
    Conflict,
    ConnectionFailed,
    ContentTooLarge,
    Forbidden,
    NotFound,
    PreconditionFailed,
    PreconditionRequired,
    ServerError,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
    UnprocessableContent,
    UnsupportedMediaType,
    WaitTimeout,
    WebhookVerificationFailed,
)
from jobcore.client.models import (
    Accepted,
    Batch,
    BatchAnswer,
    BatchCallbackState,
    BatchCounts,
    BatchCreated,
    BatchItemOutcome,
    BatchJobsAdded,
    CancelAnswer,
    Job,
    JobLinks,
    JobPage,
    JobResult,
    JobStatus,
    JobSummary,
    PageLinks,
    Workflow,
    WorkflowCancelAnswer,
    WorkflowCreated,
    WorkflowJob,
    WorkflowRetryAnswer,
)
from jobcore.client.retries import NO_RETRIES, RetryPolicy
from jobcore.client.sync import Client, ResultStream
from jobcore.client.webhook_signatures import verify_webhook

__all__ = [
    "NO_RETRIES",
    "Accepted",
    "ApiError",
    "AsyncClient",
    "AsyncResultStream",
    "BadRequest",
    "Batch",
    "BatchAnswer",
    "BatchCallbackState",
    "BatchCounts",
    "BatchCreated",
    "BatchItemOutcome",
    "BatchJobsAdded",
    "CancelAnswer",
    "Client",
    "ClientError",
    "Conflict",
    "ConnectionFailed",
    "ContentTooLarge",
    "Forbidden",
    "Job",
    "JobFilter",
    "JobLinks",
    "JobPage",
    "JobResult",
    "JobStatus",
    "JobSummary",
    "NotFound",
    "PageLinks",
    "PreconditionFailed",
    "PreconditionRequired",
    "ResultStream",
    "RetryPolicy",
    "ServerError",
    "ServiceUnavailable",
    "TooManyRequests",
    "Unauthorized",
    "UnprocessableContent",
    "UnsupportedMediaType",
    "WaitTimeout",
    "WebhookVerificationFailed",
    "Workflow",
    "WorkflowCancelAnswer",
    "WorkflowCreated",
    "WorkflowJob",
    "WorkflowRetryAnswer",
    "verify_webhook",
]
