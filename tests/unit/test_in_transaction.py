"""The blocking variant of jobcore.enqueue_in runs its coroutine without an event loop:
that holds only while every await completes at once, which is checked, not assumed."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from jobcore.usecases.enqueue.in_transaction import _run_to_end
from jobcore.usecases.enqueue.write_one import EnqueueResult


def test_a_coroutine_that_completes_at_once_gives_its_value() -> None:
    async def at_once() -> Any:
        return "done"

    assert cast(Any, _run_to_end(at_once())) == "done"


def test_a_coroutine_that_would_wait_for_an_event_loop_is_an_error() -> None:
    async def suspends() -> EnqueueResult:
        await asyncio.sleep(0)
        raise AssertionError("not resumed")

    with pytest.raises(RuntimeError, match="event loop"):
        _run_to_end(suspends())
