"""Priority levels: names and numbers in, the weights the relay's claim shares by."""

from __future__ import annotations

import pytest

from jobcore.execution.registry import Registry
from jobcore.kernel.priorities import DEFAULT_PRIORITY, LABELS, WEIGHTS, Priority
from jobcore.testing.jobtypes import EchoPayload, echo


@pytest.mark.parametrize(
    ("given", "expected"),
    [("high", Priority.HIGH), (" Low ", Priority.LOW), ("1", Priority.NORMAL), (2, Priority.HIGH)],
)
def test_a_level_is_named_or_numbered(given: str | int, expected: Priority) -> None:
    assert Priority.parse(given) is expected


@pytest.mark.parametrize("given", ["urgent", "", "3", -1, 7])
def test_anything_else_is_refused(given: str | int) -> None:
    with pytest.raises(ValueError, match="priority"):
        Priority.parse(given)


def test_higher_levels_weigh_more_and_every_level_has_a_share() -> None:
    assert set(WEIGHTS) == set(Priority)
    assert WEIGHTS[Priority.HIGH] > WEIGHTS[Priority.NORMAL] > WEIGHTS[Priority.LOW] >= 1
    assert LABELS == ("low", "normal", "high")
    assert DEFAULT_PRIORITY is Priority.NORMAL


def test_a_job_type_takes_its_default_priority_from_the_decorator() -> None:
    registry = Registry()
    registry.job("urgent_echo", payload=EchoPayload, priority="high")(echo)
    registry.job("plain_echo", payload=EchoPayload)(echo)
    assert registry.get("urgent_echo").priority is Priority.HIGH
    assert registry.get("plain_echo").priority is DEFAULT_PRIORITY
    with pytest.raises(ValueError, match="unknown priority"):
        registry.job("bad_echo", payload=EchoPayload, priority="urgent")(echo)
