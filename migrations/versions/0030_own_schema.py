"""jobcore's own schema: every jobcore object out of public; jobcore.enqueue()

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-06 13:45:00.000000

jobcore lives in a schema of its own (``JOBCORE_DATABASE_SCHEMA``, ``jobcore`` by default),
so that it can share a database with an application that has its own ``jobs`` or
``outbox`` table, and its own Alembic. migrations/env.py creates the schema and runs the
migrations with the schema as their search_path, so a fresh installation creates every
object there from the first revision on.

An installation of an earlier release has everything in ``public``: env.py finds its
version table there and runs its pending migrations in ``public``, as before, up to this
one, which (when the search_path is still ``public``):

- moves each of jobcore's tables, Alembic's version table among them, into the schema
  (``ALTER TABLE ... SET SCHEMA``: indexes, constraints, owned sequences and triggers go
  with their table; the table keeps its identity, so a foreign key, a trigger or a column
  default naming it by oid is undisturbed), and each of jobcore's functions;
- leaves in ``public``, under each table's old name, a view of it: processes of the
  previous release name the tables unqualified and keep working through the views during
  a rolling upgrade (a view of one table, with every column, is updatable: INSERT ... ON
  CONFLICT, UPDATE, DELETE, RETURNING and FOR UPDATE SKIP LOCKED go through to the
  table, whose column defaults and triggers apply; the views of ``inbox`` and
  ``audit_log`` also show each row's ``ctid``, by which that release's pruner deletes
  them). The view of ``alembic_version`` is
  where those processes read the schema's revision and its marker (env.py comments it);
- gives the roles that held privileges on what moved USAGE on the schema, and the same
  privileges on the views;
- keeps ``public.jobcore_enqueue(...)``, the SQL enqueue's old name, as a function that
  calls the new one;
- points the session's search_path at the schema, for the migrations after this one.

The next release drops the views and ``public.jobcore_enqueue`` (the contract step,
docs/operations.md, "Upgrades"). A fresh installation gets none of them.

Then, wherever the objects came from: ``jobcore_enqueue`` becomes ``enqueue`` (called as
``jobcore.enqueue(...)``; its refusals' messages still begin ``jobcore_enqueue:``), and every function in the schema gets a fixed search_path
naming it, so a trigger or a call works whatever the caller's search_path is.

Expand-and-contract: the previous release's processes reach the moved tables through the
views; this release's name them with their schema.

The downgrade gives ``enqueue`` its old name back; it does not move an installation back into
``public`` (restore from a backup for that).
"""

from collections.abc import Sequence

from alembic import op

from jobcore.database.migration_steps import jobcore_schema

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Every table of jobcore's schema as of 0029, and Alembic's.
TABLES = (
    "alembic_version",
    "api_keys",
    "audit_log",
    "flow_pauses",
    "inbox",
    "job_effects",
    "job_events",
    "job_gates",
    "job_type_registry",
    "jobs",
    "ledger_accounts",
    "ledger_entries",
    "maintenance_leases",
    "outbox",
    "schedules",
    "tenant_quotas",
    "tenant_usage",
    "tenant_usage_deltas",
    "tenant_webhook_secrets",
    "webhook_deliveries",
    "webhook_endpoints",
)
# Every function of jobcore's as of 0029 (those that a revision dropped are skipped).
FUNCTIONS = (
    "audit_log_refuse_update",
    "jobcore_canonical_json",
    "jobcore_count_added_jobs",
    "jobcore_count_changed_job",
    "jobcore_count_jobs_added",
    "jobcore_count_jobs_changed",
    "jobcore_count_jobs_removed",
    "jobcore_enqueue",
    "jobcore_gate_key",
    "jobcore_tenant_at_cap",
    "jobcore_tenant_unfinished",
)
# Tables whose rows the previous release's pruner deletes by ctid, which a view has only
# as a column of its own: their views end with one (not updatable, and not in the other
# views, whose SELECT * the previous release reads).
BY_CTID = ("audit_log", "inbox")
ARGUMENTS = "text, jsonb, text, text, text, text, text, timestamptz, interval, integer, text, text"


def _array(names: Sequence[str]) -> str:
    return "ARRAY[" + ", ".join(f"'{name}'" for name in names) + "]::text[]"


def _move(schema: str) -> str:
    """Out of public, with a view in its place for each table (only while the
    search_path is still public: an installation of an earlier release)."""
    return f"""
    DO $move$
    DECLARE
        target text := '{schema}';
        table_name text;
        routine regprocedure;
        privilege record;
        grantee oid;
    BEGIN
        IF current_schema() IS DISTINCT FROM 'public' THEN
            RETURN;
        END IF;
        EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', target);
        FOREACH table_name IN ARRAY {_array(TABLES)} LOOP
            CONTINUE WHEN NOT EXISTS (
                SELECT 1 FROM pg_class
                WHERE oid = to_regclass(format('public.%I', table_name)) AND relkind = 'r');
            EXECUTE format('ALTER TABLE public.%I SET SCHEMA %I', table_name, target);
            EXECUTE format(
                'CREATE VIEW public.%I AS SELECT *%s FROM %I.%I', table_name,
                CASE WHEN table_name = ANY({_array(BY_CTID)}) THEN ', ctid' ELSE '' END,
                target, table_name);
            FOR privilege IN
                SELECT a.grantee, a.privilege_type
                FROM pg_class AS c, aclexplode(c.relacl) AS a
                WHERE c.oid = format('%I.%I', target, table_name)::regclass
                  AND a.grantee <> c.relowner
            LOOP
                EXECUTE format('GRANT %s ON public.%I TO %s', privilege.privilege_type,
                               table_name, CASE WHEN privilege.grantee = 0 THEN 'PUBLIC'
                                           ELSE privilege.grantee::regrole::text END);
            END LOOP;
        END LOOP;
        FOR routine IN
            SELECT p.oid::regprocedure FROM pg_proc AS p
            WHERE p.pronamespace = 'public'::regnamespace AND p.proname = ANY({_array(FUNCTIONS)})
        LOOP
            EXECUTE format('ALTER FUNCTION %s SET SCHEMA %I', routine, target);
        END LOOP;
        FOR grantee IN
            SELECT a.grantee FROM pg_class AS c, aclexplode(c.relacl) AS a
            WHERE c.relnamespace = target::regnamespace AND a.grantee NOT IN (0, c.relowner)
            UNION
            SELECT a.grantee FROM pg_proc AS p, aclexplode(p.proacl) AS a
            WHERE p.pronamespace = target::regnamespace AND a.grantee NOT IN (0, p.proowner)
        LOOP
            EXECUTE format('GRANT USAGE ON SCHEMA %I TO %s', target, grantee::regrole::text);
        END LOOP;
    END
    $move$
    """


def _settle(schema: str) -> str:
    """``enqueue`` by its new name; the functions' calls of each other in the schema;
    every function's search_path fixed to the schema.

    The body names its parameters after the function (``jobcore_enqueue.tenant``), so a
    RENAME would leave it naming a function that is gone: it is created again from its
    own definition under the new name, granted to the roles the old one was, and the old
    one dropped."""
    return f"""
    DO $settle$
    DECLARE
        target text := '{schema}';
        old oid := to_regprocedure(format('%I.jobcore_enqueue({ARGUMENTS})', target));
        definition text;
        grantee oid;
        routine regprocedure;
    BEGIN
        IF old IS NOT NULL THEN
            definition := replace(pg_get_functiondef(old), 'jobcore_enqueue.', 'enqueue.');
            definition := regexp_replace(
                definition, 'FUNCTION \\S*jobcore_enqueue\\(',
                format('FUNCTION %I.enqueue(', target));
            EXECUTE definition;
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.enqueue({ARGUMENTS}) FROM PUBLIC',
                           target);
            FOR grantee IN
                SELECT a.grantee FROM pg_proc AS p, aclexplode(p.proacl) AS a
                WHERE p.oid = old AND a.privilege_type = 'EXECUTE'
                  AND a.grantee NOT IN (0, p.proowner)
            LOOP
                EXECUTE format('GRANT EXECUTE ON FUNCTION %I.enqueue({ARGUMENTS}) TO %s',
                               target, grantee::regrole::text);
            END LOOP;
            EXECUTE format('DROP FUNCTION %s', old::regprocedure);
        END IF;
        -- Revision 0026 wrote its functions' calls of each other as public.jobcore_...
        FOR routine IN
            SELECT p.oid::regprocedure FROM pg_proc AS p
            WHERE p.pronamespace = target::regnamespace AND strpos(p.prosrc, 'public.jobcore_') > 0
        LOOP
            EXECUTE replace(pg_get_functiondef(routine), 'public.jobcore_',
                            format('%I.jobcore_', target));
        END LOOP;
        FOR routine IN
            SELECT p.oid::regprocedure FROM pg_proc AS p
            WHERE p.pronamespace = target::regnamespace
        LOOP
            EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                           routine, target);
        END LOOP;
    END
    $settle$
    """


def _keep_old_name(schema: str) -> str:
    """``public.jobcore_enqueue(...)``, calling ``enqueue``, for a moved installation;
    executable by the roles that may execute ``enqueue``. Then the search_path of the
    migrations after this one."""
    return f"""
    DO $keep$
    DECLARE
        target text := '{schema}';
        enqueue oid := to_regprocedure(format('%I.enqueue({ARGUMENTS})', target));
        grantee oid;
    BEGIN
        IF current_schema() IS DISTINCT FROM 'public' THEN
            RETURN;
        END IF;
        IF enqueue IS NOT NULL THEN
            EXECUTE format(
                'CREATE FUNCTION public.jobcore_enqueue(%s) RETURNS %s LANGUAGE sql VOLATILE '
                'SET search_path = pg_catalog, pg_temp AS %L',
                pg_get_function_arguments(enqueue), pg_get_function_result(enqueue),
                format('SELECT %I.enqueue(%s)', target,
                       (SELECT string_agg('$' || i, ', ')
                        FROM generate_series(1, (SELECT pronargs FROM pg_proc
                                                 WHERE oid = enqueue)) AS i)));
            EXECUTE 'REVOKE EXECUTE ON FUNCTION public.jobcore_enqueue({ARGUMENTS}) FROM PUBLIC';
            FOR grantee IN
                SELECT a.grantee FROM pg_proc AS p, aclexplode(p.proacl) AS a
                WHERE p.oid = enqueue AND a.privilege_type = 'EXECUTE'
                  AND a.grantee NOT IN (0, p.proowner)
            LOOP
                EXECUTE format('GRANT EXECUTE ON FUNCTION public.jobcore_enqueue({ARGUMENTS}) '
                               'TO %s', grantee::regrole::text);
            END LOOP;
        END IF;
        PERFORM set_config('search_path', quote_ident(target), false);
    END
    $keep$
    """


def upgrade() -> None:
    schema = jobcore_schema()
    # ALTER ... SET SCHEMA locks each table for a moment; behind a long transaction it
    # gives up rather than queue every writer behind it (`jobcore migrate` again).
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(_move(schema))
    op.execute(_settle(schema))
    op.execute(_keep_old_name(schema))


def downgrade() -> None:
    schema = jobcore_schema()
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"DROP FUNCTION IF EXISTS public.jobcore_enqueue({ARGUMENTS})")
    op.execute(
        f"""
        DO $back$
        DECLARE
            definition text := pg_get_functiondef('{schema}.enqueue({ARGUMENTS})'::regprocedure);
        BEGIN
            -- Its parameters, not the modules its comments name (jobcore.usecases.enqueue.x).
            definition := regexp_replace(
                definition, '([^.\\w])enqueue\\.', '\\1jobcore_enqueue.', 'g');
            definition := regexp_replace(definition, 'FUNCTION \\S*enqueue\\(',
                                         'FUNCTION {schema}.jobcore_enqueue(');
            EXECUTE definition;
        END
        $back$
        """
    )
    op.execute(f"DROP FUNCTION {schema}.enqueue({ARGUMENTS})")
