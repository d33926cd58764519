"""Helpers for the worker tests: a stand-in relay, job helpers, worker settings.

The real relay lives in ``services/relay`` (another engineer's work); these tests must not
depend on it, so :class:`OutboxPump` publishes outbox rows per the wire contract itself:
due rows, mandatory, persistent, with publisher confirms, deleted once confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import orjson
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute, fetch_all
from jobcore.database.sql import Query
from jobcore.database.sql.jobs.run import JOB_SUCCEED_MANY
from jobcore.execution.completion_webhooks import completion_params
from jobcore.execution.job_messages import job_message_row
from jobcore.execution.registry import default_registry
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.settings import Settings
from jobcore.maintenance import Maintainer, MaintenanceService
from jobcore.storage.results import ResultStore
from jobcore.testing.jobtypes import EchoPayload
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from services.worker.metrics import WorkerMetrics
from tests.conftest import TEST_JOB_MODULES
from tests.integration.worker import jobtypes

WORKER_TEST_MODULES = (*TEST_JOB_MODULES, jobtypes.MODULE)

# A worker process imports a lot before it consumes; on a loaded 2-core machine that has
# taken several seconds.
PROCESS_START = 30.0

DUE_ROWS = Query(
    "test_due_outbox_rows",
    "Lock the outbox rows that are due (the stand-in relay).",
    """
    SELECT * FROM outbox
    WHERE available_at <= now() AND quarantined_at IS NULL
    ORDER BY id
    FOR UPDATE SKIP LOCKED
    """,
)
DELETE_ROWS = Query(
    "test_delete_outbox_rows",
    "Forget published rows.",
    "DELETE FROM outbox WHERE id = ANY(%(ids)s)",
)


TAKE_OVER = Query(
    "test_take_over",
    "Make a job running under a given lease token, as another worker's claim would.",
    """
    UPDATE jobs SET status = 'running', attempts = 1, lease_token = %(token)s,
                    lease_expires_at = now() + interval '1 minute', started_at = now()
    WHERE id = %(id)s
    """,
)


async def running_echo_job(db: Database, topology: Topology, token: uuid.UUID) -> uuid.UUID:
    """An echo job, running under lease ``token`` as another worker's claim would make it."""
    async with db.unit_of_work() as uow:
        job = await enqueue(
            uow,
            topology,
            EnqueueRequest(
                tenant="t", job_type=default_registry.get("echo"), payload=EchoPayload(text="x")
            ),
        )
        await execute(uow, TAKE_OVER({"id": job.job_id, "token": token}))
        await uow.commit()
    return job.job_id


HOUR = 3600.0

# Moves a job's creation and last change back by `seconds`, as if it had waited that long
# (the sweeper's tests make jobs stale so, never by waiting).
BACKDATE = Query(
    "test_backdate_job",
    "Make a job look older than it is.",
    """
    UPDATE jobs
    SET created_at = created_at - make_interval(secs => %(seconds)s),
        updated_at = updated_at - make_interval(secs => %(seconds)s)
    WHERE id = %(id)s
    """,
)


async def backdate(db: Database, job_id: uuid.UUID, seconds: float = 2 * HOUR) -> None:
    async with db.unit_of_work() as uow:
        await execute(uow, BACKDATE({"id": job_id, "seconds": seconds}))
        await uow.commit()


def worker_settings(settings: Settings, **overrides: Any) -> Settings:
    """The test's settings, tuned so that leases, backoff and the reaper act within seconds."""
    values: dict[str, Any] = {
        "job_modules": WORKER_TEST_MODULES,
        "worker_health_port": 0,
        "worker_reaper_interval": 0.2,
        "worker_rescuer_interval": 0.2,
        "sweeper_interval": 0.2,
        "retry_backoff_base": 0.2,
        "retry_backoff_cap": 0.8,
        "shutdown_grace": 2.0,
        **overrides,
    }
    return settings.model_copy(update=values)


def relayed(settings: Settings) -> Settings:
    """``settings`` with direct pickup off: every job reaches the worker as a delivery that
    a relay (or the test's OutboxPump) published, for tests of the broker's path."""
    return settings.model_copy(update={"direct_pickup": False})


@dataclass(frozen=True)
class PublishedRow:
    message_id: uuid.UUID
    job_id: uuid.UUID | None
    body: bytes
    available_at: datetime
    created_at: datetime


def amqp_message(row: dict[str, Any]) -> aio_pika.Message:
    """An outbox row as the AMQP message the wire contract describes."""
    return aio_pika.Message(
        bytes(row["body"]),
        message_id=str(row["message_id"]),
        type=row["message_type"],
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers={**(row["headers"] or {}), "x-envelope-version": 1},
    )


class OutboxPump:
    """Publishes due outbox rows to the broker (a minimal relay for the worker tests)."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self.topology = Topology.from_settings(settings)
        self.published: list[PublishedRow] = []
        self.paused = asyncio.Event()
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None

    async def channel(self) -> aio_pika.abc.AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            await self.close()
            self._connection = await aio_pika.connect(self.settings.amqp_url, timeout=5)
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
            await self.topology.declare(self._channel, default_registry.queues())
        return self._channel

    async def publish(self, row: dict[str, Any]) -> None:
        channel = await self.channel()
        exchange = await channel.get_exchange(row["exchange"], ensure=False)
        await exchange.publish(amqp_message(row), routing_key=row["routing_key"], mandatory=True)

    async def drain(self, *, delete: bool = True) -> int:
        """Publish every due row once (confirmed); delete them unless told to keep them."""
        async with self.db.unit_of_work() as uow:
            rows = await fetch_all(uow, DUE_ROWS({}))
            for row in rows:
                await self.publish(row)
                self.published.append(
                    PublishedRow(
                        row["message_id"],
                        row["job_id"],
                        bytes(row["body"]),
                        row["available_at"],
                        row["created_at"],
                    )
                )
            if delete and rows:
                await execute(uow, DELETE_ROWS({"ids": [row["id"] for row in rows]}))
            await uow.commit()
        return len(rows)

    async def run(self) -> None:
        while True:
            if not self.paused.is_set():
                try:
                    await self.drain()
                except Exception:  # the broker is away (a chaos test): like a relay, retry
                    await self.close()
            await asyncio.sleep(0.05)  # the stand-in relay's poll interval

    async def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()


@contextlib.asynccontextmanager
async def running_pump(pump: OutboxPump) -> AsyncIterator[OutboxPump]:
    task = asyncio.create_task(pump.run())
    try:
        yield pump
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await pump.close()


async def submit(
    db: Database,
    topology: Topology,
    job_type: str,
    payload: BaseModel,
    payload_store: ResultStore | None = None,
    inline_payload_max_bytes: int | None = None,
    **kwargs: Any,
) -> uuid.UUID:
    """Enqueue as the API does; ``kwargs`` are the request's fields, the two stores' options
    are how it is written."""
    async with db.unit_of_work() as uow:
        request = EnqueueRequest(
            tenant="t", job_type=default_registry.get(job_type), payload=payload, **kwargs
        )
        result = await enqueue(
            uow,
            topology,
            request,
            payload_store=payload_store,
            inline_payload_max_bytes=inline_payload_max_bytes,
        )
        await uow.commit()
    return result.job_id


async def job_row(db: Database, job_id: uuid.UUID) -> dict[str, Any]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT * FROM jobs WHERE id = %s", (job_id,))
        row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def job_status(db: Database, job_id: uuid.UUID) -> str:
    return str((await job_row(db, job_id))["status"])


async def effects(db: Database, job_id: uuid.UUID) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM job_effects WHERE job_id = %s ORDER BY id", (job_id,)
        )
        return [dict(r) for r in await cur.fetchall()]


async def ledger(db: Database, job_id: uuid.UUID) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM ledger_entries WHERE job_id = %s ORDER BY id", (job_id,)
        )
        return [dict(r) for r in await cur.fetchall()]


async def balance(db: Database, account: str) -> int | None:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT balance_cents FROM ledger_accounts WHERE account = %s", (account,)
        )
        row = await cur.fetchone()
    return None if row is None else int(row["balance_cents"])


async def outbox_rows(db: Database, job_id: uuid.UUID) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT * FROM outbox WHERE job_id = %s ORDER BY id", (job_id,))
        return [dict(r) for r in await cur.fetchall()]


async def status_is(db: Database, job_id: uuid.UUID, *statuses: str) -> dict[str, Any] | None:
    """A probe for ``eventually``: the job row once its status is one of ``statuses``."""
    row = await job_row(db, job_id)
    return row if row["status"] in statuses else None


def worker_env(settings: Settings) -> dict[str, str]:
    """The settings a worker process needs beyond what ``settings_env`` passes on."""
    return {
        "JOBCORE_WORKER_HEALTH_PORT": str(settings.worker_health_port),
        "JOBCORE_WORKER_REAPER_INTERVAL": str(settings.worker_reaper_interval),
        "JOBCORE_WORKER_RESCUER_INTERVAL": str(settings.worker_rescuer_interval),
        "JOBCORE_SWEEPER_INTERVAL": str(settings.sweeper_interval),
        "JOBCORE_RETRY_BACKOFF_BASE": str(settings.retry_backoff_base),
        "JOBCORE_RETRY_BACKOFF_CAP": str(settings.retry_backoff_cap),
    }


def log_has(path: Path, text: str) -> Callable[[], Awaitable[bool]]:
    """A probe for ``eventually``: the process log at ``path`` contains ``text``."""

    async def probe() -> bool:
        return path.exists() and text in path.read_text(errors="replace")

    return probe


def exited(proc: subprocess.Popen[bytes]) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return proc.poll() is not None

    return probe


def outcome_params(
    statement: Query,
    job_id: uuid.UUID,
    token: uuid.UUID,
    topology: Topology,
    settings: Settings,
    *,
    ends: str = "failed",
) -> dict[str, Any]:
    """Parameters of a worker outcome statement for ``job_id`` under lease ``token``;
    ``ends``: the status JOB_END_RUNNING ends the job in."""
    completion = completion_params(topology, settings)
    if statement is JOB_SUCCEED_MANY:
        return {
            **completion,
            "ids": [job_id],
            "lease_tokens": [token],
            "results": ['{"ok": true}'],
            "result_refs": [None],
            "effects": orjson.dumps(
                [
                    {
                        "job_id": str(job_id),
                        "lease_token": str(token),
                        "kind": "charged",
                        "detail": {"cents": 100},
                    }
                ]
            ).decode(),
        }
    message = job_message_row(
        topology,
        job_id=job_id,
        job_type=default_registry.get("echo"),
        attempt=2,
        trace_headers={},
    )
    return {
        **completion,
        **message,
        "id": job_id,
        "lease_token": token,
        "error": "boom",
        "status": ends,
        "delay": 0.0,
        "channel": OUTBOX_CHANNEL,
    }


# A fault injected in the database: inserting an inbox row for one consumer raises, as an
# error no code path expects would (a read-only or full database, a bug in a statement).
# The sequence counts the refusals; sequences are not rolled back with the statement.
_REFUSE_INBOX = """
CREATE SEQUENCE public.test_inbox_refusals;
CREATE FUNCTION test_refuse_inbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.consumer = TG_ARGV[0] THEN
        PERFORM nextval('public.test_inbox_refusals');
        RAISE EXCEPTION 'injected fault: the inbox refuses this row';
    END IF;
    RETURN NEW;
END $$;
"""
_ALLOW_INBOX = "DROP TRIGGER IF EXISTS test_refuse_inbox ON inbox"


class InboxRefusal:
    """While active, every inbox row for ``consumer`` is refused with an error."""

    def __init__(self, db: Database, consumer: str) -> None:
        self.db = db
        self.consumer = consumer

    async def start(self) -> None:
        async with self.db.connection() as conn:
            await conn.execute(_REFUSE_INBOX)
            await conn.execute(
                "CREATE TRIGGER test_refuse_inbox BEFORE INSERT ON inbox FOR EACH ROW "
                f"EXECUTE FUNCTION test_refuse_inbox('{self.consumer}')"
            )

    async def stop(self) -> None:
        async with self.db.connection() as conn:
            await conn.execute(_ALLOW_INBOX)

    async def refusals(self) -> int:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS n "
                "FROM public.test_inbox_refusals"
            )
            row = await cur.fetchone()
        return 0 if row is None else int(row["n"])


async def readiness(port: int) -> tuple[int, dict[str, Any]]:
    """The status code and body of a health server's ``/readyz``."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
        response = await client.get("/readyz")
    return response.status_code, response.json()


class Maintenance:
    """One maintainer running the given services, driven by hand (``await m.round()``)."""

    def __init__(
        self,
        db: Database,
        owner: str,
        *services: MaintenanceService[Any],
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.maintainer = Maintainer(db, list(services), owner=owner)
        self.services = services
        # What the services count to (the one they were built with).
        self.metrics = metrics if metrics is not None else WorkerMetrics()

    @property
    def is_leader(self) -> bool:
        return self.maintainer.is_leader

    async def round(self) -> int:
        """An election, then a round of each service: what they did, together."""
        return sum((await self.maintainer.tick()).values())
