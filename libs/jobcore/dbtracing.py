"""Database statements as spans, named after their :class:`~jobcore.sql.Query`.

A psycopg cursor class that wraps ``execute`` in a CLIENT span whose name and
``db.statement`` are the statement's Query name (``job_claim_many``, ``job_succeed_many``):
cheaper than the SQL text and what an operator searches for. Transaction control
(``BEGIN``, ``COMMIT``) and ad-hoc statements are named by their first keyword.

A statement makes a span only inside a recorded span (a request, a publish, a consume):
pool health checks, relay polls and other background statements would otherwise start
a trace of their own every few milliseconds. With tracing off the pool keeps psycopg's
own cursor class and nothing here runs.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Self

import psycopg
from opentelemetry import trace
from psycopg import sql
from psycopg.rows import DictRow

from jobcore.telemetry import tracer, tracing_enabled

DB_SYSTEM = "postgresql"
_names: dict[str, str] | None = None


def _statement_names() -> dict[str, str]:
    """SQL text -> Query name, for every Query in the ``jobcore.sql`` modules."""
    global _names
    if _names is None:
        import jobcore.sql as package
        from jobcore.sql import Query

        names: dict[str, str] = {}
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for value in vars(module).values():
                if isinstance(value, Query):
                    names[value.sql] = value.name
        _names = names
    return _names


def statement_name(query: Any) -> str:
    if isinstance(query, str):
        name = _statement_names().get(query)
        if name is not None:
            return name
        words = query.split(None, 1)
        return words[0].upper() if words else "EMPTY"
    if isinstance(query, sql.Composable):
        return "SQL"
    return type(query).__name__


class TracedCursor(psycopg.AsyncCursor[DictRow]):
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
        name = statement_name(query)
        with tracer().start_as_current_span(
            name,
            kind=trace.SpanKind.CLIENT,
            attributes={"db.system": DB_SYSTEM, "db.statement": name},
        ):
            return await super().execute(query, params, prepare=prepare, binary=binary)


def cursor_options() -> dict[str, Any]:
    """Extra connection arguments for a pool: the traced cursor when tracing is on."""
    return {"cursor_factory": TracedCursor} if tracing_enabled() else {}
