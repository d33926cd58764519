"""Database statements as CLIENT spans that follow the OpenTelemetry database conventions
(``docs/database/postgresql.md``).

A psycopg cursor class wraps ``execute`` in a span named by ``db.query.summary``: a
statement's :class:`~jobcore.sql.Query` name (``job_claim_many``, ``job_succeed_many``),
the low-cardinality summary the conventions let an instrumentation take from its own hooks,
cheaper than the SQL text and what an operator searches for. A statement that is no named
Query has no summary; its span is named by its operation (``SELECT``, ``BEGIN``).

Attributes: ``db.system.name`` (postgresql); ``db.operation.name`` when one operation
describes the statement (below); ``db.namespace``, the connection's database name (the
schema is not captured: jobcore sets none, and asking for it would cost a round trip);
``server.address`` / ``server.port`` of the connected host; on failure ``error.type`` and
``db.response.status_code``, the SQLSTATE, or the client exception's class name when the
server sent none.

A statement makes a span only inside a recorded span (a request, a publish, a process):
pool health checks, relay polls and other background statements would otherwise start
a trace of their own every few milliseconds. With tracing off the pool keeps psycopg's
own cursor class and nothing here runs.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Self

import psycopg
from opentelemetry import trace
from psycopg import sql
from psycopg.rows import DictRow

from jobcore.semconv import DB_SYSTEM, ERROR_TYPE, server_attributes
from jobcore.telemetry import tracer, tracing_enabled

# SQL text -> the name of the Query that sends it (name_statement).
_names: dict[str, str] = {}

# What the operation parser skips: string literals, quoted identifiers, comments.
_NOISE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.DOTALL)
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|[()]")
_READ = "SELECT"
_WRITES = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE"})
# The words that may follow a CTE's AS before the parenthesis of its body.
_CTE = frozenset({"AS", "MATERIALIZED"})


def name_statement(text: str, name: str) -> None:
    """Have statements sent as ``text`` summarised as ``name``: called by each named
    query (:class:`jobcore.sql.Query`) when it is made, so the tracer imports none."""
    _names[text] = name


def query_summary(text: str) -> str | None:
    """The Query name of this SQL text, if it is one of the library's statements."""
    return _names.get(text)


@functools.lru_cache(maxsize=1024)
def operation_name(text: str) -> str | None:
    """The one operation that describes a statement, or None when several do.

    The main statement's keyword (``SELECT``, ``INSERT``, ...), unless a common table
    expression writes: then the writes decide (``WITH c AS (UPDATE ...) SELECT ...`` is an
    ``UPDATE``), and writes of more than one kind have no single name. Subqueries that
    read do not count (``INSERT ... SELECT`` is an ``INSERT``). A statement without
    any of these is named by its first word (``BEGIN``, ``COMMIT``, ``SET``).
    """
    words = [w.upper() for w in _TOKEN.findall(_NOISE.sub(" ", text))]
    main: str | None = None
    writes: set[str] = set()
    depth = 0
    for i, word in enumerate(words):
        if word == "(":
            depth += 1
        elif word == ")":
            depth -= 1
        elif word in _WRITES or word == _READ:
            if depth == 0:
                main = main or word
            elif word in _WRITES and i > 1 and words[i - 1] == "(" and words[i - 2] in _CTE:
                writes.add(word)
    if writes:
        if main in _WRITES:
            writes.add(main)
        return writes.pop() if len(writes) == 1 else None
    if main is not None:
        return main
    keywords = [w for w in words if w not in ("(", ")")]
    return keywords[0] if keywords else None


def statement_name(query: Any) -> str:
    """A span name for a statement: its summary, else its operation, else the system."""
    if isinstance(query, str):
        return query_summary(query) or operation_name(query) or DB_SYSTEM
    if isinstance(query, sql.Composable):
        return "SQL"
    return type(query).__name__


def _error_type(exc: BaseException) -> tuple[str, str | None]:
    """``error.type`` and the SQLSTATE (None when the server answered none)."""
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        return sqlstate, sqlstate
    return type(exc).__qualname__, None


class TracedCursor(psycopg.AsyncCursor[DictRow]):
    def _span_attributes(self, query: Any) -> tuple[str, dict[str, Any]]:
        info = self.connection.info
        attributes: dict[str, Any] = {
            "db.system.name": DB_SYSTEM,
            "db.namespace": info.dbname,
            **server_attributes(info.host, info.port),
        }
        text = query.as_string(self) if isinstance(query, sql.Composable) else query
        if not isinstance(text, str):
            return DB_SYSTEM, attributes
        summary = query_summary(text)
        operation = operation_name(text)
        if summary:
            attributes["db.query.summary"] = summary
        if operation:
            attributes["db.operation.name"] = operation
        return summary or operation or DB_SYSTEM, attributes

    async def execute(
        self,
        query: Any,
        params: Any = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> Self:
        if not trace.get_current_span().is_recording():
            return await super().execute(query, params, prepare=prepare, binary=binary)
        name, attributes = self._span_attributes(query)
        with tracer().start_as_current_span(
            name, kind=trace.SpanKind.CLIENT, attributes=attributes
        ) as span:
            try:
                return await super().execute(query, params, prepare=prepare, binary=binary)
            except Exception as exc:
                error_type, sqlstate = _error_type(exc)
                span.set_attribute(ERROR_TYPE, error_type)
                if sqlstate is not None:
                    span.set_attribute("db.response.status_code", sqlstate)
                raise


def cursor_options() -> dict[str, Any]:
    """Extra connection arguments for a pool: the traced cursor when tracing is on."""
    return {"cursor_factory": TracedCursor} if tracing_enabled() else {}


class TracedRawCursor(psycopg.AsyncRawCursor[DictRow], TracedCursor):
    """The traced cursor for statements with native placeholders (jobcore.sql.Query.native)."""
