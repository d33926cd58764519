"""Named SQL statements, one module per table group.

Every statement is a :class:`Query`: a name, a one-line purpose, and the SQL itself, with
psycopg named parameters (``%(name)s``). The hot paths stay readable as SQL.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Query:
    name: str
    purpose: str
    sql: str

    def __str__(self) -> str:
        return self.name
