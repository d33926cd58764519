"""Which database schemas this jobcore runs against: its own, older ones, and those of at
most one release newer (docs/operations.md, "Upgrades").

A rolling upgrade migrates first, then replaces processes one at a time, so the previous
release's processes run (and restart) against the new schema. Two releases apart is not
supported: the later one may have contracted what the older one still uses.

The running code knows its own migration revisions, but not those of releases after it.
So `jobcore migrate` writes what a reader needs into the database, in the migration's own
transaction (migrations/env.py): a JSON comment on Alembic's ``alembic_version`` table (in
jobcore's schema; an installation moved from ``public`` keeps a view of it there, commented
alike, for the previous release's processes, which read it unqualified) naming the
schema's revision and release, and the revision of the release before it
(:data:`jobcore.database.release_history.RELEASES`), the oldest code the schema runs with. A comment
rather than a table: no migration of its own, nothing outside the library's metadata
(tests/integration/test_migrations.py compares them), and it sits beside the revision it
describes, which Alembic alone writes. A process whose migrations include that
"runs with" revision is at most one release behind and starts; one that does not know
it, or a schema at a revision it does not know and without the comment (migrated by hand
with `alembic`), is refused with one line (:class:`SchemaTooNew`). `jobcore migrate`
itself is never refused.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import orjson
import psycopg

from jobcore.database.gateway import (
    AsyncConn,
    Database,
    connect_options,
    schema_of,
    translate_errors,
)
from jobcore.database.migrate import migrations_dir
from jobcore.database.release_history import RELEASES, Release, previous_release
from jobcore.kernel.errors import ConfigurationError, DatabaseUnavailable, JobcoreError
from jobcore.kernel.settings import Settings
from jobcore.kernel.startstop import Service


def read_marker(schema: str) -> str:
    """Read by every checked start: one round trip, and no error when Alembic never ran
    here. ``schema`` is a plain identifier (jobcore.kernel.settings checks it)."""
    table = f"{schema}.alembic_version"
    return (
        f"SELECT to_regclass('{table}') IS NOT NULL AS migrated, "
        f"obj_description(to_regclass('{table}'), 'pg_class') AS marker"
    )


def read_revision(schema: str) -> str:
    return f"SELECT version_num FROM {schema}.alembic_version LIMIT 1"


class SchemaTooNew(ConfigurationError):
    """The database schema is newer than this jobcore supports."""


@dataclass(frozen=True)
class Marker:
    """What `jobcore migrate` records about the schema it left."""

    revision: str
    release: str
    # The oldest code the schema runs with: the revision and version of its previous release.
    runs_with: str
    runs_with_release: str

    def comment(self) -> str:
        return orjson.dumps(
            {
                "revision": self.revision,
                "release": self.release,
                "runs_with": self.runs_with,
                "runs_with_release": self.runs_with_release,
            }
        ).decode()

    @classmethod
    def parse(cls, text: str | None) -> Marker | None:
        if not text:
            return None
        try:
            data = orjson.loads(text)
            return cls(
                revision=str(data["revision"]),
                release=str(data["release"]),
                runs_with=str(data["runs_with"]),
                runs_with_release=str(data["runs_with_release"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None


def own_version() -> str:
    try:
        return importlib.metadata.version("jobcore")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout not installed
        return "unknown"


@dataclass(frozen=True)
class _Revisions:
    """The migration graph, read from the revision files' two assignments rather than
    through Alembic: every process checks its schema at start-up, and importing Alembic
    and each migration module would weigh on every start."""

    parents: dict[str, str | None]

    def head(self) -> str:
        children = {parent for parent in self.parents.values() if parent is not None}
        heads = sorted(set(self.parents) - children)
        if len(heads) != 1:
            raise ConfigurationError(f"the migrations have {len(heads)} heads: {heads}")
        return heads[0]

    def ancestors(self, revision: str) -> set[str]:
        """``revision`` and every revision before it."""
        seen: set[str] = set()
        current: str | None = revision
        while current is not None and current not in seen:
            seen.add(current)
            current = self.parents.get(current)
        return seen


def _assignments(path: Path) -> dict[str, object]:
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        if isinstance(target, ast.Name) and target.id in {"revision", "down_revision"}:
            found[target.id] = ast.literal_eval(value) if value is not None else None
    return found


@functools.cache
def _revisions() -> _Revisions:
    parents: dict[str, str | None] = {}
    for path in sorted((migrations_dir() / "versions").glob("*.py")):
        found = _assignments(path)
        revision, down = found.get("revision"), found.get("down_revision")
        if isinstance(revision, str) and (down is None or isinstance(down, str)):
            parents[revision] = down
    return _Revisions(parents)


@functools.cache
def known_revisions() -> frozenset[str]:
    """Every migration revision this code ships."""
    return frozenset(_revisions().parents)


def own_head() -> str:
    return _revisions().head() if _revisions().parents else "base"


def marker_after_migration(
    revision: str,
    *,
    version: str | None = None,
    releases: tuple[Release, ...] = RELEASES,
) -> Marker:
    """The marker `jobcore migrate` writes once the schema is at ``revision``: it runs with
    the previous release's code when ``revision`` includes that release's migrations (else,
    migrated to an older revision on purpose, with code that has this revision)."""
    version = version or own_version()
    previous = previous_release(version, releases)
    ancestors = _revisions().ancestors(revision)
    if previous is not None and previous.revision in ancestors:
        return Marker(revision, version, previous.revision, previous.version)
    return Marker(revision, version, revision, version)


def refusal(
    revision: str | None,
    marker: Marker | None,
    *,
    known: frozenset[str],
    version: str,
    head: str,
) -> str | None:
    """Why this code (``version`` at ``head``, shipping ``known``) must not run against a
    schema at ``revision`` described by ``marker``; None when it may."""
    if revision is None or revision in known:
        return None  # empty, this code's own schema, or an older one
    this = f"this is jobcore {version} (schema revision {head})"
    if marker is None or marker.revision != revision:
        return (
            f"the database schema is at revision {revision}, which {this} does not know and "
            "which records no release (migrated without `jobcore migrate`?): refusing to "
            "run against a newer schema; upgrade jobcore"
        )
    if marker.runs_with in known:
        return None  # at most one release ahead
    return (
        f"the database schema is jobcore {marker.release}'s (revision {revision}), which runs "
        f"with jobcore {marker.runs_with_release} (revision {marker.runs_with}) or newer; "
        f"{this}, more than one release older: upgrade jobcore"
    )


def _refusal_here(revision: str | None, marker_text: str | None) -> str | None:
    return refusal(
        revision,
        Marker.parse(marker_text),
        known=known_revisions(),
        version=own_version(),
        head=own_head(),
    )


def _check(revision: str | None, marker_text: str | None) -> None:
    reason = _refusal_here(revision, marker_text)
    if reason is not None:
        raise SchemaTooNew(reason)


def read_schema(settings: Settings) -> tuple[str | None, str | None]:
    """The schema's revision (None before the first migration) and its marker's text."""
    with (
        translate_errors(settings),
        psycopg.connect(
            settings.database_url,
            autocommit=True,
            connect_timeout=max(1, int(settings.db_connect_timeout)),
            application_name="jobcore-schema-check",
            **connect_options(settings),
        ) as conn,
    ):
        schema = settings.database_schema
        migrated, marker = conn.execute(read_marker(schema)).fetchone() or (False, None)
        row = conn.execute(read_revision(schema)).fetchone() if migrated else None
    return (str(row[0]) if row else None), marker


def newer_schema(settings: Settings) -> tuple[str, Marker | None, str | None] | None:
    """For `jobcore migrate`: None when this code knows the schema's revision (or there is
    none yet); else the revision, its marker and why this code must not run against it
    (None: one release newer, which it runs with)."""
    revision, marker = read_schema(settings)
    if revision is None or revision in known_revisions():
        return None
    return revision, Marker.parse(marker), _refusal_here(revision, marker)


def check_schema(settings: Settings, *, unreachable_ok: bool = False) -> None:
    """Refuse (:class:`SchemaTooNew`) a schema more than one release newer than this code.

    With ``unreachable_ok``, a database that cannot be reached is not checked here (the API
    and workers start while it is down and wait for it): their pools make the check on
    their first connection instead (:class:`SchemaWatch`); else that raises
    :class:`~jobcore.kernel.errors.DatabaseUnavailable` as any command would.
    """
    try:
        revision, marker = read_schema(settings)
    except DatabaseUnavailable:
        if unreachable_ok:
            return
        raise
    _check(revision, marker)


async def check_schema_on(conn: AsyncConn) -> None:
    """:func:`check_schema` on an open connection (dict rows) of a pool, which knows the
    schema (jobcore.database.gateway.schema_of)."""
    schema = schema_of(conn)
    cursor = await conn.execute(read_marker(schema))
    found = await cursor.fetchone()
    revision = None
    if found is not None and found["migrated"]:
        row = await (await conn.execute(read_revision(schema))).fetchone()
        revision = str(row["version_num"]) if row else None
    _check(revision, found["marker"] if found else None)


class SchemaWatch(Service):
    """Ends when a pool of ``dbs``, opened with ``first_check=check_schema_on``, refused the
    schema on its first connection: a service that ends stops the process
    (:func:`jobcore.kernel.startstop.run_until_signalled`), which then raises :meth:`refusal`. The
    start-up check of a process that started while the database was down."""

    name = "schema-watch"

    def __init__(self, *dbs: Database) -> None:
        super().__init__()
        self.dbs = dbs

    async def run(self) -> None:
        waits = {asyncio.ensure_future(db.refused.wait()) for db in self.dbs}
        waits.add(asyncio.ensure_future(self.stopping.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def refusal(self) -> JobcoreError | None:
        return next((db.refusal for db in self.dbs if db.refusal is not None), None)
