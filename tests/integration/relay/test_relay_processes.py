"""Relays as real processes: several at once, SIGTERM, health, and the operator commands."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import aio_pika
import httpx
import orjson
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from tests.integration.relay.helpers import (
    collect,
    fill_outbox,
    health_port,
    messages_logged,
    outbox_count,
    outbox_message_ids,
    outbox_row,
    relay_env,
    run_cli,
    wait_drained,
    wait_received,
)


async def deleted_rows(db: Database) -> int:
    """Rows ever deleted from the outbox of this test's database (PostgreSQL's own count)."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT n_tup_del AS n FROM pg_stat_user_tables WHERE relname = 'outbox'"
        )
        row = await cur.fetchone()
        return int(row["n"]) if row else -1


async def test_three_relays_drain_10k_rows_each_published_and_marked_done_once(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    tmp_path: Path,
) -> None:
    collector = await collect(amqp_channel, topology)
    logs = [tmp_path / f"relay-{i}.log" for i in range(3)]
    with contextlib.ExitStack() as stack:
        relays = [
            stack.enter_context(
                jobcore_process(
                    settings, "relay", log_path=log, **relay_env(JOBCORE_RELAY_BATCH_SIZE="250")
                )
            )
            for log in logs
        ]

        async def all_connected() -> bool:
            return all(log.exists() and messages_logged(log, "broker connected") for log in logs)

        await eventually(all_connected, timeout=30, what="three connected relays")
        # One NOTIFY wakes all three at once: they race for the same rows.
        rows = await fill_outbox(db, topology, 10_000)
        expected = {r["message_id"] for r in rows}
        await wait_drained(db)
        await wait_received(collector, expected)
        for relay in relays:
            relay.send_signal(signal.SIGTERM)
        codes = [relay.wait(timeout=settings.shutdown_grace + 10) for relay in relays]
    assert codes == [0, 0, 0]

    assert collector.distinct == expected, "a message is missing or unexpected"
    stopped = [messages_logged(log, "relay stopped")[-1] for log in logs]
    published = [s["published"] for s in stopped]
    # Each row was confirmed and deleted by exactly one relay ...
    assert sum(published) == len(rows)
    assert all(p > 0 for p in published), f"not all three relays took part: {published}"
    assert all(s["unconfirmed"] == 0 and s["failed"] == 0 for s in stopped)
    # ... and PostgreSQL agrees: one delete per row, none repeated (its counter is
    # flushed when the relays' sessions end).

    async def all_deletes_counted() -> bool:
        return await deleted_rows(db) >= len(rows)

    await eventually(all_deletes_counted, what="the deletes to be counted")
    assert await deleted_rows(db) == len(rows)
    assert await outbox_count(db) == 0
    print(
        f"\n3 relays: {len(collector.ids)} deliveries of {len(expected)} messages, "
        f"{collector.duplicates} duplicates; published per relay: {published}"
    )
    assert collector.duplicates == 0


async def test_sigterm_exits_0_promptly_with_the_batch_in_flight_committed(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    tmp_path: Path,
) -> None:
    collector = await collect(amqp_channel, topology)
    rows = await fill_outbox(db, topology, 30_000)
    log = tmp_path / "relay.log"
    env = relay_env(JOBCORE_RELAY_BATCH_SIZE="2000", JOBCORE_RELAY_LANES="1")
    with jobcore_process(settings, "relay", log_path=log, **env) as relay:

        async def flowing() -> bool:
            return bool(collector.ids)

        await eventually(flowing, timeout=20, what="the first published message")
        relay.send_signal(signal.SIGTERM)
        code = relay.wait(timeout=settings.shutdown_grace + 5)
    assert code == 0
    [stopped] = messages_logged(log, "relay stopped")
    left = await outbox_message_ids(db)
    assert 0 < len(left) < len(rows), "the relay stopped mid-drain"
    assert stopped["published"] == len(rows) - len(left)
    assert stopped["unconfirmed"] == 0

    async def all_arrived() -> bool:
        return len(collector.distinct) >= stopped["published"]

    await eventually(all_arrived, what="every confirmed message")
    assert not (collector.distinct & left), "a published message's row was left behind"
    assert collector.distinct | left == {r["message_id"] for r in rows}


async def test_health_endpoints_report_broker_backlog_and_metrics(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    tmp_path: Path,
) -> None:
    collector = await collect(amqp_channel, topology)
    log = tmp_path / "relay.log"
    scheduled = await fill_outbox(db, topology, 3, delay=3600)
    with jobcore_process(settings, "relay", log_path=log, **relay_env()):
        port = await health_port(log)
        rows = await fill_outbox(db, topology, 40)
        await wait_received(collector, {r["message_id"] for r in rows})
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

            async def ready() -> httpx.Response | None:
                response = await http.get("/readyz")
                return response if response.status_code == 200 else None

            readyz = await eventually(ready, what="/readyz to answer 200")
            healthz = await http.get("/healthz")
            metrics = await http.get("/metrics")

    body = readyz.json()
    assert body["ready"] is True
    assert body["broker_connected"] is True
    assert body["last_publish_at"] is not None
    assert body["backlog"]["scheduled"] == len(scheduled)
    assert body["backlog"]["due"] == 0
    assert body["backlog"]["quarantined"] == 0
    assert healthz.status_code == 200
    assert healthz.json()["status"] == "alive"
    text = metrics.text
    assert "jobcore_relay_published_messages_total 40.0" in text
    assert "jobcore_relay_broker_connected 1.0" in text
    assert "jobcore_relay_batch_confirm_seconds_count" in text
    assert "jobcore_relay_batch_rows_bucket" in text
    assert "jobcore_relay_outbox_due_rows 0.0" in text


async def test_quarantined_row_admin_verbs_list_requeue_and_discard(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    tmp_path: Path,
) -> None:
    collector = await collect(amqp_channel, topology)
    # Too large for this relay's limit (as for a broker whose max_message_size is small):
    # quarantined on their first attempt, never sent.
    [first, second] = await fill_outbox(db, topology, 2, body=b"x" * 2000)
    good = await fill_outbox(db, topology, 100)
    env = relay_env(JOBCORE_RELAY_MAX_MESSAGE_BYTES="1024")
    with jobcore_process(settings, "relay", log_path=tmp_path / "relay.log", **env):
        await wait_received(collector, {r["message_id"] for r in good})

        async def both_quarantined() -> bool:
            listed = run_cli(settings, "outbox", "list-quarantined", "--json")
            assert listed.returncode == 0, listed.stderr
            return len(orjson.loads(listed.stdout)) == 2

        await eventually(both_quarantined, timeout=20, what="two quarantined rows")
        listed = orjson.loads(run_cli(settings, "outbox", "list-quarantined", "--json").stdout)
        assert {r["message_id"] for r in listed} == {first["message_id"], second["message_id"]}
        assert all(r["attempts"] == 1 and "too_large" in r["last_error"] for r in listed)

        status = run_cli(settings, "outbox", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert orjson.loads(status.stdout)["quarantined"] == 2
        assert orjson.loads(status.stdout)["failing"] == 0
        table = run_cli(settings, "outbox", "list-quarantined")
        assert table.returncode == 0
        assert "MESSAGE_ID" in table.stdout
        assert first["message_id"] in table.stdout

    # The cause fixed (the limit raised to the broker's own), requeue the first by id: the
    # relay publishes it.
    with jobcore_process(settings, "relay", log_path=tmp_path / "relay-2.log", **relay_env()):
        requeued = run_cli(settings, "outbox", "requeue", str(first["id"]), "--json")
        assert requeued.returncode == 0, requeued.stderr
        assert orjson.loads(requeued.stdout)["message_id"] == first["message_id"]

        async def first_delivered() -> bool:
            return await outbox_row(db, first["id"]) is None

        await eventually(first_delivered, timeout=20, what="the requeued row to be published")
        await wait_received(collector, {first["message_id"]})

        # Discard the second (by message id): gone, never published.
        discarded = run_cli(settings, "outbox", "discard", second["message_id"])
        assert discarded.returncode == 0, discarded.stderr
        assert f"discarded outbox row {second['id']}" in discarded.stdout
        assert await outbox_row(db, second["id"]) is None

    assert await outbox_count(db) == 0
    assert second["message_id"] not in collector.distinct


@pytest.mark.parametrize(
    ("verb", "ident", "error"),
    [
        ("requeue", "999999", "no outbox row 999999"),
        ("discard", "9f1c2a57-3c1b-4a0e-8a53-2d8a4b4f7e10", "no outbox row 9f1c2a57"),
        ("requeue", "not-an-id", "neither an outbox id nor a message id"),
    ],
)
async def test_admin_verbs_refuse_unknown_rows_with_one_line(
    settings: Settings, verb: str, ident: str, error: str
) -> None:
    result = run_cli(settings, "outbox", verb, ident)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert error in result.stderr


async def test_admin_verbs_refuse_a_row_that_is_not_quarantined(
    settings: Settings, db: Database, topology: Topology
) -> None:
    [row] = await fill_outbox(db, topology, 1)
    for verb in ("requeue", "discard"):
        result = run_cli(settings, "outbox", verb, str(row["id"]))
        assert result.returncode == 1
        assert "is not quarantined" in result.stderr
    assert await outbox_row(db, row["id"]) is not None


async def test_topology_command_declares_idempotently_and_prints_what_it_declared(
    settings: Settings, topology: Topology, amqp_channel: aio_pika.abc.AbstractChannel
) -> None:
    for _ in range(2):
        result = run_cli(settings, "topology", "--json")
        assert result.returncode == 0, result.stderr
    declared = orjson.loads(result.stdout)
    assert declared["exchange"] == topology.jobs_exchange
    assert declared["dead_letter_queue"] == topology.dead_letter_queue
    names = {q["queue"] for q in declared["queues"]}
    assert topology.queue_name("testq") in names
    for name in [*names, topology.dead_letter_queue]:
        # A passive declare fails (closing the channel) if the queue does not exist.
        await amqp_channel.declare_queue(name, passive=True)
    await amqp_channel.get_exchange(topology.dead_letter_exchange, ensure=True)
    table = run_cli(settings, "topology")
    assert table.returncode == 0
    assert topology.queue_name("testq") in table.stdout
