"""The processing contract: claim, run, outcome; duplicates have no effect."""

from __future__ import annotations

import asyncio
import csv
import io
import re
import uuid
from pathlib import Path

import orjson

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_one
from jobcore.database.sql.inbox import JOBS_CONSUMER
from jobcore.database.sql.jobs.run import JOB_CLAIM_MANY
from jobcore.examples.jobtypes import ExportCsvPayload, NoopPayload, SendEmailPayload, csv_chunks
from jobcore.execution.claims import ClaimedJob, ClaimRequest, Unclaimed
from jobcore.kernel.envelope import JobMessage
from jobcore.kernel.settings import Settings
from jobcore.storage.results import LocalResultStore
from jobcore.testing.waiting import eventually
from services.worker.app import Worker
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import (
    OutboxPump,
    effects,
    job_row,
    outbox_rows,
    status_is,
    submit,
)


async def test_a_job_runs_once_and_succeeds_with_its_result_and_effects(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload(effect="charged"))

    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")

    assert row["attempts"] == 1
    assert row["result"] == {"attempt": 1, "blob": ""}
    assert row["result_ref"] is None
    assert row["worker_id"] == worker.worker_id
    assert row["started_at"] is not None
    assert row["finished_at"] >= row["started_at"]
    ledger = await effects(db, job_id)
    assert [(e["kind"], e["attempt"], e["detail"]) for e in ledger] == [
        ("charged", 1, {"attempt": 1})
    ]
    assert worker.metrics.counts["processed.succeeded"] == 1


async def test_large_results_go_to_the_result_store(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    await start_worker()
    size = wsettings.inline_result_max_bytes + 10
    job_id = await submit(db, topology, "wt_gate", GatePayload(result_size=size))

    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")

    assert row["result"] is None
    # One file per attempt: the key names the attempt's lease token.
    assert re.fullmatch(rf"{job_id.hex}-[0-9a-f]{{32}}\.json", row["result_ref"])
    stored = orjson.loads(LocalResultStore(wsettings.result_dir).get(row["result_ref"]))
    assert stored == {"attempt": 1, "blob": "x" * size}


async def test_export_csv_writes_deterministic_rows_to_the_result_store(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    await start_worker()
    payload = ExportCsvPayload(rows=250, columns=["id", "name", "amount"], seed=42)
    job_id = await submit(db, topology, "export_csv", payload)

    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")

    assert re.fullmatch(rf"{job_id.hex}-[0-9a-f]{{32}}\.csv", row["result_ref"])
    data = LocalResultStore(wsettings.result_dir).get(row["result_ref"])
    assert data == b"".join(csv_chunks(payload))  # same seed, same file
    assert data != b"".join(csv_chunks(payload.model_copy(update={"seed": 43})))
    rows = list(csv.reader(io.StringIO(data.decode())))
    assert rows[0] == ["id", "name", "amount"]
    assert len(rows) == 251
    assert [r[0] for r in rows[1:4]] == ["1", "2", "3"]
    assert row["result"] == {"rows": 250, "columns": ["id", "name", "amount"], "bytes": len(data)}
    assert [e["kind"] for e in await effects(db, job_id)] == ["export_written"]


async def test_send_email_delivers_once_even_when_the_mail_is_already_there(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    await start_worker()
    sink = wsettings.result_dir / "outbox-mail"
    payload = SendEmailPayload(to="ada@example.com", subject="Your export", body="Ready.")
    first = await submit(db, topology, "send_email", payload)
    row = await eventually(lambda: status_is(db, first, "succeeded"), what="success")

    mail = (sink / f"{first}.eml").read_text()
    assert "To: ada@example.com" in mail
    assert f"Message-ID: <{first}@jobcore>" in mail
    assert row["result"] == {"delivered": True, "message_id": f"<{first}@jobcore>"}
    assert [e["kind"] for e in await effects(db, first)] == ["email_sent"]

    # A retry after a crash that came after delivery finds the mail there: not sent again.
    second = await submit(db, topology, "send_email", payload)
    sink.joinpath(f"{second}.eml").write_text("delivered by an earlier attempt")
    row = await eventually(lambda: status_is(db, second, "succeeded"), what="success")
    assert row["result"]["delivered"] is False
    assert sink.joinpath(f"{second}.eml").read_text() == "delivered by an earlier attempt"
    assert sorted(p.name for p in sink.iterdir()) == sorted([f"{first}.eml", f"{second}.eml"])


async def test_the_same_message_delivered_twice_runs_the_handler_once(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    worker = await start_worker()
    gate = tmp_path / "gate"
    job_id = await submit(db, topology, "wt_gate", GatePayload(gate=str(gate)))
    [row] = await outbox_rows(db, job_id)

    # The same AMQP message (same message id) twice while the handler is still running,
    # and once more after it finished.
    await outbox_pump.publish(row)
    await outbox_pump.publish(row)
    await eventually(
        lambda: _count(worker, "duplicates", 1), what="the second delivery to be deduplicated"
    )
    gate.touch()
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    await outbox_pump.publish(row)
    await eventually(lambda: _count(worker, "duplicates", 2), what="the third delivery")

    assert len(await effects(db, job_id)) == 1
    assert (await job_row(db, job_id))["attempts"] == 1
    assert worker.metrics.counts["processed.succeeded"] == 1


async def test_an_outbox_row_published_twice_runs_the_handler_once(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload())

    # A relay that crashed after the broker confirmed but before it deleted the row
    # publishes the row again.
    assert await outbox_pump.drain(delete=False) == 1
    assert await outbox_pump.drain(delete=True) == 1
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    await eventually(lambda: _count(worker, "duplicates", 1), what="the re-published copy")

    assert len(await effects(db, job_id)) == 1
    assert (await job_row(db, job_id))["attempts"] == 1


async def test_a_redelivery_after_a_crash_between_commit_and_ack_has_no_effect(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    # A worker committed the inbox row and the claim, then died before acknowledging:
    # RabbitMQ redelivers the message to another worker.
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    [message] = await outbox_rows(db, job_id)
    async with db.connection() as conn:
        claimed = await fetch_one(
            conn,
            JOB_CLAIM_MANY(
                {
                    "consumer": JOBS_CONSUMER,
                    "exchange": topology.jobs_exchange,
                    "worker_id": "died-before-ack",
                    "message_ids": [message["message_id"]],
                    "job_ids": [job_id],
                    "types": ["wt_gate"],
                    "attempts": [1],
                    "lease_tokens": [uuid.uuid4()],
                    # Long enough to outlast a worker's start on a loaded machine: the
                    # redelivery must meet the job still running under this claim.
                    "leases": [5.0],
                    "published_ats": [None],
                    "published_bys": [None],
                }
            ),
        )
    assert claimed is not None
    assert claimed["fresh"]
    assert claimed["id"] == job_id

    worker = await start_worker()
    await outbox_pump.drain()
    await eventually(lambda: _count(worker, "duplicates", 1), what="the redelivery")
    assert (await job_row(db, job_id))["status"] == "running"
    assert await effects(db, job_id) == []

    # The dead worker's lease expires; the reaper gives the job a new message.
    row = await eventually(
        lambda: _drain_until(outbox_pump, db, job_id, "succeeded"), what="success", timeout=25
    )
    assert row["attempts"] == 2
    assert row["last_error"] == "lease expired"
    assert len(await effects(db, job_id)) == 1


async def test_a_message_for_a_finished_job_or_an_older_attempt_does_nothing(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    await outbox_pump.drain()
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")

    # A new message (new id, so the inbox does not know it) for the finished job ...
    late = _message_row(topology, job_id, attempt=2)
    await outbox_pump.publish(late)
    await eventually(lambda: _count(worker, "skipped", 1), what="the late message")

    # ... and a stale message for attempt 1 of a job that is pending for attempt 2.
    other = await submit(db, topology, "wt_gate", GatePayload(fail_times=1))
    await outbox_pump.drain()
    pending = await eventually(lambda: _retry_pending(db, other), what="the retry")
    assert pending["last_error"] == "RuntimeError: planned failure on attempt 1"
    await outbox_pump.publish(_message_row(topology, other, attempt=1))
    await eventually(lambda: _count(worker, "skipped", 2), what="the stale message")
    assert (await job_row(db, other))["attempts"] == 1

    assert len(await effects(db, job_id)) == 1
    assert await effects(db, other) == []
    assert worker.metrics.counts["processed.succeeded"] == 1


async def test_noop_jobs_run(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    await start_worker(concurrency=2)
    ids = [await submit(db, topology, "noop", NoopPayload()) for _ in range(20)]

    async def all_done() -> bool:
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM jobs WHERE status = 'succeeded' AND id = ANY(%s)",
                (ids,),
            )
            row = await cur.fetchone()
        return row is not None and row["n"] == len(ids)

    await eventually(all_done, what="all no-op jobs to succeed")


# --- helpers ---------------------------------------------------------------------------------


async def _count(worker: Worker, name: str, at_least: int) -> bool:
    return worker.metrics.counts[name] >= at_least


async def _drain_until(pump: OutboxPump, db: Database, job_id: uuid.UUID, status: str) -> object:
    await pump.drain()
    return await status_is(db, job_id, status)


async def _retry_pending(db: Database, job_id: uuid.UUID) -> dict[str, object] | None:
    row = await job_row(db, job_id)
    return row if row["status"] == "pending" and row["attempts"] == 1 else None


def _message_row(topology: Topology, job_id: uuid.UUID, *, attempt: int) -> dict[str, object]:
    return {
        "message_id": uuid.uuid4(),
        "exchange": topology.jobs_exchange,
        "routing_key": "testq",
        "message_type": "wt_gate",
        "headers": {},
        "body": JobMessage(job_id=job_id, attempt=attempt, type="wt_gate").encode(),
    }


async def test_claims_in_one_batch_dedupe_a_repeated_message_and_a_second_claim(
    db: Database, topology: Topology, start_worker: StartWorker
) -> None:
    worker = await start_worker(queues=["nothing_arrives_here"])
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    [row] = await outbox_rows(db, job_id)

    def request(message_id: uuid.UUID) -> ClaimRequest:
        return ClaimRequest(
            message_id, job_id, worker.registry.get("wt_gate"), 1, uuid.uuid4(), 2.0
        )

    same, other = request(row["message_id"]), request(uuid.uuid4())
    # Submitted together, they travel in one statement.
    first, again, rival = await asyncio.gather(
        worker.consumer.claims.submit(same),
        worker.consumer.claims.submit(same),
        worker.consumer.claims.submit(other),
    )

    # Two fresh messages for the same attempt: exactly one claims the job; the other finds
    # it no longer pending (not a duplicate: its message is new).
    assert again == Unclaimed("duplicate")
    winner, loser = (first, rival) if isinstance(first, ClaimedJob) else (rival, first)
    assert isinstance(winner, ClaimedJob)
    assert winner.job_id == job_id
    assert loser == Unclaimed("skipped", "pending")
    job = await job_row(db, job_id)
    assert (job["status"], job["attempts"]) == ("running", 1)
    assert job["lease_token"] == winner.lease_token
    assert winner.lease_token in (same.lease_token, other.lease_token)


async def test_a_job_whose_payload_was_accepted_loosely_before_the_upgrade_still_runs(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    """Payloads are strict on the way in only: a job stored with {"rows": "5"} (accepted
    by an API from before payloads were strict, or enqueued through SQL unchecked) is run
    by its model's own rules, not failed as an invalid payload."""
    job_id = await submit(db, topology, "export_csv", ExportCsvPayload(rows=5, seed=1))
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET payload = jsonb_set(payload, '{rows}', '\"5\"') WHERE id = %s",
            [job_id],
        )
    assert (await job_row(db, job_id))["payload"]["rows"] == "5"
    await start_worker()

    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")

    assert row["result"]["rows"] == 5
    assert row["last_error"] is None
