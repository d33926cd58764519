"""The claim: what is asked of it (:class:`ClaimRequest`, one per message), the statement
that answers (:func:`claim_batch`), and its answers: a :class:`ClaimedJob` (this runner
holds the job's lease) or :class:`Unclaimed` (why not).

The inbox row and the lease are written by the one claiming statement
(``JobStore.claim``), so a message seen before (a redelivery, a re-published outbox row)
has no effect, and a job runs under one lease at a time. A claim whose first try committed
unanswered is retried with the same lease token and comes back ``resumed``: the job it
claimed runs, rather than waiting for the reaper.

A :class:`ClaimedJob` is made once, from the claim statement's row, and is the job from
there to its outcome: the payload is loaded from it, the handler's context is made from
it, the outcome statements are fenced by its lease token, the metrics and the spans read
it. Nothing repacks it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from jobcore.database.gateway import AsyncConn
from jobcore.database.store import (
    JOBS_CONSUMER,
    JobClaimFromOutboxParams,
    JobClaimManyParams,
    job_store,
)
from jobcore.execution.registry import JobType, Registry


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One message's claim: its inbox row and, if the job is due, its lease."""

    message_id: uuid.UUID
    job_id: uuid.UUID
    job_type: JobType[Any]
    attempt: int
    # Drawn once, before the first try: a retry whose first try committed unanswered
    # finds the job running under it, and takes it as its own (the claim's `resumed`).
    lease_token: uuid.UUID = field(default_factory=uuid.uuid4)
    # Seconds; None: the job type's.
    lease: float | None = None
    # When and by which relay the message was published (its headers: None when they do
    # not say), which the claim of a job's first attempt keeps on the job row as its
    # `published` event (jobcore.kernel.envelope.PUBLISHED_HEADER).
    published_at: datetime | None = None
    published_by: str | None = None

    @property
    def lease_seconds(self) -> float:
        return self.job_type.lease if self.lease is None else self.lease

    @property
    def limited(self) -> bool:
        """Its type declares a concurrency or rate limit, or debounces (its jobs take a
        concurrency limit of 1 on their key), so its job likely has a key (only how the
        claim is sent depends on it; the key is read from the job row)."""
        kind = self.job_type
        return kind.concurrency is not None or kind.rate is not None or kind.debounce is not None


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job whose lease this runner holds, as the claim statement returned it."""

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
    # (raw_payload is then {}): read before the handler runs.
    payload_ref: str | None = None
    # A job debounced with payloads="all": every payload it coalesced (jobs.debounce_payloads).
    raw_payloads: list[Any] | None = None
    # Times an object-store outage gave the job back already (outcomes.store_failed).
    store_give_backs: int = 0
    # Times its handler snoozed it already (jobcore.kernel.errors.Snooze).
    snoozes: int = 0
    # The claim's first try committed unanswered and this one took what it claimed.
    resumed: bool = False

    @classmethod
    def from_claim_row(cls, row: Mapping[str, Any], job_type: JobType[Any]) -> ClaimedJob:
        return cls(
            job_id=row["id"],
            job_type=job_type,
            raw_payload=row["payload"],
            attempt=row["attempts"],
            max_attempts=row["max_attempts"],
            lease_token=row["lease_token"],
            cancel_requested=row["cancel_requested_at"] is not None,
            trace_headers={
                k: row[k] for k in ("traceparent", "tracestate") if row.get(k) is not None
            },
            message_id=row["message_id"],
            created_at=row["created_at"],
            due_at=row["due_at"],
            payload_ref=row.get("payload_ref"),
            raw_payloads=row.get("debounce_payloads"),
            store_give_backs=row.get("store_give_backs", 0),
            snoozes=row.get("snoozes", 0),
            resumed=bool(row.get("resumed")),
        )

    @property
    def log_fields(self) -> dict[str, Any]:
        return {"job_id": str(self.job_id), "job_type": self.job_type.name, "attempt": self.attempt}


UnclaimedReason = Literal["held", "duplicate", "parked", "skipped"]


@dataclass(frozen=True, slots=True)
class Unclaimed:
    """A claim that took no lease: the message is done with, the job not run here.

    - ``held``: a gate holds the job (``detail``: which), it runs once its turn comes;
    - ``duplicate``: the inbox had the message already;
    - ``parked``: its queue or type is paused, the message waits in the outbox;
    - ``skipped``: the job is not claimable (``detail``: its status)."""

    reason: UnclaimedReason
    detail: str | None = None

    @classmethod
    def from_claim_row(cls, row: Mapping[str, Any]) -> Unclaimed:
        if row.get("held_reason") is not None:
            return cls("held", row["held_reason"])
        if not row["fresh"]:
            return cls("duplicate")
        if row.get("parked"):
            return cls("parked")
        return cls("skipped", row.get("status_before"))


DUPLICATE = Unclaimed("duplicate")

ClaimAnswer = ClaimedJob | Unclaimed


def _claim_params(
    requests: Sequence[ClaimRequest], *, exchange: str, worker_id: str
) -> JobClaimManyParams:
    return {
        "consumer": JOBS_CONSUMER,
        "exchange": exchange,
        "worker_id": worker_id,
        "message_ids": [r.message_id for r in requests],
        "job_ids": [r.job_id for r in requests],
        "types": [r.job_type.name for r in requests],
        "attempts": [r.attempt for r in requests],
        "lease_tokens": [r.lease_token for r in requests],
        "leases": [float(r.lease_seconds) for r in requests],
        "published_ats": [r.published_at for r in requests],
        "published_bys": [r.published_by for r in requests],
    }


def _answer(row: Mapping[str, Any], job_type: JobType[Any]) -> ClaimAnswer:
    if row["fresh"] and row["id"] is not None:
        return ClaimedJob.from_claim_row(row, job_type)
    return Unclaimed.from_claim_row(row)


async def claim_batch(
    conn: AsyncConn, requests: Sequence[ClaimRequest], *, exchange: str, worker_id: str
) -> list[ClaimAnswer]:
    """The batch's claims, one statement per round of distinct message ids (one round
    unless a message came twice); a request repeated (its message and token) is a
    duplicate the 2nd time."""
    answered_by: dict[tuple[uuid.UUID, uuid.UUID], ClaimAnswer] = {}
    for round_ in claim_rounds(requests):
        params = _claim_params(round_, exchange=exchange, worker_id=worker_id)
        # Every claim locks the gate rows of its jobs' concurrency and rate keys first,
        # read from the job rows (written at enqueue), not from this runner's registry: a
        # worker deployed before a type's limit still takes the lock and counts behind it.
        # The claim then counts from a snapshot every other claim of those keys committed
        # before. One round trip: BEGIN, lock, claim and COMMIT pipelined. Jobs whose rows
        # name no key are claimed first, by one statement that locks nothing (most
        # batches: that statement is the whole claim).
        claimed = await job_store.claim(conn, params, keyed=any(r.limited for r in round_))
        by_message = {row["message_id"]: row for row in claimed}
        for r in round_:
            answered_by[r.message_id, r.lease_token] = _answer(by_message[r.message_id], r.job_type)
    answers: list[ClaimAnswer] = []
    answered: set[tuple[uuid.UUID, uuid.UUID]] = set()
    for request in requests:
        key = (request.message_id, request.lease_token)
        answers.append(DUPLICATE if key in answered else answered_by[key])
        answered.add(key)
    return answers


def claim_rounds(requests: Sequence[ClaimRequest]) -> list[list[ClaimRequest]]:
    """The batch's distinct requests (message and lease token) in rounds, each holding a
    message at most once: the claim statement takes distinct message ids.

    Two requests for one message with different tokens are a redelivery and a retry whose
    first try may have committed unanswered. Sent in the same statement, one would have
    to be dropped, and dropping the retry loses the job: the redelivery finds the message
    received and is a duplicate, the retry never resumes, and the job runs with no handler
    until the reaper takes it back, an attempt burnt. In rounds, each committing before the
    next, whichever comes first sees the other's doing: the retry whose try committed is
    resumed, in any order, and every other request for that message is a duplicate; if
    none committed, the first round's claims the job and the later ones are duplicates."""
    rounds: list[list[ClaimRequest]] = []
    seen: dict[uuid.UUID, set[uuid.UUID]] = {}
    for request in requests:
        tokens = seen.setdefault(request.message_id, set())
        if request.lease_token in tokens:
            continue  # the same request again: answered as a duplicate
        if len(tokens) == len(rounds):
            rounds.append([])
        rounds[len(tokens)].append(request)
        tokens.add(request.lease_token)
    return rounds


@dataclass(frozen=True, slots=True)
class OutboxScope:
    """What a runner takes from the outbox itself (direct pickup): fresh rows of its
    ``queues`` and of ``kinds`` (the job types it runs there)."""

    queues: tuple[str, ...]
    kinds: tuple[JobType[Any], ...]

    @classmethod
    def of(cls, registry: Registry, queues: Sequence[str]) -> OutboxScope:
        consumed = tuple(sorted(set(queues)))
        kinds = tuple(sorted((k for k in registry if k.queue in consumed), key=lambda k: k.name))
        return cls(consumed, kinds)

    def by_name(self) -> dict[str, JobType[Any]]:
        return {kind.name: kind for kind in self.kinds}

    def type_leases(self) -> tuple[list[str], list[float]]:
        """The types' names and their leases, in seconds, as the statements take them: one
        float8 array (a type declared with `lease=2` is an int, and psycopg dumps no list
        of ints and floats mixed)."""
        return [kind.name for kind in self.kinds], [float(kind.lease) for kind in self.kinds]


async def claim_from_outbox(
    conn: AsyncConn,
    scope: OutboxScope,
    lease_tokens: Sequence[uuid.UUID],
    *,
    window: float,
    exchange: str,
    worker_id: str,
) -> list[ClaimAnswer]:
    """Take up to ``len(lease_tokens)`` outbox rows of ``scope`` that became due in the last
    ``window`` seconds and no relay holds, and claim their messages, in one statement that
    commits alone (``job_store.claim_from_outbox``): an answer per row taken (none for a
    row a relay holds, or whose job has a concurrency or rate key: the relays' to take)."""
    types, leases = scope.type_leases()
    params: JobClaimFromOutboxParams = {
        "consumer": JOBS_CONSUMER,
        "exchange": exchange,
        "worker_id": worker_id,
        "queues": list(scope.queues),
        "types": types,
        "leases": leases,
        "lease_tokens": list(lease_tokens),
        "limit": len(lease_tokens),
        "window": window,
    }
    rows = await job_store.claim_from_outbox(conn, params)
    kinds = scope.by_name()
    return [_answer(row, kinds[row["message_type"]]) for row in rows]


async def resume_tokens(
    conn: AsyncConn, scope: OutboxScope, lease_tokens: Sequence[uuid.UUID]
) -> list[ClaimedJob]:
    """After :func:`claim_from_outbox`'s commit went unanswered: the jobs it claimed (those
    running under its lease tokens), their leases renewed; none if it did not commit."""
    types, leases = scope.type_leases()
    rows = await job_store.resume_tokens(
        conn, {"lease_tokens": list(lease_tokens), "types": types, "leases": leases}
    )
    kinds = scope.by_name()
    return [ClaimedJob.from_claim_row(row, kinds[row["message_type"]]) for row in rows]
