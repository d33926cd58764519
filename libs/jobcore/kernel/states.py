"""The job state machine as pure code: statuses, allowed transitions, terminal states."""

from __future__ import annotations

from enum import StrEnum

from jobcore.kernel.errors import IllegalTransition


class JobStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL: frozenset[JobStatus] = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}
)

# running -> pending is a retry (or a reaped / released lease); pending -> failed is not
# allowed: a job only fails after a worker tried it (or the reaper found its lease dead,
# which happens from running).
ALLOWED: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    {
        (JobStatus.PENDING, JobStatus.RUNNING),
        (JobStatus.PENDING, JobStatus.CANCELLED),
        (JobStatus.RUNNING, JobStatus.SUCCEEDED),
        (JobStatus.RUNNING, JobStatus.FAILED),
        (JobStatus.RUNNING, JobStatus.CANCELLED),
        (JobStatus.RUNNING, JobStatus.PENDING),
    }
)


def is_terminal(status: JobStatus | str) -> bool:
    return JobStatus(status) in TERMINAL


def can_transition(source: JobStatus | str, target: JobStatus | str) -> bool:
    return (JobStatus(source), JobStatus(target)) in ALLOWED


def check_transition(source: JobStatus | str, target: JobStatus | str) -> None:
    """Raise :class:`IllegalTransition` unless ``source -> target`` is allowed."""
    if not can_transition(source, target):
        raise IllegalTransition(f"job status cannot change from {source} to {target}")
