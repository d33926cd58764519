"""Every runtime statement names jobcore's tables and functions with their schema.

Behind PgBouncer in transaction mode no per-connection search_path holds, and in an
application's database ``jobs`` may be the application's own table: a statement that
says ``FROM jobs`` would read it. So each statement of :mod:`jobcore.database.sql` writes
``jobcore.jobs`` (the gateway rewrites the qualifier for another configured schema).
The testing kit's pipeline check (:mod:`jobcore.testing.pipeline`) is read too. Run alone:
``.venv/bin/pytest tests/unit/test_sql_schema_qualified.py`` (``make lint`` runs it).
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

import jobcore.database.sql as sql_package
from jobcore.database.gateway import in_schema
from jobcore.database.schema import metadata
from jobcore.database.sql import Query
from jobcore.kernel.settings import DEFAULT_SCHEMA

TABLES = frozenset(table.name for table in metadata.sorted_tables) | {"alembic_version"}
# Literals and quoted identifiers, blanked before the check.
_LITERAL = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")
_TOKEN = re.compile(r"\w+(?:\s*\.\s*\w+)?|[(),;]|\S")
# Where a relation is named: the word after one of these.
_RELATION_BEFORE = {"from", "join", "into", "update", "using", "table", "truncate", "analyze"}
_RELATION_SKIP = {"only", "lateral"}
# Words that end a FROM list (the items of which are separated by commas).
_FROM_ENDS = {
    "where",
    "group",
    "order",
    "limit",
    "having",
    "window",
    "union",
    "for",
    "returning",
    "on",
    "join",
    "set",
    "offset",
    "except",
    "intersect",
    "inner",
    "left",
    "right",
    "full",
    "cross",
    "natural",
    "do",
    "values",
    "select",
}
_FUNCTION = re.compile(r"(?<![\w.])(jobcore_\w+|batch_\w+|enqueue)\s*\(")


def unqualified(text: str) -> list[str]:
    """The names of jobcore's tables and functions that ``text`` uses without a schema."""
    blanked = _LITERAL.sub("''", text)
    found = [match.group(1) for match in _FUNCTION.finditer(blanked)]
    tokens = [token.lower() for token in _TOKEN.findall(blanked)]
    in_from_list = False
    depth_of_list = 0
    depth = 0
    expect_relation = False
    for index, token in enumerate(tokens):
        if token == "(":
            depth += 1
            expect_relation = False
            continue
        if token == ")":
            depth -= 1
            if depth < depth_of_list:
                in_from_list = False
            continue
        if expect_relation and token in _RELATION_SKIP:
            continue
        if expect_relation:
            expect_relation = False
            if token in TABLES:
                found.append(token)
        if token in _FROM_ENDS and depth == depth_of_list:
            in_from_list = False
        if token in _RELATION_BEFORE:
            expect_relation = True
            if token == "from":
                in_from_list = True
                depth_of_list = depth
        elif token == "," and in_from_list and depth == depth_of_list:
            expect_relation = True
        del index
    return found


def _queries() -> list[Query[object]]:
    queries: dict[int, Query[object]] = {}
    names = [
        m.name for m in pkgutil.walk_packages(sql_package.__path__, f"{sql_package.__name__}.")
    ]
    for name in [*names, "jobcore.testing.pipeline"]:
        for value in vars(importlib.import_module(name)).values():
            for query in value if isinstance(value, tuple) else (value,):
                if isinstance(query, Query):
                    queries[id(query)] = query
    return sorted(queries.values(), key=lambda query: query.name)


QUERIES = _queries()


def test_every_module_of_statements_was_read() -> None:
    assert len(QUERIES) > 120


@pytest.mark.parametrize("query", QUERIES, ids=lambda query: query.name)
def test_statement_names_jobcore_tables_with_their_schema(query: Query[object]) -> None:
    assert unqualified(query.sql) == [], (
        f"{query.name}: name jobcore's tables and functions as {DEFAULT_SCHEMA}.<name>"
    )


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("SELECT id FROM jobs WHERE id = 1", ["jobs"]),
        ("SELECT 1 FROM jobcore.jobs j, outbox o WHERE j.id = o.job_id", ["outbox"]),
        ("INSERT INTO inbox (consumer) VALUES ('x')", ["inbox"]),
        ("UPDATE ONLY jobs SET status = 'x'", ["jobs"]),
        ("DELETE FROM jobcore.outbox USING job_gates g WHERE true", ["job_gates"]),
        ("SELECT * FROM jobcore.jobs JOIN outbox ON true", ["outbox"]),
        ("SELECT jobcore_tenant_at_cap('a', 1)", ["jobcore_tenant_at_cap"]),
        ("WITH x AS (SELECT 1 FROM tenant_usage) SELECT * FROM x", ["tenant_usage"]),
        ("SELECT jobs.id FROM jobcore.jobs FOR UPDATE OF jobs SKIP LOCKED", []),
        ("SELECT 'FROM jobs' AS text, jobcore.jobcore_tenant_unfinished('t')", []),
        ("SELECT count(*) AS audit_log FROM jobcore.audit_log", []),
    ],
)
def test_the_check_finds_unqualified_names(text: str, names: list[str]) -> None:
    assert unqualified(text) == names


def test_another_schema_is_written_into_the_qualifiers_and_its_literal() -> None:
    text = (
        "SELECT current_setting('jobcore.job_events', true), \"jobcore\".x "
        "FROM jobcore.jobs JOIN jobcore.outbox ON true "
        "WHERE schemaname = 'jobcore' AND jobcore.jobcore_tenant_at_cap('jobcore.x', 1)"
    )
    assert in_schema(text, "tasks") == (
        "SELECT current_setting('jobcore.job_events', true), \"jobcore\".x "
        "FROM tasks.jobs JOIN tasks.outbox ON true "
        "WHERE schemaname = 'tasks' AND tasks.jobcore_tenant_at_cap('jobcore.x', 1)"
    )
    assert in_schema(text, DEFAULT_SCHEMA) is text
