"""Statements that change ``outbox``: the relay's claim / done / failed cycle and the
operator verbs.

A row is *due* when ``available_at <= now()`` and it is not quarantined; the partial
index ``outbox_due_idx (available_at, id) WHERE quarantined_at IS NULL`` serves the FIFO
claim, the next-due lookup and the oldest-due age, and ``outbox_fair_due_idx (routing_key,
tenant, priority, available_at, id)`` with the same predicate serves the fair claim, which
finds its lanes with ``outbox_ready_lanes_due_idx`` and ``outbox_later_due_idx``. The
relay's claims read only the rows that became due since its low-water mark (``window``
seconds back: OUTBOX_CLAIM_FEW), so the entries a pinned xmin horizon keeps for rows
already published cost them nothing. Outbox rows written with a job (enqueue, retries,
the reaper, completion webhooks) are written by the statements on ``jobs``; each carries
its job's tenant.
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from jobcore.database.sql import TERMINAL_SQL, NoParams, Query
from jobcore.database.sql.flow_pauses import paused
from jobcore.database.sql.job_events import EVENTS_ON, short_error
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.jobevents import JobEventKind

# Enqueue (and every writer of outbox rows) NOTIFYs this channel in its transaction.
OUTBOX_LISTEN = Query[NoParams](
    "outbox_listen", "Receive the outbox NOTIFYs on this connection.", f"LISTEN {OUTBOX_CHANNEL}"
)


# PostgreSQL serialises the commits of every transaction that NOTIFYs (a lock on the
# database held until the commit is flushed), so an enqueue that NOTIFYs in its own
# transaction waits for every other one's WAL flush, and a tenant's usage row stays locked
# meanwhile. Sent after the rows committed instead, in a transaction of its own that does
# not wait for its flush: the lock is held for microseconds, and a NOTIFY lost in a crash
# only leaves the rows to the relays' poll.
OUTBOX_WAKE = Query[NoParams](
    "outbox_wake",
    "Wake the relays for outbox rows already committed, without waiting for a WAL flush.",
    f"""
    SELECT set_config('synchronous_commit', 'off', true) AS synchronous_commit,
           pg_notify('{OUTBOX_CHANNEL}', '') IS NULL AS notified
    """,
)


OUTBOX_UNLISTEN = Query[NoParams](
    "outbox_unlisten", "Stop receiving them before the connection is reused.", "UNLISTEN *"
)


# One relay at a time answers the outbox NOTIFYs: the one whose LISTEN connection holds
# this session lock. A relay that does not hold it polls (JOBCORE_RELAY_POLL_INTERVAL) and claims
# whatever is due then, so a backlog is still drained by every replica; a trickle is
# relayed by one, in batches instead of one empty claim per replica per NOTIFY. The
# lock is the connection's: it goes when the holder's connection does (a relay killed,
# its database connection cut), and the next relay to try takes it. The LISTEN
# connection is always a direct one (never through PgBouncer), so a session lock holds.
OUTBOX_WAKE_LOCK = "jobcore.outbox.wake"

OUTBOX_TAKE_WAKE_LEASE = Query[NoParams](
    "outbox_take_wake_lease",
    "Whether this connection now holds the lock of the relay that answers NOTIFYs.",
    f"SELECT pg_try_advisory_lock(hashtext('{OUTBOX_WAKE_LOCK}')) AS held",
)


OUTBOX_DROP_WAKE_LEASE = Query[NoParams](
    "outbox_drop_wake_lease",
    "Release that lock before the connection goes back to a pool.",
    f"SELECT pg_advisory_unlock(hashtext('{OUTBOX_WAKE_LOCK}')) AS released",
)


OUTBOX_LISTENER_PING = Query[NoParams](
    "outbox_listener_ping", "A round trip, to notice a connection that died silently.", "SELECT 1"
)


class OutboxClaimDueParams(TypedDict):
    limit: int
    window: float


# The relay holds these row locks while it publishes and waits for the confirms; other
# replicas skip the locked rows instead of waiting, so any number of them can run.
# Bounded below as OUTBOX_CLAIM_FEW (`window`: the seconds back to the relay's low-water
# mark, or every due row at its unbounded look), so that it does not start at the head of
# outbox_due_idx, where a pinned horizon keeps the entries of every row published since.
OUTBOX_CLAIM_DUE = Query[OutboxClaimDueParams](
    "outbox_claim_due",
    "Lock up to `limit` unquarantined rows of queues and types not paused that became due in "
    "the last `window` seconds, oldest first, skipping rows another relay holds.",
    f"""
    SELECT id, message_id::text AS message_id, exchange, routing_key, message_type,
           headers, body, attempts, now() AS taken_at
    FROM jobcore.outbox
    WHERE available_at <= now() AND quarantined_at IS NULL
      AND available_at >= now() - make_interval(secs => %(window)s)
      AND NOT {paused("outbox.routing_key", "outbox.message_type")}
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
    """,
    generic_plan=True,
)


class OutboxClaimFewParams(TypedDict):
    limit: int
    window: float


# The fair claim's lanes, shares and turns matter only when more is due than a batch
# takes: when every due row fits, the fair claim takes them all, as FIFO does. This
# statement looks at the oldest `limit` + 1 due rows (paused ones too: it does not sort
# them out), and only if there are at most `limit` locks them, skipping the paused ones
# and rows another relay holds; `fits` (on the one row it answers when it locked none)
# says whether they fitted, else the relay runs the fair claim. An idle relay woken for a
# few rows pays a probe of outbox_due_idx instead of the lanes' skip scan and window
# functions. The relay asks it only while the last claim left nothing due and every
# routing key's budget takes a whole batch (services/relay/relay.py).
#
# It looks only at rows that became due in the last `window` seconds. The head of
# outbox_due_idx is where the relays delete: entries of published rows stay there until
# VACUUM removes them, and a transaction that keeps the xmin horizon pinned (a long
# report, a forgotten session) keeps VACUUM from removing any, so a probe from the start
# of the index visited every row published since the pin began (a heap fetch each, to
# learn that it is dead), and grew with the pin's length. Bounded below, it reads the
# entries of `window` seconds of traffic at most. The relay passes the seconds back to its
# low-water mark (OUTBOX_OLDEST_WRITER, OUTBOX_OLDEST_LIVE: no live row is older), and
# an unbounded window every minute or so, the safety net for a writer that breaks the
# mark's rule (services/relay/low_water.py).
OUTBOX_CLAIM_FEW = Query[OutboxClaimFewParams](
    "outbox_claim_few",
    "Lock every unquarantined row of queues and types not paused that became due in the last "
    "`window` seconds, oldest first, if at most `limit` are, skipping rows another relay "
    "holds; `fits` says whether they were that few.",
    f"""
    WITH due AS (
        SELECT id FROM jobcore.outbox
        WHERE available_at <= now() AND quarantined_at IS NULL
          AND available_at >= now() - make_interval(secs => %(window)s)
        ORDER BY available_at, id
        LIMIT %(limit)s + 1
    ), verdict AS (
        SELECT count(*) <= %(limit)s AS fits FROM due
    ), locked AS (
        SELECT o.id, o.message_id::text AS message_id, o.exchange, o.routing_key,
               o.message_type, o.headers, o.body, o.attempts, o.tenant, o.priority,
               o.available_at
        FROM jobcore.outbox AS o
        WHERE o.id IN (SELECT id FROM due) AND (SELECT fits FROM verdict)
          AND o.available_at <= now() AND o.quarantined_at IS NULL
          AND NOT {paused("o.routing_key", "o.message_type")}
        FOR UPDATE SKIP LOCKED
    )
    SELECT verdict.fits, locked.id, locked.message_id, locked.exchange, locked.routing_key,
           locked.message_type, locked.headers, locked.body, locked.attempts, locked.tenant,
           locked.priority, false AS more_due, now() AS taken_at
    FROM verdict LEFT JOIN locked ON true
    ORDER BY locked.available_at, locked.id
    """,
    generic_plan=True,
)


# The relay's low-water mark (services/relay/low_water.py) is the oldest key at which a
# live due row may be found now or later. A row enters outbox_due_idx when its writer
# commits, at the key its writer gave it, which is never earlier than the start of the
# writer's transaction (enqueue stamps statement_timestamp(), every other writer now()
# or later). So a row that a look did not see (its writer had not committed) has a key no
# older than the start of a transaction that held or awaited a lock to write the outbox
# then, or, if its writer took that lock after the look, no older than the start of the
# statement that wrote it. The first statement reads the oldest such transaction's start
# from pg_locks: the pinned transaction of a long report or a forgotten session holds no
# lock on the outbox, and so does not hold the mark back. A start this role may not read
# (another role's session without pg_read_all_stats, a prepared transaction) makes
# `unknown` true, and the mark does not advance.
OUTBOX_OLDEST_WRITER = Query[NoParams](
    "outbox_oldest_writer",
    "How many seconds ago the oldest other transaction that holds or awaits a lock to write "
    "outbox rows began (NULL: none), and whether some such transaction's start is unknown.",
    """
    SELECT extract(epoch FROM now() - min(a.xact_start))::float8 AS seconds,
           coalesce(bool_or(a.xact_start IS NULL), false) AS unknown
    FROM pg_locks AS l
    LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
    WHERE l.locktype = 'relation'
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      -- The schema as a literal of its own, which the gateway rewrites for another one.
      AND l.relation = to_regclass('jobcore' || '.outbox')
      AND l.mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock',
                     'AccessExclusiveLock')
      AND l.pid IS DISTINCT FROM pg_backend_pid()
    """,
)


class OutboxOldestLiveParams(TypedDict):
    window: float


# The second statement of a look, with a snapshot taken after the first read pg_locks: a
# writer the first did not see had committed by then, or writes from now on. A plain read,
# so rows another relay holds count (it may roll back). Paused rows count too: while a
# paused row waits, the mark stays at it. Bounded below by the last mark, it reads the
# dead entries since that mark and stops at the first live one.
OUTBOX_OLDEST_LIVE = Query[OutboxOldestLiveParams](
    "outbox_oldest_live",
    "How many seconds ago the oldest unquarantined row that became due in the last `window` "
    "seconds became due (NULL: none), whoever holds it.",
    """
    SELECT extract(epoch FROM now() - min(available_at))::float8 AS seconds
    FROM jobcore.outbox
    WHERE available_at <= now() AND quarantined_at IS NULL
      AND available_at >= now() - make_interval(secs => %(window)s)
    """,
    generic_plan=True,
)


class OutboxClaimFairParams(TypedDict):
    budgets: list[int]
    limit: int
    other_budget: int
    priorities: list[int]
    routing_keys: list[str]
    weights: list[int]
    window: float


# A *lane* is a (routing key, tenant, priority) triple. Each routing key has a budget (the
# room in its broker queue: `routing_keys` and `budgets` are parallel arrays,
# `other_budget` is for a routing key they do not name), shared between its lanes with
# due rows in proportion to their priority's weight (`priorities` and `weights`, parallel
# arrays: jobcore.kernel.priorities.WEIGHTS): weighted round-robin, a lane's k-th row taking its
# turn at k / weight, and the batch is published in turn order. So a quiet tenant's new
# message is among the first the broker queues instead of behind another tenant's
# backlog, a high job goes before the low backlog of its own tenant too, and a low lane
# still gets its weight's share of every batch (never starved). The rows of a paused
# queue are left alone (no lane), and those of a paused type are skipped in their lane.
#
# Only lanes with due rows share the budget (one lane alone takes all of it), and a lane
# whose rows are all for later costs a claim nothing: 10,000 tenants with a delayed job
# each used to leave a 50,000-row backlog one row per claim, at 60,000 buffers a claim.
# A row is "ready" if it was due when written (available_at <= created_at: nearly every
# enqueue), "later" otherwise (run_at, retries, gate releases, failed publishes). The
# lanes are those of ready rows, a skip scan of outbox_ready_lanes_due_idx (one probe per
# lane, however many rows it holds; every row there is due), and those of the oldest due
# later rows, as many as `limit` (a range of outbox_later_due_idx that stops at the first
# row not yet due). So between later rows, fairness covers the first `limit` due ones:
# a lane whose only due rows are later than those waits for its turn in that window.
#
# Every range starts at the relay's low-water mark (`window` seconds back, as
# OUTBOX_CLAIM_FEW; every due row at the relay's unbounded look, about once a minute, the
# safety net for a row below the mark). The relays delete the rows they publish, and a
# transaction that pins the xmin horizon keeps VACUUM from removing their index entries,
# so a range from the start of a lane (or of outbox_later_due_idx) visited every row of it
# published since the pin began, a heap fetch each. The skip scan walks its index
# backwards, a lane's newest row first: in a lane with live rows that is one of them,
# whatever lies dead behind it. A lane with no row at or past the mark (every row
# published) is stepped over by its entries' keys, in the index, with no heap fetch: it
# still costs an index page per hundred or so of its dead rows (docs/bench/measurements.md,
# "A pinned horizon").
#
# Each lane's rows come from a range scan of outbox_fair_due_idx, locked there with
# SKIP LOCKED, so another relay (or another lane of this one) takes the next rows instead
# of none. A lane locks at most ceil(budget × weight / lanes' weights) rows: a batch locks
# at most lanes - 1 rows more than it publishes (they wait for the next claim), and a lane
# with fewer due rows leaves its share unused for this batch (the relay claims again).
# PostgreSQL refuses a window function next to FOR UPDATE, so a row's turn in its lane is
# counted outside the locking subquery. `more_due` (on every row) says whether rows may
# be left due: a lane locked its whole share, locked rows lost their slot to the
# budget, or the window of later rows was full. Without it, every due row of the
# snapshot was claimed (or is another claim's, locked), and the relay need not run one
# more claim to find nothing; rows committed since come with their NOTIFY. It is cheap
# even over a large backlog (docs/bench/measurements.md, "The outbox's indexes").
#
# The BETWEEN restates the tenant equality on purpose. With statistics that see one
# dominant tenant (the very case this serves), `tenant = $lane` looks unselective, and
# PostgreSQL scanned outbox_due_idx oldest first, filtering on the tenant: a small
# tenant's lane then read the whole backlog before its rows, and that tenant waited for
# seconds (docs/bench/measurements.md, "The outbox's indexes"). The redundant range makes
# that path look as costly as it is; outbox_fair_due_idx answers it with an index range
# either way.
OUTBOX_CLAIM_FAIR = Query[OutboxClaimFairParams](
    "outbox_claim_fair",
    "Lock rows that became due in the last `window` seconds within each routing key's budget, "
    "shared by priority weight between the (tenant, priority) lanes that have such rows, "
    "leaving paused queues and types alone and skipping rows another relay holds.",
    """
    WITH RECURSIVE ready_lanes AS (
        (SELECT routing_key, tenant, priority FROM jobcore.outbox
         WHERE quarantined_at IS NULL AND available_at <= created_at
           AND available_at >= now() - make_interval(secs => %(window)s)
         ORDER BY routing_key DESC, tenant DESC, priority DESC, available_at DESC LIMIT 1)
        UNION ALL
        SELECT next.routing_key, next.tenant, next.priority
        FROM ready_lanes, LATERAL (
            SELECT routing_key, tenant, priority FROM jobcore.outbox
            WHERE quarantined_at IS NULL AND available_at <= created_at
              AND available_at >= now() - make_interval(secs => %(window)s)
              AND (routing_key, tenant, priority)
                  < (ready_lanes.routing_key, ready_lanes.tenant, ready_lanes.priority)
            ORDER BY routing_key DESC, tenant DESC, priority DESC, available_at DESC LIMIT 1
        ) AS next
    ), later AS (
        SELECT routing_key, tenant, priority FROM jobcore.outbox
        WHERE quarantined_at IS NULL AND available_at > created_at AND available_at <= now()
          AND available_at >= now() - make_interval(secs => %(window)s)
        ORDER BY available_at, id
        LIMIT %(limit)s
    ), lanes AS (
        SELECT routing_key, tenant, priority FROM ready_lanes
        UNION
        SELECT routing_key, tenant, priority FROM later
    ), weighted AS (
        SELECT lanes.*, coalesce(w.weight, 1) AS weight,
               coalesce(b.budget, %(other_budget)s) AS budget
        FROM lanes
        LEFT JOIN unnest(%(priorities)s::int[], %(weights)s::int[]) AS w(priority, weight)
               ON w.priority = lanes.priority
        LEFT JOIN unnest(%(routing_keys)s::text[], %(budgets)s::int[]) AS b(routing_key, budget)
               ON b.routing_key = lanes.routing_key
        WHERE NOT EXISTS (
            SELECT 1 FROM jobcore.flow_pauses AS p
            WHERE p.kind = 'queue' AND p.name = lanes.routing_key
        )
    ), budgeted AS (
        SELECT weighted.*,
               ceil(budget::float8 * weight
                    / sum(weight) OVER (PARTITION BY routing_key))::int AS share
        FROM weighted
    ), locked AS (
        SELECT budgeted.budget, budgeted.weight, budgeted.share, o.*
        FROM budgeted CROSS JOIN LATERAL (
            SELECT o.id, o.message_id, o.exchange, o.routing_key, o.message_type, o.headers,
                   o.body, o.attempts, o.tenant, o.priority, o.available_at
            FROM jobcore.outbox AS o
            WHERE o.routing_key = budgeted.routing_key AND o.tenant = budgeted.tenant
              AND o.tenant BETWEEN budgeted.tenant AND budgeted.tenant
              AND o.priority = budgeted.priority
              AND o.quarantined_at IS NULL AND o.available_at <= now()
              AND o.available_at >= now() - make_interval(secs => %(window)s)
              AND NOT EXISTS (
                  SELECT 1 FROM jobcore.flow_pauses AS p
                  WHERE p.kind = 'type' AND p.name = o.message_type
              )
            ORDER BY o.available_at, o.id
            LIMIT budgeted.share
            FOR UPDATE SKIP LOCKED
        ) AS o
        WHERE budgeted.budget > 0
    ), turns AS (
        SELECT locked.*,
               row_number() OVER (
                   PARTITION BY routing_key, tenant, priority ORDER BY available_at, id
               )::float8 / weight AS turn,
               count(*) OVER (PARTITION BY routing_key, tenant, priority) AS lane_rows
        FROM locked
    ), slots AS (
        SELECT turns.*,
               row_number() OVER (
                   PARTITION BY routing_key ORDER BY turn, priority DESC, available_at, id
               ) AS slot,
               bool_or(lane_rows >= share) OVER () AS lane_full,
               count(*) OVER () AS locked_rows
        FROM turns
    )
    SELECT id, message_id::text AS message_id, exchange, routing_key, message_type,
           headers, body, attempts, tenant, priority, now() AS taken_at,
           lane_full OR locked_rows > count(*) OVER ()
               OR (SELECT count(*) FROM later) >= %(limit)s AS more_due
    FROM slots
    WHERE slot <= budget
    ORDER BY turn, priority DESC, available_at, id
    LIMIT %(limit)s
    """,
    generic_plan=True,
)


def _message_attempt(row: str) -> str:
    """SQL for the attempt a job message's body names (jobcore.kernel.envelope.JobMessage, compact
    JSON), or NULL. Read from the bytes as they are: a body that is not JSON, or not even
    UTF-8, must not fail the relay's statement. The job row cannot say: by the time the
    relay records the confirm, a worker may have claimed the attempt, or finished it."""
    pattern = "'\"attempt\":([0-9]{1,9})'"
    return f"(regexp_match(encode({row}.body, 'escape'), {pattern}))[1]::int"


def _jobs_of(messages: str) -> str:
    """A CTE ``their_jobs``: the jobs of the rows of the CTE ``messages`` (with ``job_id``),
    locked FOR KEY SHARE, so that the pruner (which locks a job FOR UPDATE before it
    deletes it with its events) cannot delete one under an event written for it here."""
    return f"""their_jobs AS (
        SELECT id, type FROM jobcore.jobs
        WHERE id = ANY(ARRAY(SELECT job_id FROM {messages} WHERE job_id IS NOT NULL))
        FOR KEY SHARE
    )"""


def _jobs_seen_or_ended(messages: str) -> str:
    """:func:`_jobs_of` for the hot path: only the jobs that have ended are locked. The
    pruner deletes nothing else, and a job that was live in this statement's snapshot
    would have to end and pass its retention (days by default) before this commits; a
    job message's job is nearly always live, and the lock on its row cost the relay a
    WAL record per row, and a MultiXact whenever a worker was claiming the job meanwhile."""
    ids = f"ARRAY(SELECT job_id FROM {messages} WHERE job_id IS NOT NULL)"
    # One probe per job; the ended ones (nearly never any) are looked up again, locked.
    # With what says whether a job's row keeps the publish (OUTBOX_DELETE_PUBLISHED).
    columns = "id, type, status, published_at, published_by"
    return f"""seen_jobs AS (
        SELECT {columns}, status IN {TERMINAL_SQL} AS ended
        FROM jobcore.jobs WHERE id = ANY({ids})
    ), ended_jobs AS (
        SELECT {columns} FROM jobcore.jobs
        WHERE id = ANY(ARRAY(SELECT id FROM seen_jobs WHERE ended))
          AND status IN {TERMINAL_SQL}
        FOR KEY SHARE
    ), their_jobs AS (
        SELECT {columns} FROM seen_jobs WHERE NOT ended
        UNION ALL SELECT {columns} FROM ended_jobs
    )"""


class OutboxDeletePublishedParams(TypedDict):
    ids: list[int]
    relay: str


# Runs in the claiming transaction, for the rows the broker confirmed: one batch-sized
# statement, never an unbounded DELETE. A job message's publish is its job's `published`
# event, dated now(): the start of this transaction, which claimed the row before
# publishing it. The message said that time and this relay in its headers
# (jobcore.kernel.envelope.PUBLISHED_HEADER), and the worker's claim of the job's first
# attempt keeps the first it is handed on the job row (published_at, published_by), which
# the timeline lists (migration 0041). So an event row is written only for a publish the
# job row will not keep:
# - kept already: the job row holds this very publish (a worker claimed the message
#   before the confirm reached this relay, the usual order under load);
# - to be kept: a message of attempt 1 whose job is pending and holds no publish yet
#   (the happy path: the claim that follows keeps it; a claim statement that receives it
#   but claims nothing writes the row instead). If no worker ever receives it (the
#   message lost, or no worker consuming its queue), the timeline has no `published`
#   entry, and the job's `where` says its message left the outbox and waits for a worker;
# - every other publish (a later attempt, a release, a republish, a job already holding
#   one, ended, or claimed by a worker of the previous revision) is a row, with the
#   broker's confirm time (clock_timestamp(), which may come after the claim; timelines
#   are read in order of `at`).
# A job can be gone (the pruner deletes a finished job whose last message was still
# waiting): only a job seen here gets an event, and a finished one is locked FOR KEY SHARE
# first, so that the pruner cannot delete it (and its events) under the new event; one
# deleted meanwhile is skipped.
# Returns how many rows were deleted.
OUTBOX_DELETE_PUBLISHED = Query[OutboxDeletePublishedParams](
    "outbox_delete_published",
    "Remove the claimed rows whose messages the broker confirmed; note each job's `published`.",
    f"""
    WITH gone AS (
        DELETE FROM jobcore.outbox WHERE id = ANY(%(ids)s)
        RETURNING id, job_id, message_type, message_id, body
    ), {_jobs_seen_or_ended("gone")}, published AS (
        INSERT INTO jobcore.job_events (job_id, at, kind, attempt, detail)
        SELECT gone.job_id, now(), '{JobEventKind.PUBLISHED}', {_message_attempt("gone")},
               jsonb_build_object('relay', %(relay)s::text, 'message_id', gone.message_id,
                                  'confirmed_at', clock_timestamp())
        FROM gone JOIN their_jobs AS owner
                  ON owner.id = gone.job_id AND owner.type = gone.message_type
        WHERE {EVENTS_ON}
          AND (owner.published_at = now() AND owner.published_by = %(relay)s::text)
              IS NOT TRUE
          AND (owner.status = 'pending' AND owner.published_at IS NULL
               AND {_message_attempt("gone")} = 1) IS NOT TRUE
        ORDER BY gone.id
    )
    SELECT count(*) AS deleted FROM gone
    """,
    generic_plan=True,
)


class OutboxRecordFailuresParams(TypedDict):
    delays: list[float]
    errors: list[str]
    ids: list[int]
    quarantine: list[bool]


# Per row the caller decides (jobcore.amqp.publisher.Failure) its delay (exponential
# backoff with jitter on the new attempt count) and whether it is quarantined: only a
# message that can never be published is. A job whose message keeps being refused stays
# pending, and its pollers read why in its last_error: written when the reason changes,
# not on every retry; skipped if another transaction holds the job (a note, never a wait).
# Worded to stay true once the message went out, like the worker's JOB_NOTE_UNDELIVERABLE.
OUTBOX_RECORD_FAILURES = Query[OutboxRecordFailuresParams](
    "outbox_record_failures",
    "Count a failed publish on each row, push it back by its delay or quarantine it (with "
    "its job's `quarantined` event), and tell a pending job why it waits.",
    f"""
    WITH failed AS (
        UPDATE jobcore.outbox AS o
        SET attempts = o.attempts + 1,
            last_error = f.error,
            available_at = now() + make_interval(secs => f.delay),
            failing_since = coalesce(o.failing_since, now()),
            quarantined_at = CASE WHEN f.quarantine THEN now() END
        FROM unnest(
            %(ids)s::bigint[], %(errors)s::text[], %(delays)s::float8[], %(quarantine)s::bool[]
        ) AS f(id, error, delay, quarantine)
        WHERE o.id = f.id
        RETURNING o.id, o.message_id, o.job_id, o.message_type, o.attempts, o.last_error,
                  o.quarantined_at IS NOT NULL AS quarantined, o.body
    ), waiting AS (
        SELECT jobs.id,
               left(format('attempt %%s''s message could not be published (%%s); the '
                           'relay retries it until the broker takes it',
                           jobs.attempts + 1, failed.last_error), 2000) AS note
        FROM jobcore.jobs
        JOIN failed ON failed.job_id = jobs.id AND failed.message_type = jobs.type
        WHERE jobs.status = 'pending' AND NOT failed.quarantined
        FOR UPDATE OF jobs SKIP LOCKED
    ), noted AS (
        UPDATE jobcore.jobs SET last_error = waiting.note, updated_at = now()
        FROM waiting
        WHERE jobs.id = waiting.id AND jobs.last_error IS DISTINCT FROM waiting.note
        RETURNING jobs.id
    ), gave_up AS (
        SELECT * FROM failed WHERE quarantined
    ), {_jobs_of("gave_up")}, quarantine_events AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt, detail)
        SELECT gave_up.job_id, '{JobEventKind.QUARANTINED}', {_message_attempt("gave_up")},
               jsonb_build_object('outbox_id', gave_up.id,
                                  'error', {short_error("gave_up.last_error")})
        FROM gave_up JOIN their_jobs AS owner
                     ON owner.id = gave_up.job_id AND owner.type = gave_up.message_type
        WHERE {EVENTS_ON}
        ORDER BY gave_up.id
    )
    SELECT failed.id, failed.message_id, failed.job_id, failed.attempts, failed.last_error,
           failed.quarantined
    FROM failed
    """,
)


# Rows that are due but locked by another relay are deliberately not counted: waiting for
# them would make an idle replica spin while its peer publishes them.
OUTBOX_SECONDS_UNTIL_NEXT_DUE = Query[NoParams](
    "outbox_seconds_until_next_due",
    "How long until the earliest scheduled (not yet due) row becomes due; NULL when none.",
    """
    SELECT extract(epoch FROM min(available_at) - now())::float8 AS seconds
    FROM jobcore.outbox
    WHERE available_at > now() AND quarantined_at IS NULL
    """,
)


class OutboxAnyDueParams(TypedDict):
    window: float


# A relay that left a full broker queue alone looks again soon only while something is due;
# a quiet relay's poll asks this before it claims. From the relay's low-water mark, as
# its claims (`window`: OUTBOX_CLAIM_FEW), so a pinned horizon's dead entries cost it
# nothing either.
OUTBOX_ANY_DUE = Query[OutboxAnyDueParams](
    "outbox_any_due",
    "Whether any unquarantined row that became due in the last `window` seconds is due.",
    """
    SELECT EXISTS (
        SELECT 1 FROM jobcore.outbox
        WHERE available_at <= now() AND quarantined_at IS NULL
          AND available_at >= now() - make_interval(secs => %(window)s)
    ) AS due
    """,
)


class OutboxAnyOverdueParams(TypedDict):
    seconds: float
    window: float


# What a relay without the wake lease looks for when it polls: rows that have been due
# for longer than a poll interval, which the relay holding the lease would have published
# by then had it kept up (or were it still there). So standby relays claim nothing while
# the holder keeps up, and drain with it once a backlog builds. From the standby's own
# low-water mark (`window`), as OUTBOX_ANY_DUE.
OUTBOX_ANY_OVERDUE = Query[OutboxAnyOverdueParams](
    "outbox_any_overdue",
    "Whether any unquarantined row that became due in the last `window` seconds has been "
    "due for longer than `seconds`.",
    """
    SELECT EXISTS (
        SELECT 1 FROM jobcore.outbox
        WHERE available_at <= now() - make_interval(secs => %(seconds)s)
          AND quarantined_at IS NULL
          AND available_at >= now() - make_interval(secs => %(window)s)
    ) AS due
    """,
)


OUTBOX_STATUS = Query[NoParams](
    "outbox_status",
    "Backlog counts: due, scheduled, failing and quarantined rows, the age of the oldest due "
    "row, and how long the longest-failing row has been refused.",
    """
    SELECT count(*) FILTER (WHERE quarantined_at IS NULL AND available_at <= now()) AS due,
           count(*) FILTER (WHERE quarantined_at IS NULL AND available_at > now()) AS scheduled,
           count(*) FILTER (WHERE quarantined_at IS NULL AND failing_since IS NOT NULL)
               AS failing,
           count(*) FILTER (WHERE quarantined_at IS NOT NULL) AS quarantined,
           coalesce(extract(epoch FROM now() - min(available_at)
                    FILTER (WHERE quarantined_at IS NULL AND available_at <= now())), 0)::float8
               AS oldest_due_age_seconds,
           coalesce(extract(epoch FROM now() - min(failing_since)
                    FILTER (WHERE quarantined_at IS NULL)), 0)::float8
               AS longest_failing_seconds
    FROM jobcore.outbox
    """,
)


class OutboxListFailingParams(TypedDict):
    limit: int


# The rows the broker keeps refusing (still retried): what an operator looks at when
# `failing` is not zero. No index: the outbox is small, and this is an operator's verb.
OUTBOX_LIST_FAILING = Query[OutboxListFailingParams](
    "outbox_list_failing",
    "The rows whose publish failed and that are still retried, longest failing first.",
    """
    SELECT id, message_id, job_id, exchange, routing_key, message_type, attempts,
           failing_since, available_at AS next_attempt_at, last_error
    FROM jobcore.outbox
    WHERE quarantined_at IS NULL AND failing_since IS NOT NULL
    ORDER BY failing_since, id
    LIMIT %(limit)s
    """,
)


class OutboxListQuarantinedParams(TypedDict):
    limit: int


OUTBOX_LIST_QUARANTINED = Query[OutboxListQuarantinedParams](
    "outbox_list_quarantined",
    "The quarantined rows, earliest quarantined first.",
    """
    SELECT id, message_id, job_id, exchange, routing_key, message_type, attempts,
           last_error, quarantined_at, created_at
    FROM jobcore.outbox
    WHERE quarantined_at IS NOT NULL
    ORDER BY quarantined_at, id
    LIMIT %(limit)s
    """,
)


class OutboxRowParams(TypedDict):
    """An operator's name for a row: its numeric id or its message id (the other None)."""

    id: int | None
    message_id: uuid.UUID | None


# Operators name a row by its numeric id or its message id; the other parameter is NULL.
# `ended_job_status` is set when the row is a job's message and that job has ended.
# Asked only once a requeue or discard found no quarantined row of that name (its error
# message): by message id, a scan of the outbox, which keeps no index of message ids but
# those of quarantined rows (outbox_quarantined_message_idx, migration 0042): one on every
# row would cost each enqueue an index entry for the sake of an operator's typo.
OUTBOX_FIND = Query[OutboxRowParams](
    "outbox_find",
    "One outbox row by id or message id (to tell 'unknown' from 'not quarantined').",
    """
    SELECT outbox.id, outbox.message_id, outbox.job_id, outbox.quarantined_at,
           jobs.status AS ended_job_status
    FROM jobcore.outbox
    LEFT JOIN jobcore.jobs ON jobs.id = outbox.job_id
                  AND jobs.type = outbox.message_type
                  AND jobs.status <> 'pending'
    WHERE outbox.id = %(id)s OR outbox.message_id = %(message_id)s
    """,
)


class OutboxRequeueParams(OutboxRowParams):
    channel: str


# The row is found by id (outbox_pkey) or by message id among the quarantined rows
# (outbox_quarantined_message_idx), as OUTBOX_DISCARD.
# A job's message is requeued only while the job is pending: once it ended (the rescuer
# failed it because this row was quarantined, or it was cancelled), the worker would
# acknowledge the message with no effect, and the operator should retry the job instead.
# Webhook messages (their type is not their job's) are always requeued.
OUTBOX_REQUEUE = Query[OutboxRequeueParams](
    "outbox_requeue",
    "Give a quarantined row a fresh set of attempts, due now, and wake the relays.",
    """
    WITH requeued AS (
        UPDATE jobcore.outbox
        SET quarantined_at = NULL, attempts = 0, failing_since = NULL, available_at = now()
        WHERE (id = %(id)s OR message_id = %(message_id)s) AND quarantined_at IS NOT NULL
          AND NOT EXISTS (
              SELECT 1 FROM jobcore.jobs
              WHERE jobs.id = outbox.job_id
                AND jobs.type = outbox.message_type
                AND jobs.status <> 'pending'
          )
        RETURNING id, message_id, job_id, last_error
    )
    SELECT requeued.*, pg_notify(%(channel)s, '') IS NULL AS notified FROM requeued
    """,
)


OUTBOX_DISCARD = Query[OutboxRowParams](
    "outbox_discard",
    "Delete a quarantined row (its message is never published).",
    """
    DELETE FROM jobcore.outbox
    WHERE (id = %(id)s OR message_id = %(message_id)s) AND quarantined_at IS NOT NULL
    RETURNING id, message_id, job_id, last_error
    """,
)
