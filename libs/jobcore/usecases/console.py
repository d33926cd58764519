"""What the operators' console (``jobcore ui``) reads that no other entry point does: the
overview (rates, backlog, relay lag, leases, what waits for an operator), the job
search (keyset pages), and the job page's view (what holds a job, its progress, its last
error). Its actions are the other use cases (jobs, outbox, dlq, webhooks), called as the
commands call them."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from jobcore.database.gateway import Database
from jobcore.database.store import ConsoleJobSearchParams, console_store, outbox_store
from jobcore.kernel.errors import JobcoreError
from jobcore.kernel.settings import Settings
from jobcore.kernel.states import JobStatus
from jobcore.usecases.dlq import count_dead_letters
from jobcore.usecases.jobs import show_job
from jobcore.usecases.timeline import job_timeline
from jobcore.usecases.webhooks import list_deliveries
from jobcore.usecases.whereabouts import JobTimeline

# The overview's rate window, one point a minute.
RATE_MINUTES = 30
# A running job whose lease ends within this is shown as expiring.
EXPIRING_WITHIN_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Rates:
    minutes: list[datetime]
    enqueued: list[int]
    succeeded: list[int]
    failed: list[int]


@dataclass(frozen=True, slots=True)
class Overview:
    at: datetime
    rates: Rates
    queues: list[dict[str, Any]]
    outbox: dict[str, Any]
    leases: dict[str, Any]
    failed_webhooks: int
    # None when the broker could not be asked (the reason is in dead_letters_error).
    dead_letters: int | None
    dead_letters_error: str | None = None
    notes: list[str] = field(default_factory=list)


async def overview(db: Database, settings: Settings) -> Overview:
    """One consistent snapshot of the database's side, and the dead-letter queue's depth
    from the broker (a broker that does not answer leaves it unknown, not the page)."""
    async with db.unit_of_work() as uow:
        rates = await console_store.rates(uow, {"minutes": RATE_MINUTES})
        queues = await console_store.backlog_by_queue(uow)
        outbox = await outbox_store.status(uow)
        leases = await console_store.leases(
            uow, {"expiring_within_seconds": EXPIRING_WITHIN_SECONDS}
        )
        webhooks = await console_store.count_failed_webhooks(uow)
        now = await console_store.now(uow)
    # Aggregates without GROUP BY, and now(), always return one row.
    assert outbox is not None
    assert leases is not None
    assert webhooks is not None
    assert now is not None
    dead_letters: int | None
    error: str | None = None
    try:
        dead_letters = await count_dead_letters(settings)
    except JobcoreError as exc:
        dead_letters, error = None, str(exc)
    return Overview(
        at=now["now"],
        rates=Rates(
            minutes=[r["minute"] for r in rates],
            enqueued=[r["enqueued"] for r in rates],
            succeeded=[r["succeeded"] for r in rates],
            failed=[r["failed"] for r in rates],
        ),
        queues=[dict(q) for q in queues],
        outbox=dict(outbox),
        leases=dict(leases),
        failed_webhooks=int(webhooks["failed"]),
        dead_letters=dead_letters,
        dead_letters_error=error,
    )


# The keys the jobs list filters by: the column each names. Gate keys (concurrency, rate)
# are global strings that already hold the type and tenant (jobcore.kernel.gates.gate_key); ordering
# and unique keys are the client's own, per tenant (and type, for unique keys).
KEY_COLUMNS = {
    "ordering": "ordering_key",
    "concurrency": "concurrency_key",
    "rate": "rate_key",
    "unique": "unique_key",
}


class InvalidPageCursor(JobcoreError):
    """An ``after`` cursor this console did not write (edited, or cut short)."""


@dataclass(frozen=True, slots=True)
class JobSearch:
    tenant: str | None = None
    type: str | None = None
    status: JobStatus | None = None
    entity_id: str | None = None
    # One of KEY_COLUMNS, with the key's value.
    key_kind: str | None = None
    key: str | None = None

    def across_every_status(self) -> bool:
        """No tenant, status, entity or key narrows it (a type at most): the list that
        merges the newest of each status (CONSOLE_JOB_SEARCH_ANY_STATUS)."""
        return not (self.tenant or self.status or self.entity_id or self.key)

    def query(self) -> dict[str, str]:
        """The filters as the list's query string carries them (only those given)."""
        given = {
            "tenant": self.tenant,
            "type": self.type,
            "status": self.status.value if self.status else None,
            "entity_id": self.entity_id,
            "key_kind": self.key_kind if self.key else None,
            "key": self.key,
        }
        return {name: value for name, value in given.items() if value}


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def page_cursor(row: Mapping[str, Any]) -> str:
    """The cursor after ``row``: its created_at in whole microseconds (what PostgreSQL
    keeps, so no rounding moves it) and its id, URL-safe."""
    micros = (row["created_at"] - _EPOCH) // _MICROSECOND
    return f"{micros}_{row['id']}"


def read_page_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    micros, _, job_id = cursor.partition("_")
    try:
        return _EPOCH + int(micros) * _MICROSECOND, uuid.UUID(job_id)
    except (ValueError, OverflowError):
        raise InvalidPageCursor("that page link is not one this console made") from None


@dataclass(frozen=True, slots=True)
class JobPage:
    rows: list[dict[str, Any]]
    # The cursor of the next page; None on the last one.
    next_after: str | None


async def search_jobs(
    db: Database, where: JobSearch, *, limit: int, after: str | None = None
) -> JobPage:
    """A page of the newest jobs matching every given field, newest first (operators, all
    tenants): keyset pages by (created_at, id), so a page stays the same while newer jobs
    arrive, and a later page costs what the first does."""
    after_at, after_id = read_page_cursor(after) if after else (None, None)
    # One more than shown: whether there is a next page.
    async with db.unit_of_work() as uow:
        if where.across_every_status():
            rows = await console_store.search_jobs_any_status(
                uow,
                {
                    "type": where.type,
                    "after_created_at": after_at,
                    "after_id": after_id,
                    "limit": limit + 1,
                },
            )
        else:
            params = _search_params(where, after_at, after_id, limit + 1)
            rows = await console_store.search_jobs(uow, params)
    shown = [dict(r) for r in rows[:limit]]
    return JobPage(shown, page_cursor(shown[-1]) if len(rows) > limit else None)


def _search_params(
    where: JobSearch, after_at: datetime | None, after_id: uuid.UUID | None, limit: int
) -> ConsoleJobSearchParams:
    keys: dict[str, str | None] = dict.fromkeys(KEY_COLUMNS.values())
    if where.key and where.key_kind in KEY_COLUMNS:
        keys[KEY_COLUMNS[where.key_kind]] = where.key
    return {
        "tenant": where.tenant,
        "type": where.type,
        "status": where.status.value if where.status else None,
        "entity_id": where.entity_id,
        "ordering_key": keys["ordering_key"],
        "concurrency_key": keys["concurrency_key"],
        "rate_key": keys["rate_key"],
        "unique_key": keys["unique_key"],
        "after_created_at": after_at,
        "after_id": after_id,
        "limit": limit,
    }


@dataclass(frozen=True, slots=True)
class Hold:
    """What keeps a pending job from starting, and where its fellow jobs are listed."""

    # ordering, concurrency, rate_limit, dependencies, paused_queue or paused_type.
    kind: str
    # What holds it, in words ("ordering key acct-1 of tenant acme").
    what: str
    # The jobs list's filters for the other jobs of that key (None: no such list).
    others: JobSearch | None
    # More about it, in words (the slots in use, the rate).
    why: str = ""
    # ordering: the job it waits for (id, type, status), when one still blocks the key.
    waits_for: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class LastError:
    text: str
    # The attempt it ended (the latest event that carried an error; else the job's count).
    attempt: int
    max_attempts: int


@dataclass(frozen=True, slots=True)
class Progress:
    fraction: float
    message: str | None
    attempt: int | None
    # Reported by the attempt now running (or the last one, for an ended job).
    current: bool


@dataclass(frozen=True, slots=True)
class Coalesced:
    """The debounce or throttle key a job was written for (jobcore.kernel.keyed), and how
    many enqueues a debounced job took (None for a throttled one: its enqueues joined
    without writing to it)."""

    kind: str
    key: str
    count: int | None


@dataclass(frozen=True, slots=True)
class JobView:
    """What the console's job page answers: the job, where it is, what holds it, how far
    it got, its last error, its timeline and its webhook deliveries."""

    job: dict[str, Any]
    timeline: JobTimeline | None
    hold: Hold | None
    progress: Progress | None
    last_error: LastError | None
    deliveries: list[dict[str, Any]]
    # Each key the job has, as (kind, key, the jobs list's filters for that key).
    keys: list[tuple[str, str, JobSearch]]
    # Its debounce or throttle key, if its type declares one.
    coalesced: Coalesced | None = None


# The deliveries a job page lists (a job has one per completion, and redeliveries reuse it).
JOB_PAGE_DELIVERIES = 20


async def job_view(db: Database, job_id: uuid.UUID) -> JobView:
    """Everything the job page shows, for operators (any tenant); JobNotFound if none."""
    job = await show_job(db, job_id)
    timeline = await job_timeline(db, job_id, tenant=None)
    deliveries = await list_deliveries(db, job_id=job_id, status=None, limit=JOB_PAGE_DELIVERIES)
    return JobView(
        job=job,
        timeline=timeline,
        hold=await _hold(db, job),
        progress=_progress(job),
        last_error=_last_error(job, timeline),
        deliveries=[dict(d) for d in deliveries],
        keys=_keys(job),
        coalesced=_coalesced(job),
    )


def _coalesced(job: Mapping[str, Any]) -> Coalesced | None:
    key = job.get("debounce_key")
    if key is None:
        return None
    kind = "throttle" if key.startswith("throttle:") else "debounce"
    return Coalesced(kind, key, job.get("debounce_count"))


def _keys(job: Mapping[str, Any]) -> list[tuple[str, str, JobSearch]]:
    found: list[tuple[str, str, JobSearch]] = []
    for kind, column in KEY_COLUMNS.items():
        key = job.get(column)
        if key is None:
            continue
        # Ordering and unique keys are the tenant's own; gate keys name their scope.
        tenant = job["tenant"] if kind in ("ordering", "unique") else None
        found.append((kind, key, JobSearch(tenant=tenant, key_kind=kind, key=key)))
    return found


async def _hold(db: Database, job: Mapping[str, Any]) -> Hold | None:
    if job["status"] != JobStatus.PENDING:
        return None
    if job.get("paused") == "queue":
        return Hold("paused_queue", f"paused queue {job['queue']}", None)
    if job.get("paused") is not None:
        return Hold("paused_type", f"paused job type {job['type']}", JobSearch(type=job["type"]))
    reason = job.get("held_reason")
    if reason == "dependencies":
        return Hold(
            "dependencies",
            f"workflow {job.get('workflow_id')}",
            None,
            "it starts when the jobs it depends on have ended as its edges require",
        )
    if reason == "ordering":
        others = JobSearch(tenant=job["tenant"], key_kind="ordering", key=job["ordering_key"])
        async with db.session() as session:
            blocker = await console_store.ordering_blocker(
                session,
                {
                    "tenant": job["tenant"],
                    "ordering_key": job["ordering_key"],
                    "ordering_seq": job["ordering_seq"],
                },
            )
        return Hold(
            "ordering",
            f"ordering key {job['ordering_key']} of tenant {job['tenant']}",
            others,
            "an earlier job of the key has not finished",
            None if blocker is None else dict(blocker),
        )
    if reason == "concurrency":
        async with db.session() as session:
            row = await console_store.count_running_of_gate(
                session, {"concurrency_key": job["concurrency_key"]}
            )
        running = 0 if row is None else int(row["running"])
        return Hold(
            "concurrency",
            f"concurrency limit {job['concurrency_key']}",
            JobSearch(key_kind="concurrency", key=job["concurrency_key"]),
            f"{running} of its {job['concurrency_limit']} slots are running",
        )
    if reason == "rate_limit":
        return Hold(
            "rate_limit",
            f"rate limit {job['rate_key']}",
            JobSearch(key_kind="rate", key=job["rate_key"]),
            f"at most {job['rate_per_second']:g} starts a second (bursts of "
            f"{job['rate_burst']}): it starts at the limit's next free start",
        )
    return None


def _progress(job: Mapping[str, Any]) -> Progress | None:
    fraction = job.get("progress_fraction")
    if fraction is None:
        return None
    attempt = job.get("progress_attempt")
    return Progress(
        float(fraction), job.get("progress_message"), attempt, attempt == job["attempts"]
    )


def _last_error(job: Mapping[str, Any], timeline: JobTimeline | None) -> LastError | None:
    text = job.get("last_error")
    if not text:
        return None
    attempt = job["attempts"]
    for event in reversed(timeline.events if timeline else []):
        if event.detail.get("error") and event.attempt is not None:
            attempt = event.attempt
            break
    return LastError(str(text), attempt, job["max_attempts"])


def parse_job_id(text: str) -> uuid.UUID | None:
    """``text`` as a job id, or None when it is not one."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        return None
