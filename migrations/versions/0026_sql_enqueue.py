"""job_type_registry and jobcore_enqueue(): enqueue from SQL, in the caller's transaction

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06 10:30:00.000000

``job_type_registry`` holds, per job type, what the workers' registries declare (queue,
limits, flow control, a hash of the payload's JSON schema) and what their deployment
says about it (the jobs exchange, the inline payload limit, the tenant quota defaults).
Each worker upserts its registry's rows when its pool first connects
(jobcore.execution.job_type_records), in one statement that writes nothing when nothing changed.

``jobcore_enqueue(job_type, payload, tenant, ...)`` writes a job as
``jobcore.enqueue_in`` does (the same job row, outbox row, ordering place and tenant
admission, with the same defaults and the same request fingerprint), in the caller's
transaction, and NOTIFYs the relays, which hear it at the commit. What it checks and the
SQLSTATEs of its refusals: docs/how-to/enqueue-in-transaction.md. The function's
statements mirror jobcore.database.sql.jobs.enqueue.JOB_INSERT and
jobcore.database.sql.tenant_quotas.admission_ctes as of this revision; a test
(tests/integration/intx/test_sql_enqueue.py) compares the rows each path writes.

SECURITY DEFINER, with its search_path fixed to the migration's, where jobcore's tables
are (the caller's search_path, which may name an application's own ``jobs`` table, plays
no part; revision 0030 puts pg_temp last in it), and EXECUTE revoked from PUBLIC:
a role enqueues once granted EXECUTE, with no privilege on jobcore's tables.

Additive: code of the previous revision neither reads nor writes either object.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = (
    "jobcore_enqueue(text, jsonb, text, text, text, text, text, timestamptz, interval, "
    "integer, text)"
)

# JSON as orjson.dumps(value, option=OPT_SORT_KEYS) writes it (jobcore.usecases.enqueue.submit's
# fingerprints and unique keys): no whitespace, keys sorted by code point, strings
# escaped as PostgreSQL escapes them (the same escapes), a number with a fraction or an
# exponent as the float it reads as, written as orjson writes that float.
CANONICAL_JSON = r"""
CREATE OR REPLACE FUNCTION jobcore_canonical_json(value jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $fn$
DECLARE
    number text;
    magnitude numeric;
BEGIN
    CASE jsonb_typeof(value)
    WHEN 'object' THEN
        RETURN '{' || coalesce((
            SELECT string_agg(
                to_json(e.key)::text || ':' || jobcore_canonical_json(e.value), ','
                ORDER BY e.key COLLATE "C")
            FROM jsonb_each(value) AS e
        ), '') || '}';
    WHEN 'array' THEN
        RETURN '[' || coalesce((
            SELECT string_agg(jobcore_canonical_json(a.value), ',' ORDER BY a.n)
            FROM jsonb_array_elements(value) WITH ORDINALITY AS a(value, n)
        ), '') || ']';
    WHEN 'number' THEN
        number := value::text;
        IF number ~ '^-?[0-9]+$' THEN
            RETURN number;
        END IF;
        -- Beyond a float's range Python has no float to write: the number as it is.
        magnitude := abs(number::numeric);
        IF magnitude <> 0 AND (magnitude < 1e-307 OR magnitude >= 1e308) THEN
            RETURN number;
        END IF;
        -- The shortest digits that read back as the float (PostgreSQL's and orjson's
        -- alike), in orjson's notation: positional from 1e-5 to below 1e16, else an
        -- exponent without leading zeros.
        number := number::float8::text;
        IF number ~ 'e' THEN
            IF split_part(number, 'e', 2)::int NOT BETWEEN -5 AND 15 THEN
                RETURN regexp_replace(number, 'e([+-])0*([0-9])', 'e\1\2');
            END IF;
            number := number::numeric::text;
        END IF;
        RETURN CASE WHEN number ~ '^-?[0-9]+$' THEN number || '.0' ELSE number END;
    ELSE
        RETURN value::text;
    END CASE;
END
$fn$
"""

# jobcore.kernel.gates.gate_key: the key of the gate a job passes. A payload field's value is
# its text (a string as it is, a boolean as Python writes it, an object or array as
# canonical JSON, which differs from Python's repr of one).
GATE_KEY = r"""
CREATE OR REPLACE FUNCTION jobcore_gate_key(
    kind text, per text, type_name text, tenant text, payload jsonb
) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $fn$
DECLARE
    field jsonb;
    key text;
BEGIN
    IF per = 'type' THEN
        key := kind || ':' || type_name;
    ELSIF per = 'tenant' THEN
        key := kind || ':' || type_name || ':tenant=' || tenant;
    ELSE
        field := CASE WHEN jsonb_typeof(payload) = 'object' THEN payload -> per END;
        key := kind || ':' || type_name || ':tenant=' || tenant || ':' || per || '='
            || CASE jsonb_typeof(field)
                   WHEN 'string' THEN field #>> '{}'
                   WHEN 'boolean' THEN CASE WHEN field::text = 'true' THEN 'True'
                                            ELSE 'False' END
                   WHEN 'null' THEN 'null'
                   WHEN 'number' THEN jobcore_canonical_json(field)
                   WHEN 'object' THEN jobcore_canonical_json(field)
                   WHEN 'array' THEN jobcore_canonical_json(field)
                   ELSE 'null'
               END;
    END IF;
    IF char_length(key) <= 255 THEN
        RETURN key;
    END IF;
    -- Distinct long values stay distinct gates: a prefix and a digest of the whole.
    RETURN left(key, 190) || '#' || encode(sha256(convert_to(key, 'UTF8')), 'hex');
END
$fn$
"""

ENQUEUE = r"""
CREATE OR REPLACE FUNCTION jobcore_enqueue(
    job_type text,
    payload jsonb,
    tenant text,
    idempotency_key text DEFAULT NULL,
    unique_key text DEFAULT NULL,
    ordering_key text DEFAULT NULL,
    priority text DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    entity_id text DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
DECLARE
    v_type text := jobcore_enqueue.job_type;
    v_payload jsonb := jobcore_enqueue.payload;
    v_tenant text := jobcore_enqueue.tenant;
    v_idempotency_key text := jobcore_enqueue.idempotency_key;
    v_unique_key text := jobcore_enqueue.unique_key;
    v_ordering_key text := jobcore_enqueue.ordering_key;
    v_entity_id text := jobcore_enqueue.entity_id;
    kind job_type_registry%ROWTYPE;
    v_priority smallint;
    v_max_attempts integer;
    v_due timestamptz;
    v_held text;
    v_field jsonb;
    v_document text;
    v_size bigint;
    v_fingerprint text;
    v_concurrency_key text;
    v_rate_key text;
    v_id uuid;
    v_message_id uuid;
    v_rate float8;
    v_max_unfinished bigint;
    answer record;
    holder record;
BEGIN
    IF v_type IS NULL THEN
        RAISE EXCEPTION 'jobcore_enqueue: job_type is required'
            USING ERRCODE = 'JC400', COLUMN = 'job_type';
    END IF;
    IF v_tenant IS NULL OR v_tenant = '' THEN
        RAISE EXCEPTION 'jobcore_enqueue: tenant is required'
            USING ERRCODE = 'JC400', COLUMN = 'tenant';
    END IF;
    SELECT * INTO kind FROM job_type_registry AS r WHERE r.type = v_type;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'jobcore_enqueue: unknown job type %: no worker has registered it',
            quote_literal(v_type)
            USING ERRCODE = 'JC404', COLUMN = 'job_type',
                  HINT = 'a worker records the job types of its JOBCORE_JOB_MODULES when it '
                         'starts';
    END IF;
    IF v_payload IS NULL OR jsonb_typeof(v_payload) <> 'object' THEN
        RAISE EXCEPTION 'jobcore_enqueue: payload must be a JSON object, not %',
            coalesce(jsonb_typeof(v_payload), 'NULL')
            USING ERRCODE = 'JC400', COLUMN = 'payload';
    END IF;
    -- jobcore.usecases.enqueue.submit.check_idempotency_key
    IF v_idempotency_key IS NOT NULL
       AND v_idempotency_key !~ '^[ -~]{1,255}$' THEN
        RAISE EXCEPTION 'jobcore_enqueue: an idempotency key is 1 to 255 printable ASCII '
            'characters'
            USING ERRCODE = 'JC400', COLUMN = 'idempotency_key';
    END IF;
    -- jobcore.usecases.enqueue.submit._due_at
    IF run_at IS NOT NULL AND delay IS NOT NULL THEN
        RAISE EXCEPTION 'jobcore_enqueue: give run_at or delay, not both'
            USING ERRCODE = 'JC400', COLUMN = 'delay';
    END IF;
    IF delay IS NOT NULL THEN
        v_due := clock_timestamp() + delay;
    ELSIF run_at IS NOT NULL THEN
        IF run_at - clock_timestamp() > interval '366 days' THEN
            RAISE EXCEPTION 'jobcore_enqueue: run_at must be within 366 days from now'
                USING ERRCODE = 'JC400', COLUMN = 'run_at';
        END IF;
        v_due := run_at;
    END IF;
    -- jobcore.usecases.enqueue.submit._held_key: the request's unique key, else the type's unique field.
    IF v_unique_key IS NOT NULL THEN
        IF char_length(v_unique_key) NOT BETWEEN 1 AND 255 THEN
            RAISE EXCEPTION 'jobcore_enqueue: a unique key is 1 to 255 characters'
                USING ERRCODE = 'JC400', COLUMN = 'unique_key';
        END IF;
        v_held := v_unique_key;
    ELSIF kind.unique_field IS NOT NULL THEN
        v_field := v_payload -> kind.unique_field;
        v_held := CASE jsonb_typeof(v_field)
                      WHEN 'string' THEN v_field #>> '{}'
                      WHEN 'null' THEN NULL
                      ELSE jobcore_canonical_json(v_field)
                  END;
        IF char_length(v_held) > 255 THEN
            RAISE EXCEPTION 'jobcore_enqueue: the job type''s unique key is the payload''s '
                'field %, at most 255 characters (as JSON unless a string)',
                quote_literal(kind.unique_field)
                USING ERRCODE = 'JC400', COLUMN = 'payload';
        END IF;
    END IF;
    IF jobcore_enqueue.priority IS NULL THEN
        v_priority := kind.priority;
    ELSE
        v_priority := CASE lower(btrim(jobcore_enqueue.priority))
                          WHEN 'low' THEN 0 WHEN 'normal' THEN 1 WHEN 'high' THEN 2
                          WHEN '0' THEN 0 WHEN '1' THEN 1 WHEN '2' THEN 2
                      END;
        IF v_priority IS NULL THEN
            RAISE EXCEPTION 'jobcore_enqueue: unknown priority %: one of low, normal, high',
                quote_literal(jobcore_enqueue.priority)
                USING ERRCODE = 'JC400', COLUMN = 'priority';
        END IF;
    END IF;
    IF jobcore_enqueue.max_attempts IS NOT NULL
       AND jobcore_enqueue.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'jobcore_enqueue: max_attempts must be within 1..100'
            USING ERRCODE = 'JC400', COLUMN = 'max_attempts';
    END IF;
    v_max_attempts := coalesce(jobcore_enqueue.max_attempts, kind.max_attempts);
    -- What an enqueue in a transaction keeps inline (JOBCORE_INLINE_PAYLOAD_MAX_BYTES):
    -- a larger payload would go to the object store, which SQL cannot reach.
    v_document := jobcore_canonical_json(v_payload);
    v_size := octet_length(v_document);
    IF v_size > kind.max_payload_bytes THEN
        RAISE EXCEPTION 'jobcore_enqueue: payload is % bytes of JSON, more than the % an '
            'enqueue in a transaction keeps inline', v_size, kind.max_payload_bytes
            USING ERRCODE = 'JC413', COLUMN = 'payload',
                  HINT = 'store large data yourself and pass its key';
    END IF;
    -- jobcore.usecases.enqueue.submit.request_fingerprint: the request as sent, keys in sorted order.
    v_fingerprint := encode(sha256(convert_to(
        '{"callback_url":null,"delay":'
        || coalesce(jobcore_canonical_json(to_jsonb(extract(epoch FROM delay))), 'null')
        || ',"entity_id":' || coalesce(to_json(v_entity_id)::text, 'null')
        || ',"max_attempts":' || coalesce(jobcore_enqueue.max_attempts::text, 'null')
        || coalesce(',"ordering_key":' || to_json(v_ordering_key)::text, '')
        || ',"payload":' || v_document
        || coalesce(',"priority":' || CASE WHEN jobcore_enqueue.priority IS NOT NULL
                                           THEN v_priority::text END, '')
        || ',"run_at":' || coalesce(
               '"' || to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
               || CASE WHEN extract(microseconds FROM run_at)::bigint % 1000000 <> 0
                       THEN '.' || to_char(run_at AT TIME ZONE 'UTC', 'US') ELSE '' END
               || '+00:00"', 'null')
        || coalesce(',"unique_key":' || to_json(v_unique_key)::text, '')
        || '}', 'UTF8')), 'hex');
    -- jobcore.usecases.enqueue.write_one.job_gates
    IF kind.concurrency_limit IS NOT NULL THEN
        v_concurrency_key := jobcore_gate_key(
            'concurrency', kind.concurrency_per, v_type, v_tenant, v_payload);
    END IF;
    IF kind.rate_per_second IS NOT NULL THEN
        v_rate_key := jobcore_gate_key('rate', kind.rate_per, v_type, v_tenant, v_payload);
    END IF;
    -- jobcore.usecases.enqueue.in_transaction: quotas are read as committed now, which only READ
    -- COMMITTED's fresh snapshot per statement shows.
    SELECT coalesce(q.enqueue_rate, kind.quota_enqueue_rate),
           coalesce(q.max_unfinished, kind.quota_max_unfinished)
    INTO v_rate, v_max_unfinished
    FROM (SELECT 1) AS one LEFT JOIN tenant_quotas AS q ON q.tenant = v_tenant;
    IF (v_rate > 0 OR v_max_unfinished > 0)
       AND current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'jobcore_enqueue: the transaction''s isolation is %; an enqueue for a '
            'tenant with quotas needs read committed', current_setting('transaction_isolation')
            USING ERRCODE = 'JC400';
    END IF;

    -- jobcore.usecases.enqueue.write_one._insert_until_answered: a holder of the unique key that ends between
    -- the insert and the read of it has freed it, and the insert is tried again.
    FOR turn IN 1..3 LOOP
        v_id := gen_random_uuid();
        v_message_id := gen_random_uuid();
        -- jobcore.database.sql.jobs.enqueue.JOB_INSERT, with tenant_quotas.admission_ctes.
        WITH existing AS (
            SELECT j.id FROM jobs AS j
            WHERE j.tenant = v_tenant AND j.type = v_type
              AND j.idempotency_key = v_idempotency_key
            UNION ALL
            SELECT j.id FROM jobs AS j
            WHERE j.tenant = v_tenant AND j.type = v_type
              AND j.unique_key = v_held AND j.status IN ('pending', 'running')
        ), limits AS (
            SELECT t.tenant,
                   coalesce(q.enqueue_rate, kind.quota_enqueue_rate) AS rate,
                   coalesce(q.enqueue_burst, kind.quota_enqueue_burst) AS burst,
                   coalesce(q.max_unfinished, kind.quota_max_unfinished) AS max_unfinished
            FROM (SELECT v_tenant AS tenant) AS t
            LEFT JOIN tenant_quotas AS q ON q.tenant = t.tenant
        ), admit AS (
            INSERT INTO tenant_usage AS u (tenant, rate_tat, last_refusal)
            SELECT l.tenant, CASE WHEN NOT l.c THEN clock_timestamp()
                                  + make_interval(secs => 1.0 / nullif(l.rate, 0)) END,
                   CASE WHEN l.c THEN 'max_unfinished' END
            FROM (
                SELECT limits.*,
                       CASE WHEN EXISTS (
                                SELECT 1 FROM tenant_usage AS x WHERE x.tenant = limits.tenant)
                            THEN false
                            ELSE jobcore_tenant_at_cap(limits.tenant, limits.max_unfinished)
                       END AS c
                FROM limits
            ) AS l
            WHERE NOT EXISTS (SELECT 1 FROM existing) AND (l.rate > 0 OR l.max_unfinished > 0)
            ON CONFLICT (tenant) DO UPDATE SET (rate_tat, last_refusal, last_refused_at) = (
                SELECT CASE WHEN v.refusal IS NULL THEN v.next_tat ELSE u.rate_tat END,
                       v.refusal,
                       CASE WHEN v.refusal IS NULL THEN u.last_refused_at ELSE v.at END
                FROM (
                    SELECT CASE
                               WHEN jobcore_tenant_at_cap(u.tenant, l.max_unfinished)
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
        ), place AS (
            INSERT INTO job_gates AS g (key, counter)
            SELECT 'ordering:' || go.tenant || ':' || v_ordering_key, 1
            FROM go
            WHERE v_ordering_key IS NOT NULL
            ON CONFLICT (key) DO UPDATE
            SET counter = g.counter + 1, updated_at = now()
            RETURNING g.counter
        ), job AS (
            INSERT INTO jobs (
                id, tenant, type, queue, idempotency_key, payload_fingerprint,
                payload, entity_id, max_attempts, next_attempt_at, traceparent, tracestate,
                unique_key, priority,
                concurrency_key, concurrency_limit, rate_key, rate_per_second, rate_burst,
                ordering_key, ordering_seq, ordering_blocks,
                callback_url, accepted_detail, payload_ref
            )
            SELECT
                v_id, go.tenant, v_type, kind.queue, v_idempotency_key, v_fingerprint,
                v_payload, v_entity_id, v_max_attempts, v_due, NULL, NULL, v_held,
                v_priority, v_concurrency_key, kind.concurrency_limit, v_rate_key,
                kind.rate_per_second, kind.rate_burst, v_ordering_key,
                (SELECT place.counter FROM place), kind.ordering_blocks,
                (
                    SELECT w.url FROM webhook_endpoints AS w
                    WHERE w.tenant = go.tenant AND w.job_type IN (v_type, '*')
                    ORDER BY w.job_type = '*'
                    LIMIT 1
                ),
                nullif(jsonb_strip_nulls(jsonb_build_object('run_at', v_due)), '{}'::jsonb),
                NULL
            FROM go
            ON CONFLICT DO NOTHING
            RETURNING jobs.id, jobs.tenant, jobs.priority
        ), message AS (
            INSERT INTO outbox (
                message_id, exchange, routing_key, message_type, headers, body, job_id,
                tenant, available_at, priority
            )
            SELECT v_message_id, kind.exchange, kind.routing_key, v_type, '{}'::jsonb,
                   convert_to('{"v":1,"job_id":"' || job.id || '","attempt":1,"type":'
                              || to_json(v_type)::text || '}', 'UTF8'),
                   job.id, job.tenant, coalesce(v_due, now()), job.priority
            FROM job
            RETURNING outbox.id
        )
        SELECT job.id,
               admit.last_refusal AS refusal,
               coalesce(admit.rate_tat, CASE WHEN limits.rate > 0 THEN (
                   SELECT x.rate_tat FROM tenant_usage AS x WHERE x.tenant = limits.tenant)
                   END) AS rate_tat,
               limits.rate, limits.burst, limits.max_unfinished,
               clock_timestamp() AS at,
               (SELECT pg_notify('jobcore_outbox', '') FROM message) IS NULL AS notified
        INTO answer
        FROM limits LEFT JOIN admit ON true LEFT JOIN job ON true;

        IF answer.id IS NOT NULL THEN
            RETURN answer.id;
        END IF;
        IF answer.refusal IS NULL OR v_idempotency_key IS NOT NULL OR v_held IS NOT NULL THEN
            -- A key is taken (or was, by a transaction the admission queued behind): a
            -- new statement, with a new snapshot, sees the job that holds it.
            IF v_idempotency_key IS NOT NULL THEN
                SELECT j.id, j.payload_fingerprint INTO holder FROM jobs AS j
                WHERE j.tenant = v_tenant AND j.type = v_type
                  AND j.idempotency_key = v_idempotency_key;
                IF FOUND THEN
                    IF holder.payload_fingerprint IS DISTINCT FROM v_fingerprint THEN
                        RAISE EXCEPTION 'jobcore_enqueue: idempotency key already used for '
                            'job % with a different request', holder.id
                            USING ERRCODE = 'JC422', COLUMN = 'idempotency_key';
                    END IF;
                    RETURN holder.id;
                END IF;
            END IF;
            IF v_held IS NOT NULL THEN
                SELECT j.id, j.status INTO holder FROM jobs AS j
                WHERE j.tenant = v_tenant AND j.type = v_type
                  AND j.unique_key = v_held AND j.status IN ('pending', 'running');
                IF FOUND THEN
                    RAISE EXCEPTION 'jobcore_enqueue: job % (%) holds this unique key until '
                        'it ends; no job was created', holder.id, holder.status
                        USING ERRCODE = 'JC409', COLUMN = 'unique_key',
                              DETAIL = 'job_id=' || holder.id;
                END IF;
            END IF;
        END IF;
        IF answer.refusal = 'max_unfinished' THEN
            RAISE EXCEPTION 'jobcore_enqueue: the tenant has % unfinished jobs, its limit; '
                'retry when some have finished', answer.max_unfinished
                USING ERRCODE = 'JC429', HINT = 'retry in 5 seconds';
        ELSIF answer.refusal IS NOT NULL THEN
            RAISE EXCEPTION 'jobcore_enqueue: the tenant''s enqueue rate limit (%/s, bursts '
                'of %) is used up', answer.rate, answer.burst
                USING ERRCODE = 'JC429',
                      HINT = coalesce('retry in ' || greatest(1, ceil(extract(epoch FROM
                          answer.rate_tat + make_interval(secs => 1.0 / answer.rate)
                          - answer.at - make_interval(secs => answer.burst / answer.rate))))
                          || ' seconds', 'retry later');
        END IF;
    END LOOP;
    RAISE EXCEPTION 'jobcore_enqueue: the unique key''s holder kept changing; retry'
        USING ERRCODE = '40001';
END
$fn$
"""


def _verbatim(statement: str) -> sa.TextClause:
    """``statement`` as SQLAlchemy runs it unchanged: its colons (``':tenant='``) are
    not bind parameters."""
    return sa.text(statement.replace(":", "\\:"))


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.create_table(
        "job_type_registry",
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("exchange", sa.Text(), nullable=False),
        sa.Column("routing_key", sa.Text(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("unique_field", sa.Text(), nullable=True),
        sa.Column("concurrency_per", sa.Text(), nullable=True),
        sa.Column("concurrency_limit", sa.Integer(), nullable=True),
        sa.Column("rate_per", sa.Text(), nullable=True),
        sa.Column("rate_per_second", sa.Float(), nullable=True),
        sa.Column("rate_burst", sa.Integer(), nullable=True),
        sa.Column("ordering_blocks", sa.Boolean(), nullable=False),
        sa.Column("max_payload_bytes", sa.BigInteger(), nullable=False),
        sa.Column("quota_enqueue_rate", sa.Float(), nullable=False),
        sa.Column("quota_enqueue_burst", sa.Integer(), nullable=False),
        sa.Column("quota_max_unfinished", sa.BigInteger(), nullable=False),
        sa.Column("schema_hash", sa.Text(), nullable=False),
        sa.Column("worker_version", sa.Text(), nullable=False),
        sa.Column("registered_by", sa.Text(), nullable=False),
        sa.Column(
            "registered_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("type", name=op.f("job_type_registry_pkey")),
    )
    for function in (CANONICAL_JSON, GATE_KEY, ENQUEUE):
        op.execute(_verbatim(function))
    op.execute(f"REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.execute("DROP FUNCTION jobcore_gate_key(text, text, text, text, jsonb)")
    op.execute("DROP FUNCTION jobcore_canonical_json(jsonb)")
    op.drop_table("job_type_registry")
