"""A handler's snooze (``Snooze``, returned or raised): the job goes back to pending, due
after the snooze, without spending an attempt, with its `snoozed` event; past its type's
cap the job fails. Through a real broker and worker."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.envelope import decode
from jobcore.testing.waiting import eventually
from jobcore.usecases.timeline import job_timeline
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import SnoozePayload
from tests.integration.worker.support import OutboxPump, status_is, submit


async def events(db: Database, job_id: uuid.UUID) -> list[dict[str, Any]]:
    """The job's timeline (its claims are kept on the job row and the snoozed events)."""
    found = await job_timeline(db, job_id, tenant=None)
    assert found is not None
    return [event.as_dict() for event in found.events if event.kind != "accepted"]


@pytest.mark.parametrize("raise_it", [False, True], ids=["returned", "raised"])
async def test_a_snooze_runs_the_job_again_after_its_delay_without_spending_an_attempt(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
    raise_it: bool,
) -> None:
    payload = SnoozePayload(runs_dir=str(tmp_path), snooze_times=1, seconds=1.0, raise_it=raise_it)
    job_id = await submit(db, topology, "wt_snooze", payload)
    worker = await start_worker()

    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success", timeout=20)

    # Two runs, one attempt: the snooze gave it back unspent (max_attempts is 2, so a
    # spent attempt would show as attempt 2).
    assert row["result"] == {"attempt": 1, "run": 2, "snoozes": 1}  # ctx.snoozes
    assert (row["attempts"], row["snoozes"], row["last_error"]) == (1, 1, None)
    timeline = await events(db, job_id)
    kinds = [e["kind"] for e in timeline if e["kind"] != "published"]
    assert kinds == ["claimed", "snoozed", "claimed", "finished"]
    claims = [e for e in timeline if e["kind"] == "claimed"]
    [snoozed] = [e for e in timeline if e["kind"] == "snoozed"]
    assert [c["attempt"] for c in claims] == [1, 1]
    assert snoozed["attempt"] == 1
    assert snoozed["detail"]["snoozes"] == 1
    # Due one second after the snooze, and not claimed before.
    until = snoozed["detail"]["until"]
    assert claims[1]["at"] >= snoozed["at"] + timedelta(seconds=1.0)
    assert str(until)  # recorded
    # Both messages carried attempt 1: the snooze's message is the one that claimed.
    messages = [decode(m.body) for m in pump.published if m.job_id == job_id]
    assert [m.attempt for m in messages] == [1, 1]
    assert worker.metrics.counts["processed.snoozed"] == 1
    assert worker.metrics.counts["processed.succeeded"] == 1


async def test_snoozes_past_the_types_cap_fail_the_job(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    payload = SnoozePayload(runs_dir=str(tmp_path), seconds=0.05)
    job_id = await submit(db, topology, "wt_snooze_capped", payload)
    await start_worker()

    row = await eventually(lambda: status_is(db, job_id, "failed"), what="failure", timeout=20)

    assert (row["attempts"], row["snoozes"]) == (1, 2)
    assert "snoozed 2 times already" in row["last_error"]
    assert "max_snoozes" in row["last_error"]
    assert (tmp_path / str(job_id)).read_text() == "3"  # two snoozes, then the one refused
    kinds = [e["kind"] for e in await events(db, job_id) if e["kind"] != "published"]
    assert kinds == ["claimed", "snoozed", "claimed", "snoozed", "claimed", "finished"]
