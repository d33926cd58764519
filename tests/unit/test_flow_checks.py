"""The flow-control tests' checks (tests.support.flow) and the gate keys (jobcore.kernel.gates)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobcore.kernel.gates import Limit, Rate, gate_key
from tests.support.flow import max_overlap, most_starts_in_a_second, order_violations

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_max_overlap_counts_shared_instants_but_not_a_handover() -> None:
    assert max_overlap([(at(0), at(2)), (at(1), at(3)), (at(1.5), at(4))]) == 3
    assert max_overlap([(at(0), at(1)), (at(1), at(2))]) == 1
    assert max_overlap([]) == 0


def test_most_starts_in_a_second_is_a_sliding_window() -> None:
    starts = [at(0), at(0.25), at(0.5), at(0.75), at(1.0), at(1.25)]
    assert most_starts_in_a_second(starts) == 4
    assert most_starts_in_a_second([*starts, at(0.99)]) == 5


def test_order_violations_name_a_job_that_started_early() -> None:
    rows = [
        {
            "tenant": "t",
            "ordering_key": "k",
            "ordering_seq": 1,
            "id": 1,
            "started_at": at(0),
            "finished_at": at(1),
        },
        {
            "tenant": "t",
            "ordering_key": "k",
            "ordering_seq": 2,
            "id": 2,
            "started_at": at(2),
            "finished_at": at(3),
        },
    ]
    assert order_violations(rows) == []
    rows[1]["started_at"] = at(0.5)
    assert len(order_violations(rows)) == 1


def test_gate_keys_separate_types_tenants_and_payload_values() -> None:
    where = {"type_name": "mail", "tenant": "a", "payload": {"account": 7}}
    assert gate_key("concurrency", "type", **where) == "concurrency:mail"
    assert gate_key("concurrency", "tenant", **where) == "concurrency:mail:tenant=a"
    assert gate_key("rate", "account", **where) == "rate:mail:tenant=a:account=7"
    other_tenant = {**where, "tenant": "b"}
    assert gate_key("rate", "account", **where) != gate_key("rate", "account", **other_tenant)
    assert gate_key("rate", "missing", **where).endswith("missing=null")
    long_a = gate_key("rate", "account", **{**where, "payload": {"account": "x" * 300}})
    long_b = gate_key("rate", "account", **{**where, "payload": {"account": "x" * 299 + "y"}})
    assert len(long_a) <= 255
    assert long_a != long_b


def test_declarations_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="concurrency limit"):
        Limit(0)
    with pytest.raises(ValueError, match="rate limit"):
        Rate(0)
    with pytest.raises(ValueError, match="burst"):
        Rate(1, burst=0)
