"""Steps that migrations share (migrations/versions): building and dropping indexes
CONCURRENTLY, so that writers keep writing while an index on a busy table is built; and
where jobcore's objects are (its own schema, or ``public`` for an installation of a
release before the schema, :func:`installed_in_public`); and changing a few exact lines of
a SQL function in place (:func:`rewrite_function`).

Every migration that builds an index CONCURRENTLY does it through
:func:`create_indexes_concurrently` (scripts/lint_migrations.py refuses any other way).
A concurrent build that fails (its lock_timeout passed while a long transaction held the
table, a cancel, a lost connection) leaves the index behind, INVALID: no query uses it,
yet ``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` sees the name and skips it, so the next
`jobcore migrate` would record the revision as done without the index. Here an invalid
index of that name is dropped and built again instead.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import sqlalchemy as sa
from alembic import op

# A build waits for the transactions that hold its table this long at most, then fails
# (and the next `jobcore migrate` builds it again), rather than queue behind a long
# transaction with every later writer of the table queued behind it.
LOCK_TIMEOUT = "5s"

INVALID = sa.text("SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(:name)")


def _invalid(name: str) -> bool:
    """Whether an interrupted concurrent build left ``name`` INVALID (never, when writing
    SQL offline: there is no database to ask)."""
    if op.get_context().as_sql:
        return False
    return bool(op.get_bind().execute(INVALID, {"name": name}).scalar())


def valid_or_refuse(name: str) -> str:
    """A block that stops the migration unless index ``name`` is there and valid. Written
    into the SQL too: a script run offline (``alembic upgrade --sql``) cannot ask whether
    an earlier build left the index INVALID, so run again after a failed build it skips
    building it (IF NOT EXISTS), and must go no further (to drop the index it replaces)."""
    return f"""
    DO $valid$
    BEGIN
        IF NOT coalesce(
            (SELECT i.indisvalid FROM pg_index AS i
             WHERE i.indexrelid = to_regclass('{name}')), false) THEN
            RAISE EXCEPTION 'index {name} is missing or INVALID after its build: drop it'
                ' and run the migration again';
        END IF;
    END
    $valid$
    """


def create_indexes_concurrently(
    indexes: Mapping[str, str], *, table: str, unique: bool = False
) -> None:
    """``CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS <name> ON <table> <definition>``
    for each entry of ``indexes`` (name → columns and predicate), outside the migration's
    transaction, each one dropped first when an earlier build left it INVALID (an invalid
    unique index still refuses duplicates, yet no query can use it), and checked valid
    after (:func:`valid_or_refuse`)."""
    kind = "UNIQUE INDEX" if unique else "INDEX"
    with op.get_context().autocommit_block():
        op.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        for name, definition in indexes.items():
            if _invalid(name):
                op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            op.execute(f"CREATE {kind} CONCURRENTLY IF NOT EXISTS {name} ON {table} {definition}")
            op.execute(valid_or_refuse(name))
        op.execute("RESET lock_timeout")


def drop_indexes_concurrently(names: Iterable[str]) -> None:
    """``DROP INDEX CONCURRENTLY IF EXISTS`` each of ``names``, outside the transaction."""
    with op.get_context().autocommit_block():
        op.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        for name in names:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        op.execute("RESET lock_timeout")


# Where migrations/env.py leaves the schema's name for the migrations (Alembic's
# Config.attributes).
SCHEMA_ATTRIBUTE = "jobcore_schema"

_VERSION_TABLE_IN = sa.text("SELECT to_regclass(:name) IS NOT NULL")
_PUBLIC_VERSION_TABLE = sa.text(
    "SELECT relkind::text FROM pg_class WHERE oid = to_regclass('public.alembic_version')"
)
_PUBLIC_REVISIONS = sa.text("SELECT version_num FROM public.alembic_version")


def installed_in_public(connection: sa.Connection, schema: str, known: Collection[str]) -> bool:
    """Whether jobcore is installed in ``public`` by a release before its own schema: no
    version table in ``schema`` and a table ``public.alembic_version`` at one of jobcore's
    revisions (``known``). An application's own Alembic there is at revisions of its own."""
    if connection.execute(_VERSION_TABLE_IN, {"name": f"{schema}.alembic_version"}).scalar():
        return False
    if connection.execute(_PUBLIC_VERSION_TABLE).scalar() != "r":
        return False
    revisions = connection.execute(_PUBLIC_REVISIONS).scalars().all()
    return any(revision in known for revision in revisions)


def jobcore_schema() -> str:
    """The schema jobcore's objects belong in (``JOBCORE_DATABASE_SCHEMA``), as
    migrations/env.py read it."""
    return str(op.get_context().config.attributes[SCHEMA_ATTRIBUTE])  # type: ignore[union-attr]


def rewrite_function(
    revision: str, function: str, old: str, new: str, expected: int, *, schema: str
) -> str:
    """A block that makes ``function`` (``name(argument types)``, in ``schema``) again
    with each of its ``expected`` occurrences of ``old`` replaced by ``new``; it refuses
    (and the migration with it) when it finds another count, a definition changed by hand.
    CREATE OR REPLACE from the function's own definition: the same function, its grants
    kept, without a copy of its body in the migration; calls already running finish with
    the definition they started with."""
    for text in (old, new):
        if "'" in text or "$" in text:
            raise ValueError(f"migration {revision}: quote-free text only, not {text!r}")
    name = function.partition("(")[0]
    return f"""
    DO $rewrite$
    DECLARE
        routine oid := to_regprocedure(format('%I.{function}', '{schema}'));
        definition text;
        found integer;
    BEGIN
        IF routine IS NULL THEN
            RAISE EXCEPTION 'migration {revision}: no function %.{function}', '{schema}';
        END IF;
        definition := pg_get_functiondef(routine);
        found := (length(definition) - length(replace(definition, '{old}', '')))
                 / length('{old}');
        IF found <> {expected} THEN
            RAISE EXCEPTION 'migration {revision}: {name} has "%" % times, not {expected}',
                '{old}', found;
        END IF;
        EXECUTE replace(definition, '{old}', '{new}');
    END
    $rewrite$
    """
