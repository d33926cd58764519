"""One error base class for jobcore; each subclass's docstring is its default message.

HTTP status mapping happens once, in the API; the CLI prints ``str(error)`` on one line.
"""

from __future__ import annotations


class JobcoreError(Exception):
    """jobcore failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self)


class ConfigurationError(JobcoreError):
    """The configuration is invalid."""


class DatabaseUnavailable(JobcoreError):
    """The database cannot be reached."""


class TransientConflict(JobcoreError):
    """The statement lost a deadlock or serialization conflict; running it again works."""


class DatabaseMissing(ConfigurationError):
    """The configured database does not exist."""


class BrokerUnavailable(JobcoreError):
    """The message broker cannot be reached."""


class IllegalTransition(JobcoreError):
    """That job status change is not allowed."""


class UnknownJobType(JobcoreError):
    """No job type is registered under that name."""


class InvalidPayload(JobcoreError):
    """The payload does not validate against the job type's model."""


class InvalidField(JobcoreError):
    """A field of the request is invalid."""

    def __init__(
        self, field: str, reason: str, *, kind: str, path: tuple[str | int, ...] = ()
    ) -> None:
        # The field by its name in the request (``run_at``, ``unique_key``, ``payload``),
        # where in it (a path in the payload), why, and what kind of error that is. Where
        # the field came from (a query parameter, a batch item) is the caller's to say.
        self.field = field
        self.path = path
        self.reason = reason
        self.kind = kind
        where = ".".join(str(part) for part in (field, *path))
        super().__init__(f"{where}: {reason}")


class InvalidIdempotencyKey(InvalidField):
    """An idempotency key is 1 to 255 printable ASCII characters."""

    def __init__(self) -> None:
        reason = "an idempotency key is 1 to 255 printable ASCII characters"
        super().__init__("idempotency_key", reason, kind="idempotency_key")


class InvalidUniqueKey(InvalidPayload, InvalidField):
    """A unique key is 1 to 255 characters, without NUL."""


class IdempotencyConflict(JobcoreError):
    """That idempotency key was already used with a different request."""


class UniqueJobExists(JobcoreError):
    """A pending or running job of this type already holds that unique key."""

    def __init__(self, job_id: object, job_status: str) -> None:
        self.job_id = job_id
        self.job_status = job_status
        super().__init__(
            f"job {job_id} ({job_status}) holds this unique key until it ends; no job was created"
        )


class JobNotFound(JobcoreError):
    """No such job."""


class WorkflowNotFound(JobcoreError):
    """No such workflow."""


class WorkflowStepNotFound(JobcoreError):
    """The workflow has no job of that name."""


class InvalidWorkflow(InvalidField):
    """The workflow's graph is invalid (a cycle, an unknown or duplicate job name)."""


class JobNotCancellable(JobcoreError):
    """The job already finished; it cannot be cancelled."""

    def __init__(self, job_status: str) -> None:
        self.job_status = job_status
        super().__init__(f"the job is {job_status}; only pending or running jobs can be cancelled")


class JobNotEditable(JobcoreError):
    """Only a pending job can be changed in place: it was claimed or it ended."""

    def __init__(self, job_status: str) -> None:
        self.job_status = job_status
        super().__init__(
            f"the job is {job_status}; only a pending job can be changed (it was claimed or "
            "it ended since it was read)"
        )


class JobVersionMismatch(JobcoreError):
    """The job changed since the version the edit names was read: read it again."""

    def __init__(self, current: str) -> None:
        self.current = current
        super().__init__(
            "the job changed since that version was read; read it again (its ETag) and "
            "decide on the job as it is now"
        )


class JobVersionRequired(JobcoreError):
    """An edit names the version of the job it was decided on (If-Match: the ETag of
    GET /jobs/{id})."""


class BatchNotFound(JobcoreError):
    """No such batch."""


class BatchClosed(JobcoreError):
    """The batch is closed; no member may join it."""


class BatchIdTaken(JobcoreError):
    """Another tenant's batch has that id."""


class BatchJobKeyTaken(JobcoreError):
    """The idempotency key's job is not a member of this batch."""


class JobNotRetryable(JobcoreError):
    """Only a failed or cancelled job can be retried."""


class JobNotBlocking(JobcoreError):
    """Only a failed job of an ordering key holds back the jobs after it."""


class ResultNotReady(JobcoreError):
    """The job has not succeeded (yet); it has no result."""

    def __init__(self, job_status: str) -> None:
        self.job_status = job_status
        super().__init__(f"the job is {job_status}; a result exists once it has succeeded")


class OutboxRowNotFound(JobcoreError):
    """No outbox row has that id or message id."""


class OutboxRowNotQuarantined(JobcoreError):
    """Only quarantined outbox rows can be requeued or discarded."""


class OutboxRowJobEnded(JobcoreError):
    """The outbox row's job has ended: publishing its message would do nothing."""


class NoDeadLetter(JobcoreError):
    """No message of that job is in the dead-letter queue."""


class PoisonMessage(JobcoreError):
    """The message can never be processed."""


class PermanentError(JobcoreError):
    """The job failed and retrying cannot help."""


# The longest a snooze may last: a year, as far ahead as an enqueue's run_at.
MAX_SNOOZE_SECONDS = 366 * 86_400


class Snooze(Exception):
    """Run this job again in ``seconds``, without spending an attempt.

    A handler returns it or raises it (``return Snooze(60)``, ``raise Snooze(60)``): the job
    goes back to pending, due in ``seconds``, with a ``snoozed`` event; what it held is
    released or kept as the how-to on snoozing says. A job type's ``max_snoozes`` (else
    ``JOBCORE_MAX_SNOOZES``) caps the snoozes of one job: the one past it fails the job.
    Not a :class:`JobcoreError`: nothing went wrong."""

    def __init__(self, seconds: float) -> None:
        if not 0 <= seconds <= MAX_SNOOZE_SECONDS or seconds != seconds:
            raise ValueError(f"a snooze lasts 0 to {MAX_SNOOZE_SECONDS} seconds, not {seconds!r}")
        self.seconds = float(seconds)
        super().__init__(f"snoozed for {self.seconds:g} s")


class StoreRefused(JobcoreError, OSError):
    """The object store refused the request, and would refuse it again as it is: check the
    bucket, its policy and the credentials. An OSError like
    :class:`~jobcore.storage.results.StoreUnavailable`, so every caller that survives a store
    failure survives this one; unlike an outage, it fails the attempt that met it. Its
    message names no credential."""


class LeaseLost(JobcoreError):
    """This attempt's lease was lost (the job went back to pending or to another attempt):
    nothing it wrote in its transaction was committed."""


class DuplicateRegistration(JobcoreError):
    """A job type with that name is already registered."""


class ServiceStateError(JobcoreError):
    """The service is not in a state that allows that."""


class QuotaExceeded(JobcoreError):
    """The tenant is over one of its quotas; retry later."""

    # Which quota (jobcore.kernel.quotas.Refusal): the reason label of the refusal metric.
    reason = "quota"

    def __init__(
        self,
        message: str | None = None,
        *,
        reason: str | None = None,
        retry_after: int = 1,
        headers: dict[str, str] | None = None,
        limit: int | float | None = None,
    ) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason
        # Seconds before a retry can succeed, and headers the answer carries (RateLimit).
        self.retry_after = retry_after
        self.headers = headers or {}
        self.limit = limit


class EnqueueRateExceeded(QuotaExceeded):
    """The tenant's enqueue rate limit is used up; retry after Retry-After seconds."""

    reason = "enqueue_rate"


class TooManyUnfinishedJobs(QuotaExceeded):
    """The tenant has as many unfinished jobs as it may; retry when some have finished."""

    reason = "max_unfinished"


class TooManyLongPolls(QuotaExceeded):
    """Too many long-polls are waiting; poll without wait, or retry after Retry-After."""
