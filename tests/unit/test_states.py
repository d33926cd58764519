import itertools

import pytest

from jobcore.kernel.errors import IllegalTransition
from jobcore.kernel.states import TERMINAL, JobStatus, can_transition, check_transition, is_terminal

S = JobStatus
EXPECTED_ALLOWED = {
    (S.PENDING, S.RUNNING),
    (S.PENDING, S.CANCELLED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.CANCELLED),
    (S.RUNNING, S.PENDING),
}


@pytest.mark.parametrize(("source", "target"), list(itertools.product(S, S)))
def test_every_pair_of_states(source: JobStatus, target: JobStatus) -> None:
    allowed = (source, target) in EXPECTED_ALLOWED
    assert can_transition(source, target) is allowed
    if allowed:
        check_transition(source, target)
    else:
        with pytest.raises(IllegalTransition, match=f"from {source} to {target}"):
            check_transition(source, target)


def test_terminal_states_have_no_way_out() -> None:
    assert {S.SUCCEEDED, S.FAILED, S.CANCELLED} == TERMINAL
    for state, target in itertools.product(TERMINAL, S):
        assert not can_transition(state, target)
    assert not is_terminal("pending")
    assert not is_terminal("running")
    assert is_terminal("cancelled")


def test_unknown_status_is_rejected() -> None:
    with pytest.raises(ValueError, match="bogus"):
        can_transition("bogus", "running")
