"""The pressure scenario's table of statements that suffered under the pin: one statement
is matched across the phases by its text's key, whatever queryid each phase counted it
under (services/bench/scenarios/pressure.py, STATEMENTS)."""

from __future__ import annotations

from typing import Any

from services.bench.scenarios.pressure import suffering_statements


def statement(key: str, calls: int, mean_ms: float, blocks: float = 4.0) -> dict[str, Any]:
    return {
        "key": key,
        "query": f"SELECT {key}",
        "calls": calls,
        "mean_ms": mean_ms,
        "total_ms": calls * mean_ms,
        "blocks_per_call": blocks,
    }


def test_statements_are_matched_by_text_and_ranked_by_the_time_the_pin_added() -> None:
    clean = [statement("claim", 500, 0.5), statement("enqueue", 500, 1.0)]
    pinned = [
        statement("claim", 500, 0.6),
        statement("enqueue", 500, 3.0, blocks=40.0),
        statement("new", 500, 9.0),  # not run in the clean phase: nothing to compare
        statement("rare", 10, 9.0),  # too few calls to say
    ]
    rows = suffering_statements(clean, pinned)
    assert [row[0] for row in rows] == ["SELECT enqueue", "SELECT claim"]
    assert rows[0][1:] == [500, 1.0, 3.0, 3.0, 4.0, 40.0]
