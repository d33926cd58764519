"""Poison messages go to the dead-letter queue and the worker keeps going; `jobcore dlq`,
and one job's dead letters replayed from the command and the console."""

from __future__ import annotations

import asyncio
import html
import re
import uuid

import aio_pika
import httpx
import orjson
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.sql import Query
from jobcore.database.sql.jobs.run import JOB_NOTE_UNDELIVERABLE, JobNoteUndeliverableParams
from jobcore.database.store import jobs as job_statements
from jobcore.execution.registry import Registry, default_registry
from jobcore.kernel.envelope import JobMessage
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.testing.waiting import eventually
from jobcore.usecases import keys as key_usecases
from services.ui.app import create_app
from services.worker.app import Worker
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import (
    OutboxPump,
    effects,
    job_row,
    outbox_rows,
    relayed,
    status_is,
    submit,
)


@pytest.fixture
def wsettings(wsettings: Settings) -> Settings:
    """Deliveries only: dead letters and their replays are the broker's path."""
    return relayed(wsettings)


CONSOLE = "http://console.test"


async def dead_letter_count(settings: Settings, topology: Topology) -> int:
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(topology.dead_letter_queue, passive=True)
        return int(queue.declaration_result.message_count or 0)


async def publish_raw(
    pump: OutboxPump, body: bytes, *, message_type: str | None, message_id: str | None
) -> None:
    channel = await pump.channel()
    exchange = await channel.get_exchange(pump.topology.jobs_exchange)
    await exchange.publish(
        aio_pika.Message(body, message_id=message_id, type=message_type),
        routing_key="testq",
        mandatory=True,
    )


async def jobcore(settings: Settings, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *jobcore_command(*args),
        env=settings_env(settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_poison_messages_are_dead_lettered_and_the_next_good_one_runs(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    worker = await start_worker()
    await publish_raw(outbox_pump, b"\x00 not json", message_type="wt_gate", message_id="m-1")
    await publish_raw(
        outbox_pump,
        JobMessage(job_id=uuid.uuid4(), attempt=1, type="nope").encode(),
        message_type="nope",
        message_id=str(uuid.uuid4()),
    )
    await publish_raw(
        outbox_pump,
        b'{"v": 1, "job_id": "x"}',
        message_type=None,
        message_id=str(uuid.uuid4()),
    )
    # A job whose stored payload no longer validates against its model.
    broken = await submit(db, topology, "wt_gate", GatePayload())
    async with db.connection() as conn:
        await conn.execute(
            """UPDATE jobs SET payload = '{"fail_times": "many"}' WHERE id = %s""", (broken,)
        )
    good = await submit(db, topology, "wt_gate", GatePayload())
    await outbox_pump.drain()

    await eventually(lambda: status_is(db, good, "succeeded"), what="the good job")
    row = await eventually(lambda: status_is(db, broken, "failed"), what="the broken job")
    assert row["last_error"].startswith(
        "payload does not validate against the job type's model: fail_times:"
    )
    assert await effects(db, broken) == []

    async def four_dead() -> bool:
        return await dead_letter_count(wsettings, topology) == 4

    await eventually(four_dead, what="four messages in the dead-letter queue")
    counts = worker.metrics.counts
    assert counts["dead_lettered.bad_envelope"] == 2
    assert counts["dead_lettered.unknown_type"] == 1
    assert counts["dead_lettered.invalid_payload"] == 1
    assert counts["processed.succeeded"] == 1


async def test_a_type_postgresql_cannot_take_is_dead_lettered_at_once(
    outbox_pump: OutboxPump, start_worker: StartWorker
) -> None:
    # Found by the poison fuzz test: a type of "\u0000" decoded, was unknown, and the note
    # on its job failed in the driver (PostgreSQL text cannot hold NUL), so each delivery
    # was requeued, over and over, until the broker's delivery limit.
    worker = await start_worker()
    for job_type in ["\x00", "wt_gate\x00", "no\x1bpe"]:
        body = orjson.dumps({"v": 1, "job_id": str(uuid.uuid4()), "attempt": 1, "type": job_type})
        await publish_raw(outbox_pump, body, message_type=None, message_id=str(uuid.uuid4()))

    async def three_dead() -> bool:
        return worker.metrics.counts["dead_lettered.bad_envelope"] == 3

    await eventually(three_dead, what="three bad envelopes dead-lettered")
    assert not any(key.startswith("delivery_errors") for key in worker.metrics.counts)


async def test_a_note_the_database_refuses_does_not_hold_back_an_unknown_type(
    outbox_pump: OutboxPump, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The note on the job is best effort: a data error (SQLSTATE class 22) from the
    # message's own values must not keep its poison message from the dead-letter queue.
    refused = Query[JobNoteUndeliverableParams](
        JOB_NOTE_UNDELIVERABLE.name, JOB_NOTE_UNDELIVERABLE.purpose, "SELECT %(type)s::int"
    )
    # The store runs the statement it finds in its module when called.
    monkeypatch.setattr(job_statements, "JOB_NOTE_UNDELIVERABLE", refused)
    worker = await start_worker()
    await publish_raw(
        outbox_pump,
        JobMessage(job_id=uuid.uuid4(), attempt=1, type="nope").encode(),
        message_type="nope",
        message_id=str(uuid.uuid4()),
    )

    async def dead() -> bool:
        return worker.metrics.counts["dead_lettered.unknown_type"] == 1

    await eventually(dead, what="the unknown type dead-lettered")
    assert not any(key.startswith("delivery_errors") for key in worker.metrics.counts)


async def test_dlq_list_peeks_without_losing_and_replay_requeues(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    # A worker deployed without the job type dead-letters its messages ...
    partial = Registry()
    partial.register(default_registry.get("noop"))
    old = await start_worker(registry=partial, queues=["testq"])
    jobs = [await submit(db, topology, "wt_gate", GatePayload()) for _ in range(3)]
    messages = {r["message_id"] for j in jobs for r in await outbox_rows(db, j)}
    await outbox_pump.drain()

    async def three_dead() -> bool:
        return await dead_letter_count(wsettings, topology) == 3

    await eventually(three_dead, what="three dead letters")
    await old.stop()
    # Their jobs wait, pending, and say why to whoever polls them.
    for job_id in jobs:
        waiting = await job_row(db, job_id)
        assert waiting["status"] == "pending"
        assert "dead-lettered" in waiting["last_error"]
        assert "unknown job type 'wt_gate'" in waiting["last_error"]
        assert "jobcore dlq replay" in waiting["last_error"]

    # ... an operator looks at them (twice: looking loses nothing) ...
    for _ in range(2):
        code, out, err = await jobcore(wsettings, "dlq", "list", "--json")
        assert code == 0, err
        listed = orjson.loads(out)
        assert {uuid.UUID(m["message_id"]) for m in listed} == messages
        assert {m["job_id"] for m in listed} == {str(j) for j in jobs}
        assert {(m["reason"], m["queue"], m["routing_key"]) for m in listed} == {
            ("rejected", topology.queue_name("testq"), "testq")
        }
        assert await dead_letter_count(wsettings, topology) == 3
    code, out, _ = await jobcore(wsettings, "dlq", "list", "--limit", "1", "--json")
    assert len(orjson.loads(out)) == 1
    code, out, _ = await jobcore(wsettings, "dlq", "list")
    assert code == 0
    assert out.splitlines()[0].split()[:3] == ["MESSAGE_ID", "MESSAGE_TYPE", "JOB_ID"]
    assert await dead_letter_count(wsettings, topology) == 3

    # ... and, once a worker that knows the type runs, replays two, then the rest.
    worker = await start_worker()
    code, out, err = await jobcore(wsettings, "dlq", "replay", "--limit", "2")
    assert code == 0, err
    assert out.startswith("replayed 2 message(s), skipped 0")
    assert await dead_letter_count(wsettings, topology) == 1
    code, out, err = await jobcore(wsettings, "dlq", "replay", "--json")
    assert code == 0, err
    assert len(orjson.loads(out)["replayed"]) == 1
    # Each replay is audited once done, with what it replayed (never a body).
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT action, target_type, outcome, details FROM audit_log ORDER BY id"
        )
        replays = [dict(row) for row in await cur.fetchall()]
    assert [(r["action"], r["target_type"], r["outcome"]) for r in replays] == [
        ("dlq.replay", "dead_letter_queue", "succeeded")
    ] * 2
    assert [(r["details"]["replayed"], r["details"]["skipped"]) for r in replays] == [
        (2, 0),
        (1, 0),
    ]
    replayed = [m for r in replays for m in r["details"]["messages"]]
    assert {m["job_id"] for m in replayed} == {str(j) for j in jobs}
    assert {uuid.UUID(m["message_id"]) for m in replayed} == messages

    for job_id in jobs:
        await eventually(lambda j=job_id: status_is(db, j, "succeeded"), what="replayed job")
        assert len(await effects(db, job_id)) == 1
        assert (await job_row(db, job_id))["attempts"] == 1
    assert await dead_letter_count(wsettings, topology) == 0
    assert worker.metrics.counts["processed.succeeded"] == 3


async def test_replaying_a_message_that_already_ran_has_no_effect(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    worker: Worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    async with db.connection() as conn:
        await conn.execute("""UPDATE jobs SET payload = '{"gate": 5}' WHERE id = %s""", (job_id,))
    await outbox_pump.drain()
    await eventually(lambda: status_is(db, job_id, "failed"), what="the invalid payload to fail")

    code, out, err = await jobcore(wsettings, "dlq", "replay")
    assert code == 0, err
    assert out.startswith("replayed 1 message(s)")

    async def deduplicated() -> bool:
        return bool(worker.metrics.counts["duplicates"] == 1)

    await eventually(deduplicated, what="the replayed message to hit the inbox")
    assert await dead_letter_count(wsettings, topology) == 0
    assert (await job_row(db, job_id))["status"] == "failed"


async def test_one_jobs_dead_letter_is_replayed_alone_from_the_command_and_the_console(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    # Three jobs dead-lettered by a worker that does not know their type ...
    partial = Registry()
    partial.register(default_registry.get("noop"))
    old = await start_worker(registry=partial, queues=["testq"])
    jobs = [await submit(db, topology, "wt_gate", GatePayload()) for _ in range(3)]
    await outbox_pump.drain()

    async def three_dead() -> bool:
        return await dead_letter_count(wsettings, topology) == 3

    await eventually(three_dead, what="three dead letters")
    await old.stop()
    code, out, _ = await jobcore(wsettings, "dlq", "list", "--json")
    order = [m["job_id"] for m in orjson.loads(out)]
    assert sorted(order) == sorted(str(j) for j in jobs)
    worker = await start_worker()

    # ... the middle one's is replayed on its own: it runs, the others stay, in their order.
    middle = uuid.UUID(order[1])
    code, out, err = await jobcore(wsettings, "dlq", "replay-job", str(middle))
    assert code == 0, err
    assert out.startswith("replayed 1 message(s), skipped 0")
    await eventually(lambda: status_is(db, middle, "succeeded"), what="the replayed job")
    assert len(await effects(db, middle)) == 1
    code, out, _ = await jobcore(wsettings, "dlq", "list", "--json")
    assert [m["job_id"] for m in orjson.loads(out)] == [order[0], order[2]]
    for other in (order[0], order[2]):
        assert (await job_row(db, uuid.UUID(other)))["status"] == "pending"

    # Again: none of its messages is left, which is one line and a non-zero exit.
    code, out, err = await jobcore(wsettings, "dlq", "replay-job", str(middle))
    assert code == 1
    assert err.strip().splitlines() == [
        f"jobcore: no message of job {middle} is in the dead-letter queue"
    ]
    code, _, err = await jobcore(wsettings, "dlq", "replay-job", "not-a-job")
    assert code == 2
    assert await dead_letter_count(wsettings, topology) == 2

    # The console's job page offers the same for a job whose message is dead-lettered.
    key = await key_usecases.create_key(db, "ops", "ops", scopes=[Scope.ADMIN], actor="tests")
    console = create_app(wsettings)
    async with console.router.lifespan_context(console):
        transport = httpx.ASGITransport(console)
        async with httpx.AsyncClient(transport=transport, base_url=CONSOLE) as http:
            origin = {"Origin": CONSOLE}
            signed_in = await http.post("/login", data={"key": key.key}, headers=origin)
            assert signed_in.status_code == 303
            first = order[0]
            page = (await http.get(f"/jobs/{first}")).text
            assert f'action="/jobs/{first}/replay"' in page
            csrf = re.search(r'name="csrf" value="([^"]+)"', page)
            assert csrf is not None
            done = await http.post(
                f"/jobs/{first}/replay", data={"csrf": csrf.group(1)}, headers=origin
            )
            assert done.status_code == 303
            assert done.headers["location"].endswith(f"/jobs/{first}")
            assert "Replayed 1 message(s), skipped 0" in html.unescape(
                (await http.get(f"/jobs/{first}")).text
            )
    await eventually(
        lambda: status_is(db, uuid.UUID(first), "succeeded"), what="the job replayed from the UI"
    )
    code, out, _ = await jobcore(wsettings, "dlq", "list", "--json")
    assert [m["job_id"] for m in orjson.loads(out)] == [order[2]]
    assert (await job_row(db, uuid.UUID(order[2])))["status"] == "pending"
    assert worker.metrics.counts["processed.succeeded"] == 2

    # Each is audited: on the job, with its tenant and what was replayed; the refusal too.
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT action, target_type, target_id, tenant, outcome, details FROM audit_log "
            "WHERE action = 'dlq.replay_job' ORDER BY id"
        )
        entries = [dict(row) for row in await cur.fetchall()]
    assert [(e["target_id"], e["outcome"]) for e in entries] == [
        (str(middle), "succeeded"),
        (str(middle), "refused"),
        (first, "succeeded"),
    ]
    assert {(e["target_type"], e["tenant"]) for e in entries} == {("job", "t")}
    assert entries[1]["details"]["refused"] == "NoDeadLetter"
    assert [m["job_id"] for m in entries[0]["details"]["messages"]] == [str(middle)]
