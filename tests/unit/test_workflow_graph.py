"""The workflow graph's checks and its drawing order, as pure functions."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from jobcore.execution.registry import Registry
from jobcore.kernel.errors import InvalidWorkflow
from jobcore.usecases.enqueue.submit import EnqueueRequest
from jobcore.usecases.workflows import (
    Dependency,
    EdgePolicy,
    WorkflowStep,
    check_graph,
    graph_levels,
)

REGISTRY = Registry()


class Empty(BaseModel):
    pass


@REGISTRY.job("graph_step", payload=Empty)
async def graph_step(ctx: Any) -> None:
    return None


def step(name: str, *deps: str, final: bool = False, policy: str = "on_success") -> WorkflowStep:
    kind = REGISTRY.get("graph_step")
    request = EnqueueRequest(tenant="t", job_type=kind, payload=Empty())
    return WorkflowStep(
        name, request, [Dependency(d, EdgePolicy(policy)) for d in deps], is_finally=final
    )


def test_a_diamond_is_ordered_after_its_dependencies() -> None:
    order = check_graph([step("d", "b", "c"), step("b", "a"), step("c", "a"), step("a")])
    assert order.index("a") < order.index("b") < order.index("d")
    assert order.index("c") < order.index("d")


@pytest.mark.parametrize(
    ("steps", "kind", "words"),
    [
        ([step("a", "b"), step("b", "a")], "cycle", "cycle through 'a', 'b'"),
        ([step("a", "a")], "cycle", "depends on itself"),
        ([step("a"), step("a")], "duplicate", "duplicate job name 'a'"),
        ([step("a"), step("b", "a", "a")], "duplicate", "depends on 'a' twice"),
        ([step("a", "x")], "unknown", "unknown job 'x'"),
        ([step("a"), step("f", "a", final=True)], "finally", "takes no depends_on"),
        ([step("f", final=True), step("a", "f")], "finally", "depends on finally job"),
        ([], "size", "1 to"),
    ],
)
def test_what_is_refused(steps: list[WorkflowStep], kind: str, words: str) -> None:
    with pytest.raises(InvalidWorkflow) as refused:
        check_graph(steps)
    assert refused.value.kind == kind
    assert words in str(refused.value)


def test_a_long_chain_is_checked_and_laid_out_without_recursion() -> None:
    n = 5000
    steps = [step("s0"), *(step(f"s{i}", f"s{i - 1}") for i in range(1, n))]
    assert check_graph(steps)[-1] == f"s{n - 1}"
    jobs = [
        {
            "name": s.name,
            "is_finally": False,
            "depends_on": [{"name": d.name} for d in s.depends_on],
        }
        for s in steps
    ]
    levels = graph_levels(jobs)
    assert len(levels) == n
    assert levels[-1] == [f"s{n - 1}"]


def test_finally_jobs_get_the_last_column() -> None:
    jobs = [
        {"name": "a", "depends_on": []},
        {"name": "b", "depends_on": [{"name": "a"}]},
        {"name": "z", "is_finally": True, "depends_on": []},
    ]
    assert graph_levels(jobs) == [["a"], ["b"], ["z"]]
