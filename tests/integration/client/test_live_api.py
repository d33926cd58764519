"""jobcore.client against a live API: `jobcore api`, a relay and a worker as separate
processes on the test's database, so jobs really run. Each operation is checked against
what the API and the database say, and each error against the problem the API sent."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobcore.client import (
    Accepted,
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    Job,
    JobResult,
    NotFound,
    PreconditionFailed,
    Unauthorized,
    UnprocessableContent,
    WaitTimeout,
)
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import Stack
from jobcore.testing.waiting import eventually
from jobcore.usecases import keys as key_usecases

pytestmark = pytest.mark.timeout(240)

WAIT = 90.0  # seconds a test waits for a job to finish (it takes well under one)


@dataclass
class Life:
    accepted: Accepted
    again: Accepted
    done: Job
    seen: Job
    inline: JobResult
    exported: Job
    csv: JobResult


def enqueue_to_result(url: str, key: str) -> Life:
    """The blocking client through a job's whole life (run in a thread)."""
    with Client(url, key) as client:
        accepted = client.enqueue("echo", {"text": "ab", "count": 2}, entity_id="order-7")
        again = client.enqueue(
            "echo",
            {"text": "ab", "count": 2},
            entity_id="order-7",
            idempotency_key=accepted.idempotency_key,
        )
        done = client.wait(accepted.job_id, timeout=WAIT)
        seen = client.get(accepted.job_id)
        inline = client.result(accepted.job_id)
        export = client.enqueue("export_csv", {"rows": 3, "seed": 1})
        exported = client.wait(export.job_id, timeout=WAIT, poll=5)
        csv = client.result(export.job_id)
    return Life(accepted, again, done, seen, inline, exported, csv)


async def test_a_job_from_enqueue_to_result(settings: Settings, tmp_path: Path) -> None:
    async with Stack(settings, tmp_path / "logs", relays=1, workers=1) as stack:
        life = await asyncio.to_thread(enqueue_to_result, stack.api_url, stack.api_key)
    assert life.accepted.status == "pending"
    assert not life.accepted.replayed
    assert life.again.replayed
    assert life.again.job_id == life.accepted.job_id
    assert life.done.id == life.accepted.job_id
    assert life.done.status == "succeeded"
    assert life.done.result == {"text": "abab"}
    assert life.done.finished_at is not None
    assert life.seen.entity_id == "order-7"
    assert life.seen.payload == {"text": "ab", "count": 2}
    assert life.seen.idempotency_key == life.accepted.idempotency_key
    assert life.seen.attempts == 1
    assert life.inline.is_json
    assert life.inline.json() == {"text": "abab"}
    assert life.exported.status == "succeeded"
    assert life.exported.result_ref is not None
    assert life.csv.media_type == "text/csv"
    lines = life.csv.text().splitlines()
    assert lines[0] == "id,name,amount"
    assert len(lines) == 4


async def test_pages_cancel_waits_and_errors(settings: Settings, tmp_path: Path) -> None:
    async with (
        Stack(settings, tmp_path / "logs", relays=1, workers=1) as stack,
        AsyncClient(stack.api_url, stack.api_key) as client,
    ):
        # Pages: five jobs of one entity, two a page, newest first, none twice.
        accepted = [
            await client.enqueue("echo", {"text": str(i)}, entity_id="batch-1") for i in range(5)
        ]
        batch = [a.job_id for a in accepted]
        pages = [page async for page in client.pages(entity_id="batch-1", limit=2)]
        assert [len(page.items) for page in pages] == [2, 2, 1]
        assert pages[-1].next_cursor is None
        listed = [job.id for page in pages for job in page.items]
        assert listed == batch[::-1]
        for job_id in batch:
            assert (await client.wait(job_id, timeout=WAIT)).status == "succeeded"
        succeeded = [job.id async for job in client.jobs(status="succeeded", type="echo")]
        assert sorted(succeeded) == sorted(batch)

        # A batch, then the same items with the keys the client gave them: all replays.
        items = [{"payload": {"text": f"b{i}"}, "entity_id": "batch-2"} for i in range(3)]
        first = await client.enqueue_batch("echo", items)
        assert [outcome.status for outcome in first.items] == ["created"] * 3
        again = await client.enqueue_batch(
            "echo",
            [
                {**item, "idempotency_key": outcome.idempotency_key}
                for item, outcome in zip(items, first.items, strict=True)
            ],
        )
        assert [outcome.status for outcome in again.items] == ["replayed"] * 3
        assert [o.job_id for o in again.items] == [o.job_id for o in first.items]
        for outcome in first.items:
            assert outcome.job_id is not None
            assert (await client.wait(outcome.job_id, timeout=WAIT)).status == "succeeded"

        # A long-poll that runs out: a job scheduled an hour ahead stays pending.
        later = await client.enqueue("echo", {"text": "later"}, delay=3600)
        with pytest.raises(WaitTimeout) as timed_out:
            await client.wait(later.job_id, timeout=1.0, poll=0.5)
        assert timed_out.value.job.status == "pending"
        assert timed_out.value.job.run_at is not None
        cancelled_now = await client.cancel(later.job_id)
        assert cancelled_now.status == "cancelled"  # at once: it was pending

        # Cancelling a running job: the worker stops it and it ends cancelled.
        running = await client.enqueue("effect", {"seconds": 10})

        async def started() -> bool:
            return (await client.get(running.job_id)).status == "running"

        await eventually(started, timeout=WAIT, interval=0.1, what="the job to run")
        answer = await client.cancel(running.job_id)
        assert answer.status == "running"
        assert answer.cancel_requested
        ended = await client.wait(running.job_id, timeout=WAIT)
        assert ended.status == "cancelled"
        with pytest.raises(Conflict) as not_cancellable:
            await client.cancel(running.job_id)
        assert not_cancellable.value.slug == "job-not-cancellable"
        assert not_cancellable.value.extensions["job_status"] == "cancelled"
        with pytest.raises(Conflict) as not_ready:
            await client.result(running.job_id)
        assert not_ready.value.slug == "result-not-ready"

        # Errors carry the problem the API sent.
        with pytest.raises(NotFound) as missing:
            await client.get(uuid.uuid4())
        assert (missing.value.status, missing.value.slug) == (404, "job-not-found")
        assert missing.value.title
        with pytest.raises(NotFound) as unknown:
            await client.enqueue("no_such_type", {})
        assert unknown.value.slug == "unknown-job-type"
        with pytest.raises(UnprocessableContent) as invalid:
            await client.enqueue("echo", {"bogus": 1})
        assert invalid.value.slug == "invalid-payload"
        assert {tuple(e["loc"]) for e in invalid.value.extensions["errors"]} >= {
            ("text",),
            ("bogus",),
        }
        with pytest.raises(UnprocessableContent) as reused:
            await client.enqueue(
                "echo", {"text": "other"}, idempotency_key=accepted[0].idempotency_key
            )
        assert reused.value.slug == "idempotency-key-reused"

        reader = await key_usecases.create_key(
            stack.db, stack.tenant, "reader", scopes=["read"], actor="tests"
        )
        async with AsyncClient(stack.api_url, reader.key) as read_only:
            with pytest.raises(Forbidden) as forbidden:
                await read_only.cancel(batch[0])
            assert forbidden.value.extensions["required_scope"] == "cancel"
        async with AsyncClient(stack.api_url, "jc_" + "a" * 43) as stranger:
            with pytest.raises(Unauthorized) as refused:
                await stranger.get(batch[0])
            assert refused.value.slug == "invalid-api-key"


async def test_an_edit_moves_a_scheduled_job_and_changes_what_it_runs(
    settings: Settings, tmp_path: Path
) -> None:
    async with (
        Stack(settings, tmp_path / "logs", relays=1, workers=1) as stack,
        AsyncClient(stack.api_url, stack.api_key) as client,
    ):
        later = await client.enqueue("echo", {"text": "old"}, delay=3600)
        read = await client.get(later.job_id)
        assert read.version is not None
        edited = await client.edit(
            later.job_id,
            version=read.version,
            run_at=datetime.now(UTC) + timedelta(seconds=1),
            priority="high",
            payload={"text": "new"},
        )
        assert (edited.payload, edited.priority) == ({"text": "new", "count": 1}, "high")
        assert edited.version != read.version
        # The version read before the edit is no longer the job's.
        with pytest.raises(PreconditionFailed):
            await client.edit(later.job_id, version=read.version, priority="low")
        # Moved from an hour ahead to a second: a relay and a worker run it, edited.
        done = await client.wait(later.job_id, timeout=WAIT)
        assert (done.status, done.result) == ("succeeded", {"text": "new"})
        assert done.version is not None
        with pytest.raises(Conflict) as ended:
            await client.edit(later.job_id, version=done.version, priority="low")
        assert ended.value.extensions["job_status"] == "succeeded"
