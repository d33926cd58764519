"""The claim: messages in, one statement per round; inbox rows and leases out.

The inbox row and the lease are written by the one claiming statement
(``JobStore.claim``), so a message seen before (a redelivery, a re-published outbox row)
has no effect, and a job runs under one lease at a time. A claim whose first try committed
unanswered is retried with the same lease token and comes back ``resumed``: the job it
claimed runs, rather than waiting for the reaper.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from jobcore.db import AsyncConn
from jobcore.execution.job import DUPLICATE, ClaimAnswer, ClaimRequest, claim_answer
from jobcore.store import JOBS_CONSUMER, JobClaimManyParams, job_store


async def claim_batch(
    conn: AsyncConn, requests: Sequence[ClaimRequest], *, exchange: str, worker_id: str
) -> list[ClaimAnswer]:
    """The batch's claims, one statement per round of distinct message ids (one round
    unless a message came twice); a request repeated (its message and token) is a
    duplicate the 2nd time."""
    answered_by: dict[tuple[uuid.UUID, uuid.UUID], ClaimAnswer] = {}
    for round_ in claim_rounds(requests):
        params: JobClaimManyParams = {
            "consumer": JOBS_CONSUMER,
            "exchange": exchange,
            "worker_id": worker_id,
            "message_ids": [r.message_id for r in round_],
            "job_ids": [r.job_id for r in round_],
            "types": [r.job_type.name for r in round_],
            "attempts": [r.attempt for r in round_],
            "lease_tokens": [r.lease_token for r in round_],
            "leases": [r.lease_seconds for r in round_],
        }
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
            answered_by[r.message_id, r.lease_token] = claim_answer(
                by_message[r.message_id], r.job_type
            )
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
