"""Batches through jobcore.client against a live API, relay and two workers (separate
processes, RabbitMQ between them): the members run, each callback fires once and runs,
and a repeated create is answered from the batch it made."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from jobcore.client import AsyncClient, Batch, Client, Conflict
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import Stack
from jobcore.testing.waiting import eventually

pytestmark = pytest.mark.timeout(240)

CALLBACK = {"type": "batch_done", "payload": {"note": "done"}}


async def test_a_batch_runs_on_two_workers_and_fires_once(
    settings: Settings, tmp_path: Path
) -> None:
    async with (
        Stack(settings, tmp_path / "logs", relays=1, workers=2) as stack,
        AsyncClient(stack.api_url, stack.api_key) as client,
    ):
        batch_id = uuid.uuid4()
        jobs = [
            {"type": "echo", "payload": {"text": str(n)}, "idempotency_key": f"member-{n}"}
            for n in range(20)
        ]
        created = await client.create_batch(
            jobs, on_success=CALLBACK, on_complete=CALLBACK, batch_id=batch_id
        )
        assert (created.id, created.total, created.replayed) == (batch_id, 20, False)
        again = await client.create_batch(
            jobs, on_success=CALLBACK, on_complete=CALLBACK, batch_id=batch_id
        )
        assert (again.replayed, again.job_ids) == (True, created.job_ids)

        async def fired() -> Batch | None:
            batch = await client.get_batch(batch_id)
            done = batch.callbacks["on_complete"].job_id
            return batch if batch.status == "succeeded" and done is not None else None

        batch = await eventually(fired, timeout=90)
        success = batch.callbacks["on_success"].job_id
        assert success is not None
        job = await client.wait(success, timeout=90)
        assert job.status == "succeeded"
        assert job.result == {"event": "success", "failed": 0}
        assert job.payload is not None
        assert job.payload["batch"]["succeeded"] == 20

        with Client(stack.api_url, stack.api_key) as blocking:
            listed = await asyncio.to_thread(blocking.list_batches)
            assert [b.id for b in listed] == [batch_id]
            with pytest.raises(Conflict):
                await asyncio.to_thread(
                    blocking.add_to_batch, batch_id, [{"type": "echo", "payload": {"text": "x"}}]
                )
