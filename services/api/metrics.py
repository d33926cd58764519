"""The API's Prometheus metrics, on a registry of its own (one per app, so tests can
build many apps in one process). The request, enqueue and upload counters here are the
API's part of what docs/how-to/monitor.md lists."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from jobcore.kernel.quotas import Refusal

CONTENT_TYPE = CONTENT_TYPE_LATEST

ENQUEUE_RESULTS = ("accepted", "replayed", "joined", "rejected")
ENQUEUE_WRITE_WAYS = ("single", "coalesced")
# The reasons of jobcore_api_quota_refusals (jobcore.kernel.quotas.Refusal).
QUOTA_REFUSALS = tuple(Refusal)
# Names of the enqueue routes start with this, so an error answer can count as rejected.
ENQUEUE_ROUTE_PREFIX = "enqueue_"
# The catch-all route for types that are not registered is named enqueue_unknown_type.
UNKNOWN_TYPE_ROUTE = "unknown_type"


# The type label of requests to an unregistered job type (job type names start with a
# letter, so it cannot be one; and a caller's made-up names never become label values).
UNKNOWN_TYPE = "_unknown"


class ApiMetrics:
    def __init__(self, job_types: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.jobs_enqueued = Counter(
            "jobcore_api_jobs_enqueued",
            "Jobs created by POST /jobs/{type} (idempotent replays and debounce or throttle "
            "joins not included).",
            ["type"],
            registry=self.registry,
        )
        self.enqueue_requests = Counter(
            "jobcore_api_enqueue_requests",
            "POST /jobs/{type} answers by job type and outcome: accepted (new job), "
            "replayed (idempotency key matched), joined (a debounce or throttle key's open "
            "job answered), rejected (answered with an error).",
            ["type", "result"],
            registry=self.registry,
        )
        # Every series exists from the start, so rate() and absent-alerts see zeros.
        for job_type in job_types:
            self.jobs_enqueued.labels(job_type)
            for result in ENQUEUE_RESULTS:
                self.enqueue_requests.labels(job_type, result)
        self.quota_refusals = Counter(
            "jobcore_api_quota_refusals",
            "Requests answered 429 because a tenant quota or the process's long-poll cap "
            "was reached, by reason: enqueue_rate, max_unfinished, long_polls_tenant (the "
            "tenant's long-polls on this process), long_polls_process (all tenants').",
            ["reason"],
            registry=self.registry,
        )
        for reason in QUOTA_REFUSALS:
            self.quota_refusals.labels(reason)
        self.enqueue_writes = Counter(
            "jobcore_api_enqueue_writes",
            "Transactions that wrote POST /jobs/{type} requests, by way: single (one "
            "request's statement) or coalesced (requests of one tenant that queued behind "
            "one in flight, written together: services.api.coalescing).",
            ["way"],
            registry=self.registry,
        )
        for way in ENQUEUE_WRITE_WAYS:
            self.enqueue_writes.labels(way)
        self.coalesced_enqueues = Counter(
            "jobcore_api_coalesced_enqueues",
            "POST /jobs/{type} requests written by coalesced writes.",
            registry=self.registry,
        )
        # No tenant label, as on every metric of ours (tenant names are the callers'):
        # each upload is logged with its tenant ("payload stored by reference").
        self.payload_uploads = Counter(
            "jobcore_api_payload_uploads",
            "Payloads above JOBCORE_INLINE_PAYLOAD_MAX_BYTES uploaded to the object store by "
            "POST /jobs/{type} (replays and requests a quota refuses upload nothing).",
            registry=self.registry,
        )
        self.payload_upload_bytes = Counter(
            "jobcore_api_payload_upload_bytes",
            "Bytes of the payloads counted by jobcore_api_payload_uploads_total.",
            registry=self.registry,
        )
        self.payload_uploads_unused = Counter(
            "jobcore_api_payload_uploads_unused",
            "Payload uploads whose job was not written after all (replayed or refused between "
            "the check before the upload and the insert), deleted at once.",
            registry=self.registry,
        )
        self.internal_errors = Counter(
            "jobcore_api_internal_errors",
            "Requests answered 500 (a bug: every expected failure has its own answer).",
            registry=self.registry,
        )

        self.client_disconnects = Counter(
            "jobcore_api_client_disconnects",
            "Requests whose client closed the connection before their body arrived "
            "(nothing answered; not an error of the API).",
            registry=self.registry,
        )

    def count_enqueued(
        self, job_type: str, *, replayed: bool, jobs: int = 1, joined: bool = False
    ) -> None:
        """``jobs``: how many (a batch counts each of its items as a request)."""
        if replayed:
            self.enqueue_requests.labels(job_type, "replayed").inc(jobs)
        elif joined:
            self.enqueue_requests.labels(job_type, "joined").inc(jobs)
        else:
            self.enqueue_requests.labels(job_type, "accepted").inc(jobs)
            self.jobs_enqueued.labels(job_type).inc(jobs)

    def count_write(self, *, requests: int | None = None) -> None:
        """An enqueue write: a single one (``requests`` None), or a coalesced one of so
        many requests."""
        if requests is None:
            self.enqueue_writes.labels("single").inc()
        else:
            self.enqueue_writes.labels("coalesced").inc()
            self.coalesced_enqueues.inc(requests)

    def count_error(self, route_name: str | None, status: int) -> None:
        """Called for every error answer; counts the ones to enqueue requests."""
        if route_name is not None and route_name.startswith(ENQUEUE_ROUTE_PREFIX):
            job_type = route_name.removeprefix(ENQUEUE_ROUTE_PREFIX)
            if job_type == UNKNOWN_TYPE_ROUTE:
                job_type = UNKNOWN_TYPE
            self.enqueue_requests.labels(job_type, "rejected").inc()
        if status >= 500 and status != 503:
            self.internal_errors.inc()

    def uploaded(self, size: int) -> None:
        """A payload uploaded to the object store
        (jobcore.usecases.enqueue.submit.PayloadUploads)."""
        self.payload_uploads.inc()
        self.payload_upload_bytes.inc(size)

    def unused(self) -> None:
        self.payload_uploads_unused.inc()

    def count_refusal(self, reason: str) -> None:
        self.quota_refusals.labels(reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
