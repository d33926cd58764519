"""Statements on ``tenant_quotas`` (operators' per-tenant overrides) and ``tenant_usage``
(what the quotas are checked against), and the enqueue's admission fragment.

The enqueue's admission is part of the enqueue statement (:mod:`jobcore.database.sql.jobs.enqueue`),
so a quota costs no round trip: :func:`admission_ctes` gives its CTEs. ``tenant_usage`` has one
row per tenant; the admission of a tenant with a rate limit or a cap upserts it, which
locks it until the enqueue commits, so such a tenant's enqueues are admitted one at a time
(on any API process) and each sees the count its predecessor left: 50 racing requests at
the cap minus one make exactly one job. The count itself is the row's plus the tenant's
``tenant_usage_deltas``: triggers on ``jobs`` append, per statement and tenant, the jobs
it added less those it ended (migrations 0023, 0027), and the maintenance leader's usage folder
(TENANT_USAGE_FOLD) folds them into the row every few seconds.

An enqueue in an application's own transaction, which may stay open for long, is
admitted by default without that lock (:func:`approximate_admission_ctes`): the row and
the deltas are read as committed, and nothing is written or held but the job's own delta.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from jobcore.database.sql import LIVE_SQL, Query
from jobcore.database.sql.api_keys import usable
from jobcore.kernel.quotas import EPSILON


class QuotaDefaultParams(TypedDict):
    """The deployment's defaults (JOBCORE_QUOTA_*), for tenants without an override."""

    default_rate: float
    default_burst: int
    default_max_unfinished: int
    default_max_long_polls: int


# The effective quotas of the request's tenant, as columns of `limits`.
_LIMITS = """limits AS (
        SELECT t.tenant,
               coalesce(q.enqueue_rate, %(default_rate)s::float8) AS rate,
               coalesce(q.enqueue_burst, %(default_burst)s::int) AS burst,
               coalesce(q.max_unfinished, %(default_max_unfinished)s::bigint) AS max_unfinished
        FROM (SELECT %(tenant)s::text AS tenant) AS t
        LEFT JOIN jobcore.tenant_quotas AS q ON q.tenant = t.tenant
    )"""

# The same, empty when the request's API key (``key_id``; NULL: a caller with no key, such
# as the scheduler) is no longer usable: the API remembers verified keys for a few seconds
# (services.api.auth), and this probe of the key's primary key makes a revocation or an
# expiry stop its enqueues at once all the same. With no `limits` row nothing is admitted,
# locked or written, and the statement answers no row.
_KEYED_LIMITS = _LIMITS.replace(
    "LEFT JOIN jobcore.tenant_quotas AS q ON q.tenant = t.tenant",
    f"""LEFT JOIN jobcore.tenant_quotas AS q ON q.tenant = t.tenant
        WHERE %(key_id)s::uuid IS NULL OR EXISTS (
            SELECT 1 FROM jobcore.api_keys AS k
            WHERE k.id = %(key_id)s::uuid AND k.tenant = t.tenant AND {usable("k")}
        )""",
)
assert _KEYED_LIMITS != _LIMITS


def admission_ctes() -> str:
    """``existing`` (the job that already holds the idempotency key, or the live job that
    holds the unique key: a replay or a duplicate is not new work, so it is never refused
    and uses no quota), ``limits``, ``admit``: the tenant's usage row after this request's
    turn, whose ``last_refusal`` is NULL when the job may be inserted, and ``go``: one row
    (the tenant) when the job may be inserted.

    A tenant with neither a rate limit nor a cap has nothing to check: its usage row is
    not touched (``admit`` is empty), so its enqueues write no row version there (behind
    a pinned xmin horizon none could be pruned) and are not serialised.

    The rate limit is GCRA (:class:`jobcore.kernel.quotas.RateLimit` is the same rule in Python):
    admitted when max(tat, now) + 1/rate is at most burst/rate ahead of now. A refused
    request changes only the refusal columns. ON CONFLICT ... DO UPDATE reads the row as
    last committed (after waiting for its lock), never an older snapshot; and the time it
    compares with is the clock's once the lock is held, not the statement's start
    (``now()``): a request that queued for the lock behind a burst of its tenant's would
    otherwise look early by its wait, and be refused for it.

    The count of unfinished jobs is the row's plus the tenant's ``tenant_usage_deltas``
    (per statement, the jobs added less those ended, not yet folded in: migration 0027). It is
    compared with the cap by ``jobcore_tenant_at_cap``, once the row is locked, with a
    snapshot of its own: this statement's snapshot, taken before it waited, would miss the
    +1 of the admission it queued behind. The INSERT's own values count only for a tenant
    with no row yet (tenant_usage rows are never deleted): for the others DO UPDATE
    decides, so the INSERT's check runs only when the statement saw no row, and the
    deltas are summed once per enqueue.
    """
    return f"""existing AS (
        SELECT id FROM jobcore.jobs
        WHERE tenant = %(tenant)s::text
          AND type = %(type)s AND idempotency_key = %(idempotency_key)s
        UNION ALL
        SELECT id FROM jobcore.jobs
        WHERE tenant = %(tenant)s::text AND type = %(type)s
          AND unique_key = %(unique_key)s AND status IN {LIVE_SQL}
    ), {_KEYED_LIMITS}, admit AS (
        INSERT INTO jobcore.tenant_usage AS u (tenant, rate_tat, last_refusal)
        SELECT tenant, CASE WHEN NOT c THEN clock_timestamp()
                            + make_interval(secs => 1.0 / nullif(rate, 0)) END,
               CASE WHEN c THEN 'max_unfinished' END
        FROM (
            SELECT *, CASE WHEN EXISTS (SELECT 1 FROM jobcore.tenant_usage
                                        WHERE tenant = limits.tenant)
                           THEN false
                           ELSE jobcore.jobcore_tenant_at_cap(tenant, max_unfinished) END AS c
            FROM limits
        ) AS l
        WHERE NOT EXISTS (SELECT 1 FROM existing) AND (rate > 0 OR max_unfinished > 0)
        ON CONFLICT (tenant) DO UPDATE SET (rate_tat, last_refusal, last_refused_at) = (
            SELECT CASE WHEN v.refusal IS NULL THEN v.next_tat ELSE u.rate_tat END,
                   v.refusal,
                   CASE WHEN v.refusal IS NULL THEN u.last_refused_at ELSE v.at END
            FROM (
                SELECT CASE
                           WHEN jobcore.jobcore_tenant_at_cap(u.tenant, l.max_unfinished)
                               THEN 'max_unfinished'
                           WHEN n.next_tat
                                > c.at + make_interval(secs => l.burst / nullif(l.rate, 0))
                               THEN 'enqueue_rate'
                       END AS refusal,
                       n.next_tat, c.at
                FROM limits AS l,
                     LATERAL (SELECT clock_timestamp() AS at) AS c,
                     LATERAL (
                         SELECT greatest(u.rate_tat, c.at)
                                + make_interval(secs => 1.0 / nullif(l.rate, 0)) AS next_tat
                     ) AS n
            ) AS v
        )
        RETURNING u.rate_tat, u.last_refusal
    ), go AS (
        SELECT limits.tenant FROM limits LEFT JOIN admit ON true
        WHERE admit.last_refusal IS NULL AND NOT EXISTS (SELECT 1 FROM existing)
    )"""


def approximate_admission_ctes() -> str:
    """The CTEs of :func:`admission_ctes` (``existing``, ``limits``, ``admit``, ``go``)
    for :attr:`jobcore.kernel.quotas.Admission.APPROXIMATE`: the quotas checked against the
    tenant's usage as this statement's snapshot shows it (committed, and the
    transaction's own jobs), with no lock and no write of the usage row. ``admit`` has
    the refusal (NULL: admitted) and the bucket's tat as read; the job's own count is the
    delta its insert appends. What another open transaction holds uncommitted is not
    seen: admissions in transactions open together can pass the cap by that much.
    """
    return f"""existing AS (
        SELECT id FROM jobcore.jobs
        WHERE tenant = %(tenant)s::text
          AND type = %(type)s AND idempotency_key = %(idempotency_key)s
        UNION ALL
        SELECT id FROM jobcore.jobs
        WHERE tenant = %(tenant)s::text AND type = %(type)s
          AND unique_key = %(unique_key)s AND status IN {LIVE_SQL}
    ), {_KEYED_LIMITS}, usage AS (
        -- The deltas count for a tenant the usage folder has not given a row yet.
        SELECT (SELECT u.rate_tat FROM jobcore.tenant_usage AS u WHERE u.tenant = limits.tenant)
                   AS rate_tat,
               CASE WHEN limits.max_unfinished > 0 THEN
                   coalesce((SELECT u.unfinished FROM jobcore.tenant_usage AS u
                             WHERE u.tenant = limits.tenant), 0)
                   + (SELECT coalesce(sum(d.delta), 0) FROM jobcore.tenant_usage_deltas AS d
                      WHERE d.tenant = limits.tenant)
               END AS unfinished
        FROM limits
    ), admit AS (
        SELECT usage.rate_tat, {PREVIEW_REFUSAL} AS last_refusal
        FROM limits LEFT JOIN usage ON true
        WHERE NOT EXISTS (SELECT 1 FROM existing)
          AND (limits.rate > 0 OR limits.max_unfinished > 0)
    ), go AS (
        SELECT limits.tenant FROM limits LEFT JOIN admit ON true
        WHERE admit.last_refusal IS NULL AND NOT EXISTS (SELECT 1 FROM existing)
    )"""


def admission_preview_ctes() -> str:
    """``limits`` and ``usage`` (the tenant's rate limit's tat and unfinished jobs, read
    without a lock; no row for a tenant that never enqueued), for a read of what
    :func:`admission_ctes` would decide now. With an API key (``key_id``) that is no
    longer usable, ``limits`` is empty."""
    return f"""{_KEYED_LIMITS}, usage AS (
        SELECT u.rate_tat,
               u.unfinished + (
                   SELECT coalesce(sum(d.delta), 0) FROM jobcore.tenant_usage_deltas AS d
                   WHERE d.tenant = u.tenant
               ) AS unfinished
        FROM jobcore.tenant_usage AS u WHERE u.tenant = %(tenant)s::text
    )"""


# The refusal admission_ctes would make, from admission_preview_ctes' `limits` and `usage`
# at the clock's time `at` (NULL: admitted).
PREVIEW_REFUSAL = """CASE
        WHEN limits.max_unfinished > 0 AND coalesce(usage.unfinished, 0) >= limits.max_unfinished
            THEN 'max_unfinished'
        WHEN limits.rate > 0
             AND greatest(usage.rate_tat, clock_timestamp())
                 + make_interval(secs => 1.0 / limits.rate)
                 > clock_timestamp() + make_interval(secs => limits.burst / limits.rate)
            THEN 'enqueue_rate'
    END"""


# What the enqueue statement adds to its answer: the refusal (NULL: admitted, or a
# replay), and the rate limit's state for the RateLimit headers (a replay, which does not
# touch the usage row, reports the row as it was; a tenant with no rate limit has no
# headers, and its enqueues do not read the row for them).
ADMISSION_COLUMNS = """
    admit.last_refusal AS refusal,
    coalesce(admit.rate_tat, CASE WHEN limits.rate > 0 THEN (
        SELECT rate_tat FROM jobcore.tenant_usage WHERE tenant = limits.tenant) END) AS rate_tat,
    limits.rate, limits.burst, limits.max_unfinished, clock_timestamp() AS now"""


class TenantUsageLockParams(TypedDict):
    tenant: str


# A batch enqueue (jobcore.usecases.enqueue.write_many) takes its tenant's usage row first, in a
# statement of its own: DO UPDATE locks the row as last committed (a row another admission inserted
# after this statement's snapshot too) even when its WHERE lets it update nothing, so no
# row version is written for the lock; the batch statement that follows reads the
# row and the deltas with a snapshot taken under the lock, and admits as many items as
# the quotas leave room for (batch_admission_ctes), with no need for the fresh snapshot
# the one-statement admission above takes in jobcore_tenant_at_cap.
TENANT_USAGE_LOCK = Query[TenantUsageLockParams](
    "tenant_usage_lock",
    "Lock a tenant's usage row (creating it) until the transaction ends.",
    """
    INSERT INTO jobcore.tenant_usage AS u (tenant) VALUES (%(tenant)s)
    ON CONFLICT (tenant) DO UPDATE SET tenant = excluded.tenant WHERE false
    """,
)


def batch_admission_ctes(*, all_or_nothing: bool = False) -> str:
    """For a batch whose tenant's usage row the transaction holds (TENANT_USAGE_LOCK):
    ``limits``, and ``room``: how many of the batch's ``wanted`` new items are admitted
    (``admitted``, the first ones in the batch's order) and, when not all, which quota
    stopped the rest (``refusal``); and ``charged``, the usage row after the admitted
    items' turn (the rate limit's tat moved by one interval per item, the refusal noted).

    The same rules as :func:`admission_ctes`, for k items at once: GCRA admits k when
    max(tat, now) + k/rate is at most burst/rate ahead of now; the cap admits up to
    max_unfinished minus the unfinished jobs (the row's count plus its deltas).
    Needs ``wanted`` (a CTE with one row and its column ``n``). ``all_or_nothing``: none
    is admitted (nor charged) unless all are, for a workflow's jobs. With an API key
    (``key_id``) that is no longer usable, ``limits`` is empty and so is everything that
    follows: nothing is admitted or charged.
    """
    return f"""{_KEYED_LIMITS}, usage AS (
        SELECT u.rate_tat, u.last_refusal, clock_timestamp() AS at,
               CASE WHEN l.max_unfinished > 0 THEN jobcore.jobcore_tenant_unfinished(u.tenant) END
                   AS unfinished
        FROM jobcore.tenant_usage AS u, limits AS l WHERE u.tenant = %(tenant)s::text
    ), capacity AS (
        SELECT wanted.n AS wanted,
               CASE WHEN l.max_unfinished > 0
                    THEN greatest(l.max_unfinished - usage.unfinished, 0) END AS cap_room,
               CASE WHEN l.rate > 0
                    THEN greatest(floor(
                        (extract(epoch FROM usage.at - greatest(usage.rate_tat, usage.at))::float8
                         + l.burst / l.rate + {EPSILON}) * l.rate), 0) END AS rate_room
        FROM wanted, limits AS l, usage
    ), room AS (
        SELECT {
        "CASE WHEN least(wanted, cap_room, rate_room) < wanted THEN 0 ELSE wanted END"
        if all_or_nothing
        else "least(wanted, cap_room, rate_room)"
    }::int AS admitted,
               CASE WHEN coalesce(cap_room, wanted) < wanted
                         AND coalesce(cap_room, wanted) <= coalesce(rate_room, wanted)
                        THEN 'max_unfinished'
                    WHEN coalesce(rate_room, wanted) < wanted THEN 'enqueue_rate'
               END AS refusal
        FROM capacity
    ), charged AS (
        UPDATE jobcore.tenant_usage AS u
        SET rate_tat = CASE WHEN l.rate > 0 AND room.admitted > 0
                            THEN greatest(u.rate_tat, usage.at)
                                 + make_interval(secs => room.admitted / l.rate)
                            ELSE u.rate_tat END,
            last_refusal = room.refusal,
            last_refused_at = CASE WHEN room.refusal IS NULL THEN u.last_refused_at
                                   ELSE usage.at END
        FROM room, limits AS l, usage
        WHERE u.tenant = %(tenant)s::text
          AND ((l.rate > 0 AND room.admitted > 0) OR room.refusal IS NOT NULL
               OR usage.last_refusal IS NOT NULL)
        RETURNING u.rate_tat
    )"""


class TenantQuotaGetParams(QuotaDefaultParams):
    tenant: str


TENANT_QUOTA_GET = Query[TenantQuotaGetParams](
    "tenant_quota_get",
    "A tenant's effective quotas (override or default, and which) and its usage.",
    """
    SELECT t.tenant,
           coalesce(q.enqueue_rate, %(default_rate)s::float8) AS enqueue_rate,
           coalesce(q.enqueue_burst, %(default_burst)s::int) AS enqueue_burst,
           coalesce(q.max_unfinished, %(default_max_unfinished)s::bigint) AS max_unfinished,
           coalesce(q.max_long_polls, %(default_max_long_polls)s::int) AS max_long_polls,
           q.enqueue_rate IS NOT NULL AS enqueue_rate_set,
           q.enqueue_burst IS NOT NULL AS enqueue_burst_set,
           q.max_unfinished IS NOT NULL AS max_unfinished_set,
           q.max_long_polls IS NOT NULL AS max_long_polls_set,
           q.updated_at,
           coalesce(u.unfinished, 0) + (
               SELECT coalesce(sum(delta), 0) FROM jobcore.tenant_usage_deltas
               WHERE tenant = t.tenant
           ) AS unfinished, u.rate_tat, u.last_refusal,
           u.last_refused_at, now() AS now
    FROM (SELECT %(tenant)s::text AS tenant) AS t
    LEFT JOIN jobcore.tenant_quotas AS q ON q.tenant = t.tenant
    LEFT JOIN jobcore.tenant_usage AS u ON u.tenant = t.tenant
    """,
)


class TenantMaxLongPollsParams(TypedDict):
    default_max_long_polls: int
    tenant: str


TENANT_MAX_LONG_POLLS = Query[TenantMaxLongPollsParams](
    "tenant_max_long_polls",
    "How many long-polls the tenant may park at once on one API process.",
    """
    SELECT coalesce(
        (SELECT max_long_polls FROM jobcore.tenant_quotas WHERE tenant = %(tenant)s),
        %(default_max_long_polls)s::int
    ) AS max_long_polls
    """,
)


class TenantQuotaSetParams(TypedDict):
    tenant: str
    # For each quota: whether this call sets it, and the value (None: back to the default).
    set_enqueue_rate: bool
    enqueue_rate: float | None
    set_enqueue_burst: bool
    enqueue_burst: int | None
    set_max_unfinished: bool
    max_unfinished: int | None
    set_max_long_polls: bool
    max_long_polls: int | None


# Quotas the call does not name keep their override. A row with every override back to
# the default stays (it is harmless, and `tenants list` shows when it changed).
TENANT_QUOTA_SET = Query[TenantQuotaSetParams](
    "tenant_quota_set",
    "Set some of a tenant's quota overrides, keeping the others.",
    """
    INSERT INTO jobcore.tenant_quotas AS q (
        tenant, enqueue_rate, enqueue_burst, max_unfinished, max_long_polls
    )
    VALUES (%(tenant)s, %(enqueue_rate)s, %(enqueue_burst)s, %(max_unfinished)s,
            %(max_long_polls)s)
    ON CONFLICT (tenant) DO UPDATE SET
        enqueue_rate = CASE WHEN %(set_enqueue_rate)s THEN excluded.enqueue_rate
                            ELSE q.enqueue_rate END,
        enqueue_burst = CASE WHEN %(set_enqueue_burst)s THEN excluded.enqueue_burst
                             ELSE q.enqueue_burst END,
        max_unfinished = CASE WHEN %(set_max_unfinished)s THEN excluded.max_unfinished
                              ELSE q.max_unfinished END,
        max_long_polls = CASE WHEN %(set_max_long_polls)s THEN excluded.max_long_polls
                              ELSE q.max_long_polls END,
        updated_at = now()
    RETURNING tenant
    """,
)


class TenantQuotaRow(TypedDict):
    tenant: str
    enqueue_rate: float | None
    enqueue_burst: int | None
    max_unfinished: int | None
    max_long_polls: int | None
    updated_at: datetime
    unfinished: int


TENANT_QUOTA_LIST = Query[QuotaDefaultParams](
    "tenant_quota_list",
    "Every tenant with a job or an override: its overrides (NULL: the default) and usage.",
    """
    SELECT coalesce(q.tenant, u.tenant) AS tenant,
           q.enqueue_rate, q.enqueue_burst, q.max_unfinished, q.max_long_polls,
           q.updated_at,
           coalesce(u.unfinished, 0) + (
               SELECT coalesce(sum(delta), 0) FROM jobcore.tenant_usage_deltas
               WHERE tenant = coalesce(q.tenant, u.tenant)
           ) AS unfinished,
           coalesce(q.enqueue_rate, %(default_rate)s::float8) AS effective_enqueue_rate,
           coalesce(q.max_unfinished, %(default_max_unfinished)s::bigint)
               AS effective_max_unfinished,
           %(default_burst)s::int AS default_burst,
           %(default_max_long_polls)s::int AS default_max_long_polls
    FROM jobcore.tenant_quotas AS q
    FULL JOIN jobcore.tenant_usage AS u ON u.tenant = q.tenant
    ORDER BY 1
    """,
)


class TenantUsageFoldParams(TypedDict):
    limit: int
    # Where the round is: the batch takes the deltas after this primary key.
    after_tenant: str
    after_id: int


# The deltas a job added or ended appended (migration 0023) are folded into their
# tenants' rows by the maintenance leader (jobcore.maintenance.usage_folder), in primary
# key order from where the previous batch stopped (an index range, never a scan and sort
# of the table; none left is one index probe): one row version per tenant per batch,
# however many jobs. Deleting them and adding their sum commit together, so a reader
# (jobcore_tenant_unfinished, a snapshot) sees each delta either in the row or in the
# table, never both or neither.
#
# A tenant's row can be held for as long as an application transaction lasts (an
# in-transaction enqueue with the exact admission, of a tenant with a quota, holds it until
# its commit; the default, approximate admission only reads it): the batch
# locks the rows it folds into with SKIP LOCKED, and leaves a busy tenant's deltas, all
# of them, for a later round. A delta itself is never skipped: a -1 folded while its +1
# was skipped would, clamped at zero, leave the count too high for ever. A tenant with
# no row yet gets one from the batch. The folder bounds what it may still wait for (a
# delta locked by the previous release's admission, a row being inserted) with a
# lock_timeout.
TENANT_USAGE_FOLD = Query[TenantUsageFoldParams](
    "tenant_usage_fold",
    "Fold up to `limit` usage deltas after a key into their tenants' free rows; how many.",
    """
    WITH batch AS MATERIALIZED (
        SELECT tenant, id FROM jobcore.tenant_usage_deltas
        WHERE (tenant, id) > (%(after_tenant)s::text, %(after_id)s::bigint)
        ORDER BY tenant, id LIMIT %(limit)s
    ), last AS (
        SELECT tenant, id FROM batch ORDER BY tenant DESC, id DESC LIMIT 1
    ), held AS (
        SELECT u.tenant FROM jobcore.tenant_usage AS u
        WHERE u.tenant IN (SELECT tenant FROM batch)
        FOR UPDATE SKIP LOCKED
    ), folded AS (
        -- The batch's key range, read again by the primary key (this statement's snapshot
        -- sees the same rows in it): what a join with the batch would read by a scan.
        DELETE FROM jobcore.tenant_usage_deltas AS d
        WHERE (d.tenant, d.id) > (%(after_tenant)s::text, %(after_id)s::bigint)
          AND (d.tenant, d.id) <= ((SELECT tenant FROM last), (SELECT id FROM last))
          AND (d.tenant IN (SELECT tenant FROM held)
               OR NOT EXISTS (SELECT 1 FROM jobcore.tenant_usage AS u WHERE u.tenant = d.tenant))
        RETURNING d.tenant, d.delta
    ), sums AS (
        SELECT tenant, sum(delta)::bigint AS delta FROM folded GROUP BY tenant
    ), rows AS (
        INSERT INTO jobcore.tenant_usage AS u (tenant, unfinished)
        SELECT tenant, greatest(delta, 0) FROM sums ORDER BY tenant
        ON CONFLICT (tenant) DO UPDATE
        SET unfinished = greatest(u.unfinished + (
            SELECT delta FROM sums WHERE sums.tenant = excluded.tenant), 0)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM batch) AS taken, (SELECT count(*) FROM folded) AS deltas,
           (SELECT count(*) FROM rows) AS tenants,
           (SELECT tenant FROM last) AS last_tenant, (SELECT id FROM last) AS last_id
    """,
)
