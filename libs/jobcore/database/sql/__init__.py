"""Named SQL statements, one module per table they change (``jobs``: a package, one module
per part of a job's life). Only the stores (:mod:`jobcore.database.store`) import them, and run
them.

Every statement is a :class:`Query`: a name, a one-line purpose, and the SQL itself, with
psycopg named parameters (``%(name)s``). A query is generic over the ``TypedDict`` of its
parameters; calling it with them gives a :class:`Statement` (``JOB_GET({"id": ..., "tenant":
...})``), so a call site that forgets, misspells or mistypes one fails type checking.
Statements run through one gateway, :func:`jobcore.database.gateway.execute`,
:func:`~jobcore.database.gateway.fetch_one` and :func:`~jobcore.database.gateway.fetch_all`, on a
session, a unit of work or a raw connection alike. The hot paths stay readable as SQL.

The modules, by the table they change: :mod:`.jobs` (a package: a module per part of a
job's life), :mod:`.outbox`, :mod:`.inbox`, :mod:`.job_events`, :mod:`.job_gates`, :mod:`.job_keys`,
:mod:`.webhook_deliveries`, :mod:`.webhook_endpoints`, :mod:`.tenant_webhook_secrets`,
:mod:`.tenant_quotas` (with ``tenant_usage``), :mod:`.api_keys`, :mod:`.audit_log`,
:mod:`.schedules`, :mod:`.batches`, :mod:`.flow_pauses`, :mod:`.maintenance_leases`,
:mod:`.job_type_registry` (what the workers declare for ``jobcore.enqueue()``),
:mod:`.workflows` (workflows, their jobs and edges), :mod:`.ledger` (the
example job type's tables); and those that change no table of ours: :mod:`.console` (the
console's reads), :mod:`.database_health`, :mod:`.compaction` and :mod:`.planner_statistics`
(PostgreSQL's statistics), :mod:`.transactions` (the transaction they run in).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar

from psycopg.types.json import Jsonb

from jobcore.database.statement_spans import name_statement
from jobcore.kernel.states import TERMINAL, JobStatus

# The terminal statuses as an SQL list, for `status IN ...` (jobcore.kernel.states.TERMINAL).
TERMINAL_SQL = "(" + ", ".join(f"'{status}'" for status in JobStatus if status in TERMINAL) + ")"
# The others: the statuses in which a job holds its unique key (jobs_unique_uidx).
LIVE_SQL = "(" + ", ".join(f"'{status}'" for status in JobStatus if status not in TERMINAL) + ")"


def status_is(column: str, status: JobStatus) -> str:
    """SQL for "the job's ``column`` is ``status``" in a statement that reaches its jobs by
    id: the same test (the column is NOT NULL), but one no index answers, so the job is
    found through its primary key whatever the statistics say.

    ANALYZE mostly runs while few jobs are pending or running (they finish within
    moments), so the statistics see almost none, and a generic plan (prepared once per
    connection, jobcore.database.gateway) then reached the jobs of ``jobs.id = ... AND jobs.status =
    'pending'`` through the status index (``jobs_status_created_not_running_idx`` today;
    for ``'running'``, the partial ``jobs_lease_expiry_idx``), reading every pending job
    per claim: a backlog made each claim slower, until autovacuum analyzed the table
    again. No index matches ``(...) IS TRUE``.
    """
    return f"({column} = '{status.value}') IS TRUE"


# Literals and quoted identifiers (kept as they are), comments and runs of whitespace.
_LEXEME = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|(?:--[^\n]*|/\*.*?\*/|\s+)+", re.DOTALL)


def compact(text: str) -> str:
    """``text`` with its comments dropped and each run of whitespace made one space (or
    one newline, where it held one), outside literals and quoted identifiers.

    psycopg converts a query's ``%(name)s`` placeholders on every execution, and caches
    the conversion only for a query of at most 4,096 bytes
    (``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``): the indented enqueue statement
    was longer, and re-parsing it was a large share of the API's CPU per request
    (docs/bench/measurements.md, "Statements within psycopg's cache").
    """

    def one(match: re.Match[str]) -> str:
        lexeme = match.group(0)
        if lexeme[0] in "'\"":
            return lexeme
        # A newline stays a newline: two string constants separated by whitespace with a
        # newline are one constant in SQL ('a'\n'b' is 'ab'), and a syntax error without it.
        return "\n" if "\n" in lexeme else " "

    return _LEXEME.sub(one, text).strip()


# psycopg caches its conversion of a query's placeholders only up to this many bytes
# (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH; a unit test keeps the two equal).
PSYCOPG_CACHED_QUERY_BYTES = 4096
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


def native_placeholders(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with PostgreSQL's own placeholders (``$1``...) for its ``%(name)s`` ones (a
    name used twice is one parameter) and ``%`` for ``%%``; and the names, in ``$`` order.

    For statements too long for psycopg's conversion cache: converted here once, they run
    through a raw cursor (``psycopg.AsyncRawCursor``), which converts nothing. The
    worker's claim (over 4,096 bytes) was parsed again on every batch.
    """
    names: dict[str, int] = {}

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        return f"${names.setdefault(name, len(names) + 1)}"

    return _PLACEHOLDER.sub(one, sql), tuple(names)


# Contravariant: a query that takes fewer parameters also takes a dict with more.
P = TypeVar("P", bound=Mapping[str, Any], contravariant=True)


# No slots: ``Query[Params](...)`` sets ``__orig_class__``, which a frozen slotted class
# refuses with a TypeError that typing does not expect.
@dataclass(frozen=True)
class Query(Generic[P]):
    name: str
    purpose: str
    sql: str
    # Planned once per connection where the pool plans generically (jobcore.database.gateway,
    # ``Database(generic_plans=True)``): a statement that looks rows up by key alone, whose
    # plan for one set of parameters serves every other.
    generic_plan: bool = False
    # A statement too long for psycopg's conversion cache, with native placeholders and
    # their parameters' names (native_placeholders); None for the others.
    native: tuple[str, tuple[str, ...]] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sql", compact(self.sql))
        if len(self.sql.encode()) > PSYCOPG_CACHED_QUERY_BYTES:
            object.__setattr__(self, "native", native_placeholders(self.sql))
        # Its spans are named after it (jobcore.database.statement_spans), as the text it is sent
        # as.
        name_statement(self.sql, self.name)
        if self.native is not None:
            name_statement(self.native[0], self.name)

    def __str__(self) -> str:
        return self.name

    def __call__(self, params: P) -> Statement:
        """This statement with its parameters, ready for the gateway (jobcore.database.gateway)."""
        return Statement(self, params)


@dataclass(frozen=True, slots=True)
class Statement:
    """A named query bound to its parameters."""

    query: Query[Any]
    params: Mapping[str, Any]


class NoParams(TypedDict):
    """The parameters of a statement that takes none: pass ``{}``."""


class CompletionParams(TypedDict):
    """What every statement that ends a job needs for its completion webhook
    (:data:`jobcore.database.sql.webhook_deliveries.COMPLETION_WEBHOOKS`)."""

    webhook_exchange: str
    webhook_routing_key: str
    webhook_max_attempts: int
    webhook_outbox_channel: str


class OutboxMessagesParams(TypedDict):
    """Many outbox messages as parallel arrays, one element per job
    (:func:`jobcore.usecases.enqueue.write_one.message_columns`)."""

    message_ids: list[uuid.UUID]
    exchanges: list[str]
    routing_keys: list[str]
    message_types: list[str]
    headers: list[Jsonb]
    bodies: list[bytes]


class OutboxMessageParams(TypedDict):
    """The columns of one outbox message
    (:func:`jobcore.usecases.enqueue.write_one.message_row`)."""

    message_id: uuid.UUID
    exchange: str
    routing_key: str
    message_type: str
    headers: Jsonb
    body: bytes
