"""The worker's intake as pure logic, on a stand-in for the broker's consumer: when it
pauses, when it does not, and that a broker away or an error does not end it."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from jobcore.amqp.deliveries import JobQueueConsumer
from jobcore.testing.waiting import eventually
from services.worker.intake import Intake


class StandInBroker:
    """Records pauses and resumes; ``refuse`` resumes fail (the broker away), ``explode``
    raises once from the next resume."""

    def __init__(self) -> None:
        self.consuming = True
        self.pauses = 0
        self.resumes = 0
        self.refuse = 0
        self.explode = False
        self.pause_gate: asyncio.Event | None = None
        self.pausing = False

    async def pause(self) -> None:
        self.pausing = True
        if self.pause_gate is not None:
            await self.pause_gate.wait()
        self.pauses += 1
        self.consuming = False

    async def resume(self) -> bool:
        self.resumes += 1
        if self.explode:
            self.explode = False
            raise RuntimeError("unexpected")
        if self.refuse:
            self.refuse -= 1
            return False
        self.consuming = True
        return True


def intake_on(broker: StandInBroker, slots: int, pause_after: float) -> Intake:
    intake = Intake(cast(JobQueueConsumer, broker), slots, pause_after=pause_after)
    intake.start()
    return intake


async def _true(value: Any) -> bool:
    return bool(value)


async def test_a_worker_whose_slots_stay_busy_pauses_and_resumes_when_one_frees() -> None:
    broker = StandInBroker()
    intake = intake_on(broker, slots=2, pause_after=0.01)
    try:
        intake.handler_started()
        intake.handler_started()
        await eventually(lambda: _true(broker.pauses == 1), what="a pause")
        assert not broker.consuming
        intake.handler_ended()
        await eventually(lambda: _true(broker.consuming), what="a resume")
        assert broker.pauses == 1
    finally:
        await intake.stop()


async def test_slots_that_free_within_the_pause_delay_never_pause_the_worker() -> None:
    broker = StandInBroker()
    intake = intake_on(broker, slots=1, pause_after=60.0)
    try:
        for _ in range(20):  # a concurrency-1 worker running short jobs
            intake.handler_started()
            resumes = broker.resumes
            intake.handler_ended()
            # The intake saw the slot free (it checks it is consuming: a resume call).
            await eventually(lambda r=resumes: _true(broker.resumes > r), what="the free slot")
        assert broker.pauses == 0
        assert broker.consuming
    finally:
        await intake.stop()


async def test_a_refused_resume_is_tried_again_and_an_error_does_not_end_the_intake() -> None:
    broker = StandInBroker()
    intake = intake_on(broker, slots=1, pause_after=0.01)
    try:
        intake.handler_started()
        await eventually(lambda: _true(broker.pauses == 1), what="a pause")
        broker.explode = True
        broker.refuse = 1
        intake.handler_ended()
        # The error, then the refusal, then the resume that takes.
        await eventually(lambda: _true(broker.consuming), timeout=15, what="a resume at last")
        assert broker.resumes >= 3
        assert not broker.explode
        assert broker.refuse == 0
    finally:
        await intake.stop()


async def test_a_stop_lets_a_pause_under_way_finish() -> None:
    broker = StandInBroker()
    broker.pause_gate = asyncio.Event()
    intake = intake_on(broker, slots=1, pause_after=0.01)
    intake.handler_started()
    await eventually(lambda: _true(broker.pausing), what="a pause under way")
    stopping = asyncio.create_task(intake.stop())
    for _ in range(10):  # let the stop run as far as it goes: to waiting for the pause
        await asyncio.sleep(0)
    assert not stopping.done()
    broker.pause_gate.set()
    await stopping
    assert broker.pauses == 1
    assert not broker.consuming
