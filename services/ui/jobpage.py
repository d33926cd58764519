"""The job page's actions, each with what it will do, said before the operator clicks.

Which actions a job offers follows its state (docs/design.md: terminal states are final,
so a finished job is retried as a new job, never revived). The words say what the use case
behind each button does (:mod:`jobcore.usecases.jobs`); the buttons post to the console's
routes, with the session's form token, and each action is audited there.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobcore.kernel.jobevents import JobEventKind
from jobcore.kernel.states import JobStatus
from jobcore.usecases.console import JobView


@dataclass(frozen=True, slots=True)
class Action:
    # The route's last part (/jobs/{id}/<name>), or a page's path for a link.
    name: str
    label: str
    # What happens on a click, in words, shown beside the button.
    does: str
    # The browser asks this first (None: no question).
    confirm: str | None = None
    danger: bool = False
    # A link to another page instead of a form posted here.
    href: str | None = None


def job_actions(view: JobView) -> list[Action]:
    job = view.job
    status = JobStatus(job["status"])
    actions: list[Action] = []
    if status is JobStatus.PENDING:
        actions.append(
            Action(
                "cancel",
                "Cancel job",
                "Cancels it now: it will not run, its place in any key or limit is freed, and "
                "its completion webhook (if it has one) reports it cancelled.",
                confirm=f"Cancel job {job['id']}?",
                danger=True,
            )
        )
    elif status is JobStatus.RUNNING:
        actions.append(
            Action(
                "cancel",
                "Cancel job",
                "Asks the worker running it to stop it: it ends cancelled once its handler "
                "stops (if the handler finishes first, its outcome stands).",
                confirm=f"Cancel job {job['id']}?",
                danger=True,
            )
        )
    if status in (JobStatus.FAILED, JobStatus.CANCELLED):
        where = ""
        if job["ordering_key"] is not None:
            where = (
                " It takes this job's place in ordering key "
                f"{job['ordering_key']} (the jobs after it wait for the copy)."
                if status is JobStatus.FAILED and job["ordering_blocks"]
                else f" It goes to the back of ordering key {job['ordering_key']}."
            )
        actions.append(
            Action(
                "retry",
                "Retry (a new job)",
                "Enqueues a new job with this one's type, payload, entity and unique key, "
                f"attempts counted afresh; this job stays {status.value}.{where}",
            )
        )
    if status is JobStatus.FAILED and job["ordering_key"] is not None and job["ordering_blocks"]:
        actions.append(
            Action(
                "unblock",
                "Unblock its key",
                f"Lets the later jobs of ordering key {job['ordering_key']} go on without "
                "running this job again (Retry runs it again in its place instead).",
                confirm=f"Let ordering key {job['ordering_key']} go on without this job?",
            )
        )
    if _dead_lettered(view):
        actions.append(
            Action(
                "replay",
                "Replay its dead letter",
                "Its message is in the dead-letter queue. Publishes this job's dead letters, "
                "and no other, back to its job queue; the rest stay where they are. A message "
                "that ran already has no effect twice.",
                confirm=f"Replay the dead letters of job {job['id']}?",
            )
        )
    return actions


def _dead_lettered(view: JobView) -> bool:
    """A pending job whose latest event put its message in the dead-letter queue."""
    if view.job["status"] != JobStatus.PENDING or view.timeline is None:
        return False
    events = view.timeline.events
    return bool(events) and events[-1].kind == JobEventKind.DEAD_LETTERED
