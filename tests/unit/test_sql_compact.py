"""Named statements are stored compacted (jobcore.database.sql.compact), so psycopg caches the
conversion of their placeholders: the hot paths' statements must stay within its limit."""

from __future__ import annotations

from psycopg._queries import (
    MAX_CACHED_STATEMENT_LENGTH,
    MAX_CACHED_STATEMENT_PARAMS,
    PostgresQuery,
)
from psycopg.adapt import Transformer

from jobcore.database.sql import PSYCOPG_CACHED_QUERY_BYTES, Query, compact, native_placeholders
from jobcore.database.sql.api_keys import API_KEY_AUTHENTICATE
from jobcore.database.sql.jobs.enqueue import JOB_INSERT, JOB_INSERT_APPROXIMATE, JobInsertParams
from jobcore.database.sql.jobs.run import JOB_CLAIM_MANY, JobClaimManyParams


def test_compact_drops_comments_and_whitespace_but_keeps_literals() -> None:
    text = """
        SELECT 'a  --  b', "odd  name"   -- the job's id
        FROM jobs /* many
        lines */ WHERE note = 'it''s   here'
    """
    assert compact(text) == (
        """SELECT 'a  --  b', "odd  name"\nFROM jobs\nWHERE note = 'it''s   here'"""
    )


def test_compact_keeps_string_constants_that_continue_on_the_next_line_apart() -> None:
    """'a'<newline>'b' is the one constant 'ab' in SQL; 'a' 'b' on one line is an error."""
    text = """
        SELECT 'the relay '
               'retries it',   'x'
    """
    assert compact(text) == "SELECT 'the relay '\n'retries it', 'x'"


def test_a_query_keeps_its_compacted_text() -> None:
    query = Query[dict[str, int]]("q", "A test.", "\n  SELECT %(n)s  -- n\n   + 1\n")
    assert query.sql == "SELECT %(n)s\n+ 1"


def test_the_enqueue_path_statements_fit_psycopgs_conversion_cache_or_go_native() -> None:
    assert len(API_KEY_AUTHENTICATE.sql.encode()) <= MAX_CACHED_STATEMENT_LENGTH
    # Past the cache's limit (the tenant usage admission, migration 0023), the enqueue runs
    # with native placeholders, converted once: no conversion per request either way.
    for insert in (JOB_INSERT, JOB_INSERT_APPROXIMATE):
        assert len(insert.sql.encode()) <= MAX_CACHED_STATEMENT_LENGTH or insert.native
    assert len(JobInsertParams.__annotations__) <= MAX_CACHED_STATEMENT_PARAMS


def test_psycopgs_cache_limit_is_the_one_the_queries_assume() -> None:
    assert PSYCOPG_CACHED_QUERY_BYTES == MAX_CACHED_STATEMENT_LENGTH


def test_native_placeholders_number_each_name_once_and_unescape_percent() -> None:
    sql, names = native_placeholders("SELECT %(a)s, %(b)s, %(a)s, 'x%%y' WHERE c = %(c)s")
    assert sql == "SELECT $1, $2, $1, 'x%y' WHERE c = $3"
    assert names == ("a", "b", "c")


def test_statements_past_the_cache_limit_carry_psycopgs_own_conversion() -> None:
    """The worker's claim runs with native placeholders: the same text psycopg would send."""
    assert JOB_CLAIM_MANY.native is not None
    assert API_KEY_AUTHENTICATE.native is None
    sql, names = JOB_CLAIM_MANY.native
    params = {name: None for name in names}
    converted = PostgresQuery(Transformer())
    converted.convert(JOB_CLAIM_MANY.sql, params)
    assert converted.query == sql.encode()
    assert set(names) == set(JobClaimManyParams.__annotations__)
