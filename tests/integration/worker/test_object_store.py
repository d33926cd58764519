"""Results and large payloads in an S3-compatible bucket (jobcore.storage.objectstore), against
the suite's real S3 server (moto's, scripts/s3.sh): multipart results, payloads by
reference, store outages (the job is given back, its attempts unspent), and the pruner's
deletes and sweep."""

from __future__ import annotations

import asyncio
import hashlib
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.maintenance import retention as retention_module
from jobcore.maintenance.retention import Retention
from jobcore.storage.objectstore import open_result_store
from jobcore.storage.results import StoreUnavailable
from jobcore.testing.pipeline import via_port
from jobcore.testing.tcpproxy import Mode, TcpProxy
from jobcore.testing.waiting import eventually
from jobcore.usecases.jobs import retry_job
from jobcore.usecases.keys import create_key
from jobcore.usecases.timeline import job_timeline
from services.api.app import create_app
from services.worker.app import Worker
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import BlobPayload, UploadPayload
from tests.integration.worker.support import OutboxPump, job_row, status_is, submit
from tests.support import s3

MiB = 1 << 20
INLINE_MAX = 4096


@pytest.fixture
def bucket() -> Iterator[str]:
    try:
        name = s3.new_bucket()
    except Exception as exc:
        pytest.fail(f"the suite's S3 server is not reachable: {exc}", pytrace=False)
    yield name
    s3.remove_bucket(name)


def objects(bucket: str) -> dict[str, dict[str, object]]:
    listing = s3.client().list_objects_v2(Bucket=bucket)
    return {item["Key"]: item for item in listing.get("Contents", [])}


async def test_a_large_result_goes_up_in_parts_and_a_large_payload_by_reference(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    bucket: str,
) -> None:
    config = s3.s3_settings(wsettings, bucket, inline_payload_max_bytes=INLINE_MAX)
    store = open_result_store(config)
    await start_worker(config)
    data = "p" * (INLINE_MAX * 3)
    job_id = await submit(
        db,
        topology,
        "wt_blob",
        BlobPayload(data=data, result_bytes=11 * MiB),
        payload_store=store,
        inline_payload_max_bytes=config.inline_payload_max_bytes,
    )
    # The row keeps the key, not the payload; the object is there before the job runs.
    row = await job_row(db, job_id)
    assert row["payload_ref"] == f"payloads/{job_id.hex}.json"
    assert row["payload"] == {}

    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")

    # The handler saw the same payload.
    assert row["result"]["payload_sha256"] == hashlib.sha256(data.encode()).hexdigest()
    assert re.fullmatch(rf"{job_id.hex}-[0-9a-f]{{32}}\.bin", row["result_ref"])
    stored = objects(bucket)
    assert f"jc/payloads/{job_id.hex}.json" in stored
    # 11 MiB in 5 MiB parts: a multipart upload of three parts (S3's ETag says "-3").
    head = s3.client().head_object(Bucket=bucket, Key=f"jc/results/{row['result_ref']}")
    assert head["ContentLength"] == 11 * MiB
    assert head["ETag"].strip('"').endswith("-3")
    body = store.get(row["result_ref"])
    assert len(body) == 11 * MiB
    assert (body[:1], body[-1:]) == (b"\x00", b"\x0a")


async def released_events(db: Database, job_id: uuid.UUID) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT attempt, detail FROM job_events WHERE job_id = %s AND kind = 'released' "
            "ORDER BY id",
            (job_id,),
        )
        return [dict(row) for row in await cur.fetchall()]


async def given_back_while_the_store_is_away(
    db: Database, worker: Worker, job_id: uuid.UUID, *, during: str
) -> dict[str, Any]:
    """Wait until the job was given back twice for the outage; check that it did not cost
    an attempt (its only one), that last_error and its timeline say why, and the metric."""

    async def given_back_twice() -> list[dict[str, Any]] | None:
        row = await job_row(db, job_id)
        # A job failed by the outage will never be given back: say so at once.
        assert row["status"] != "failed", row["last_error"]
        events = await released_events(db, job_id)
        return events if len(events) >= 2 else None

    events = await eventually(
        given_back_twice, timeout=30, what="the job given back while the store is away"
    )
    row = await job_row(db, job_id)
    assert row["status"] in ("pending", "running")
    assert row["max_attempts"] == 1
    assert row["attempts"] <= 1  # 0 while pending again, 1 while its only attempt runs
    expected = f"{during} failed: object store unavailable: StoreUnavailable"
    assert str(row["last_error"]).startswith(expected)
    assert s3.SECRET_KEY not in str(row["last_error"])
    for event in events:
        assert event["attempt"] == 1
        assert str(event["detail"]["error"]).startswith(expected)
        assert event["detail"]["until"] is not None
        assert s3.SECRET_KEY not in str(event["detail"])
    assert worker.metrics.counts["processed.store_unavailable"] >= 2
    assert worker.metrics.counts["processed.failed"] == 0
    assert worker.metrics.counts["processed.retried"] == 0
    return row


def outage_settings(wsettings: Settings, bucket: str, proxy: TcpProxy, **extra: Any) -> Settings:
    return s3.s3_settings(
        wsettings,
        bucket,
        endpoint=f"http://127.0.0.1:{proxy.port}",
        s3_timeout=1.0,
        retry_backoff_base=0.2,
        retry_backoff_cap=0.5,
        **extra,
    )


async def test_a_store_outage_while_storing_the_result_gives_the_job_back_unfailed(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    bucket: str,
) -> None:
    """Issue 35: the runner's own put of a large returned result fails on the job's last
    attempt; the job is given back (attempt unspent), and succeeds once the store is back."""
    data = "o" * 64
    proxy = TcpProxy("127.0.0.1", s3.PORT)
    await proxy.start()
    try:
        # Any result above 16 bytes goes to the store (the handler's is about 100).
        config = outage_settings(wsettings, bucket, proxy, inline_result_max_bytes=16)
        proxy.set_mode(Mode.REFUSE)
        worker = await start_worker(config)
        job_id = await submit(db, topology, "wt_blob", BlobPayload(data=data), max_attempts=1)
        await given_back_while_the_store_is_away(db, worker, job_id, during="storing the result")

        proxy.set_mode(Mode.FORWARD)
        row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    finally:
        await proxy.stop()
    assert row["attempts"] == 1
    assert row["result"] is None
    body = open_result_store(s3.s3_settings(wsettings, bucket)).get(row["result_ref"])
    assert orjson.loads(body) == {
        "attempt": 1,
        "payload_sha256": hashlib.sha256(data.encode()).hexdigest(),
    }


async def test_a_blip_of_the_store_is_ridden_out_within_the_lease(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first put of the result fails: the worker tries again before giving the job
    back (the result is only in memory), so the job succeeds in its only attempt."""
    worker = await start_worker(s3.s3_settings(wsettings, bucket, inline_result_max_bytes=16))
    store = worker.executor.result_store
    real_put = store.put
    puts: list[uuid.UUID] = []

    def put_after_a_blip(
        job_id: uuid.UUID, data: bytes, *, suffix: str = "bin", lease_token: uuid.UUID | None
    ) -> str:
        puts.append(job_id)
        if len(puts) == 1:
            raise StoreUnavailable("object store s3://test: injected failure")
        return real_put(job_id, data, suffix=suffix, lease_token=lease_token)

    monkeypatch.setattr(store, "put", put_after_a_blip)
    job_id = await submit(db, topology, "wt_blob", BlobPayload(data="b" * 64), max_attempts=1)

    row = await eventually(lambda: status_is(db, job_id, "succeeded", "failed"), what="the end")
    assert (row["status"], row["attempts"], row["last_error"]) == ("succeeded", 1, None)
    assert puts == [job_id, job_id]
    assert await released_events(db, job_id) == []
    assert worker.metrics.counts["processed.store_unavailable"] == 0
    body = open_result_store(s3.s3_settings(wsettings, bucket)).get(row["result_ref"])
    assert orjson.loads(body)["attempt"] == 1


async def test_a_store_outage_in_the_handlers_own_upload_gives_the_job_back_unfailed(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    bucket: str,
) -> None:
    proxy = TcpProxy("127.0.0.1", s3.PORT)
    await proxy.start()
    try:
        config = outage_settings(wsettings, bucket, proxy)
        worker = await start_worker(config)
        proxy.set_mode(Mode.REFUSE)
        job_id = await submit(
            db, topology, "wt_blob", BlobPayload(result_bytes=2 * MiB), max_attempts=1
        )
        await given_back_while_the_store_is_away(db, worker, job_id, during="running the handler")

        proxy.set_mode(Mode.FORWARD)
        row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    finally:
        await proxy.stop()
    assert row["attempts"] == 1
    body = open_result_store(s3.s3_settings(wsettings, bucket)).get(row["result_ref"])
    assert len(body) == 2 * MiB


async def test_the_pruner_deletes_objects_with_their_jobs_and_sweeps_orphan_uploads(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = s3.s3_settings(wsettings, bucket, inline_payload_max_bytes=INLINE_MAX)
    store = open_result_store(config)
    big = BlobPayload(data="q" * (INLINE_MAX * 2))
    kept = await submit(
        db, topology, "wt_blob", big, payload_store=store, inline_payload_max_bytes=INLINE_MAX
    )
    pruned = await submit(
        db, topology, "wt_blob", big, payload_store=store, inline_payload_max_bytes=INLINE_MAX
    )
    result_key = store.put(pruned, b"result", suffix="bin")
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'succeeded', result_ref = %(ref)s, "
            "finished_at = now() - interval '30 days' WHERE id = %(id)s",
            {"ref": result_key, "id": pruned},
        )
    # An upload whose job never committed: no row names it.
    orphan = store.put_payload(uuid.uuid4(), b"{}")
    before = set(objects(bucket))
    assert {f"jc/{orphan}", f"jc/payloads/{kept.hex}.json", f"jc/results/{result_key}"} <= before

    # The pruned job's objects go with it, in the same pass, without the sweep.
    report = await Retention(config, db).prune(pause=_no_rest, sweep_files=False)
    assert report.tables["jobs"] == 1
    assert report.tables["result_files"] == 2
    assert set(objects(bucket)) == {f"jc/{orphan}", f"jc/payloads/{kept.hex}.json"}

    # The sweep deletes the upload no row names once it is older than the grace period
    # (every object is, now), and keeps the live job's payload.
    monkeypatch.setattr(retention_module, "STALE_FILE_AGE", 0.0)
    report = await Retention(config, db).prune(pause=_no_rest)
    assert report.tables["result_files"] == 1
    assert set(objects(bucket)) == {f"jc/payloads/{kept.hex}.json"}


async def _no_rest(_: float) -> bool:
    return False


async def test_a_retry_copies_a_payload_stored_by_reference(
    db: Database, topology: Topology, wsettings: Settings, bucket: str
) -> None:
    config = s3.s3_settings(wsettings, bucket, inline_payload_max_bytes=INLINE_MAX)
    store = open_result_store(config)
    payload = BlobPayload(data="r" * (INLINE_MAX * 2))
    job_id = await submit(
        db, topology, "wt_blob", payload, payload_store=store, inline_payload_max_bytes=INLINE_MAX
    )
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'failed', finished_at = now() WHERE id = %s", (job_id,)
        )

    outcome = await retry_job(db, config, default_registry, job_id, actor="tests")

    copy = await job_row(db, outcome.job_id)
    assert copy["payload_ref"] == f"payloads/{outcome.job_id.hex}.json"
    stored = await asyncio.to_thread(store.get, copy["payload_ref"])
    assert BlobPayload.model_validate_json(stored) == payload


async def test_a_store_outage_while_reading_the_payload_gives_the_job_back_unfailed(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    bucket: str,
) -> None:
    store = open_result_store(s3.s3_settings(wsettings, bucket))
    proxy = TcpProxy("127.0.0.1", s3.PORT)
    await proxy.start()
    try:
        config = outage_settings(wsettings, bucket, proxy)
        proxy.set_mode(Mode.REFUSE)
        worker = await start_worker(config)
        data = "z" * (INLINE_MAX * 2)
        job_id = await submit(
            db,
            topology,
            "wt_blob",
            BlobPayload(data=data),
            payload_store=store,
            inline_payload_max_bytes=INLINE_MAX,
            max_attempts=1,
        )
        await given_back_while_the_store_is_away(db, worker, job_id, during="reading the payload")

        proxy.set_mode(Mode.FORWARD)
        row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    finally:
        await proxy.stop()
    assert row["attempts"] == 1
    assert row["result"] == {
        "attempt": 1,
        "payload_sha256": hashlib.sha256(data.encode()).hexdigest(),
    }


async def claims(db: Database, job_id: uuid.UUID) -> int:
    """How many times a worker claimed the job (its timeline's `claimed` events): each
    claim is one run of its handler."""
    found = await job_timeline(db, job_id, tenant=None)
    assert found is not None
    return sum(event.kind == "claimed" for event in found.events)


async def ended_without_a_give_back(db: Database, job_id: uuid.UUID) -> dict[str, Any] | None:
    """A probe: the job's row once it ended; fails at once if it was given back, which a
    refusal of the store must never cause (it would be given back for ever)."""
    assert await released_events(db, job_id) == [], "a refusal was taken for an outage"
    return await status_is(db, job_id, "succeeded", "failed")


async def test_a_store_that_refuses_the_result_fails_the_attempt_once(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    bucket: str,
) -> None:
    """Credentials without PutObject on results/: no outage, so the job is not given back
    (which would run its handler again and again, for ever); its only attempt fails, with
    a last_error that says the store refused, and the handler ran once."""
    s3.deny(bucket, "s3:PutObject", "jc/results/")
    # Any result above 16 bytes goes to the store (the handler's is about 100).
    worker = await start_worker(s3.s3_settings(wsettings, bucket, inline_result_max_bytes=16))
    job_id = await submit(db, topology, "wt_blob", BlobPayload(data="d" * 64), max_attempts=1)

    row = await eventually(
        lambda: ended_without_a_give_back(db, job_id), timeout=30, what="the job to end"
    )
    assert (row["status"], row["attempts"], row["result_ref"]) == ("failed", 1, None)
    error = str(row["last_error"])
    assert error.startswith("storing the result failed: StoreRefused: object store s3://"), error
    assert "403" in error
    assert s3.SECRET_KEY not in error
    assert await claims(db, job_id) == 1
    assert worker.metrics.counts["processed.store_unavailable"] == 0
    assert worker.metrics.counts["processed.failed"] == 1


async def test_a_payload_the_store_refuses_to_read_fails_the_job_not_waits(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    bucket: str,
) -> None:
    config = s3.s3_settings(wsettings, bucket, inline_payload_max_bytes=INLINE_MAX)
    store = open_result_store(config)
    job_id = await submit(
        db,
        topology,
        "wt_blob",
        BlobPayload(data="g" * (INLINE_MAX * 2)),
        payload_store=store,
        inline_payload_max_bytes=INLINE_MAX,
        max_attempts=1,
    )
    # Stored; from now on it can never be read back.
    s3.deny(bucket, "s3:GetObject", "jc/payloads/")
    await start_worker(config)

    row = await eventually(
        lambda: ended_without_a_give_back(db, job_id), timeout=30, what="the job to end"
    )
    assert (row["status"], row["attempts"]) == ("failed", 1)
    error = str(row["last_error"])
    assert error.startswith("reading the payload failed: StoreRefused: object store s3://"), error
    assert "403" in error
    assert s3.SECRET_KEY not in error


async def test_an_outage_gives_a_job_back_a_bounded_number_of_times(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    bucket: str,
) -> None:
    """The store stays away (nothing listens behind the proxy): the job is given back
    JOBCORE_MAX_STORE_GIVE_BACKS times without spending its attempt, then the next outage
    counts as its attempt, here its only one, and it fails saying why."""
    proxy = TcpProxy("127.0.0.1", s3.PORT)
    await proxy.start()
    try:
        config = outage_settings(
            wsettings, bucket, proxy, inline_result_max_bytes=16, max_store_give_backs=2
        )
        proxy.set_mode(Mode.REFUSE)
        worker = await start_worker(config)
        job_id = await submit(db, topology, "wt_blob", BlobPayload(data="h" * 64), max_attempts=1)
        row = await eventually(
            lambda: status_is(db, job_id, "succeeded", "failed"), timeout=30, what="the end"
        )
    finally:
        await proxy.stop()
    assert (row["status"], row["attempts"]) == ("failed", 1)
    error = str(row["last_error"])
    assert error.startswith(
        "storing the result failed: object store unavailable, and the job was given back "
        "2 times already: StoreUnavailable"
    ), error
    assert [event["attempt"] for event in await released_events(db, job_id)] == [1, 1]
    assert await claims(db, job_id) == 3
    assert worker.metrics.counts["processed.store_unavailable"] == 2
    assert worker.metrics.counts["processed.failed"] == 1


async def test_a_fenced_out_upload_never_replaces_the_committed_result(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Worker 1's upload of attempt 1 outlives its lease (cut off from PostgreSQL, the
    watchdog stops the handler, but not the thread that uploads); attempt 2 runs and
    succeeds with its result; then attempt 1's upload ends. The API serves attempt 2's
    result, and the pruner's sweep deletes attempt 1's object, which no row names."""
    config = s3.s3_settings(wsettings, bucket)
    target = urlsplit(wsettings.database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    gate = tmp_path / "gate"
    try:
        cut_off = config.model_copy(
            update={
                "database_url": via_port(config.database_url, proxy.port),
                "db_connect_timeout": 1.0,
                "db_operation_timeout": 2.0,
            }
        )
        worker_1 = await start_worker(cut_off)
        job_id = await submit(db, topology, "wt_slow_upload", UploadPayload(gate=str(gate)))
        await eventually(lambda: status_is(db, job_id, "running"), what="attempt 1 to run")
        proxy.set_mode(Mode.BLACKHOLE)

        async def handler_stopped() -> bool:
            counts = worker_1.metrics.counts
            return counts["processed.lease_lost"] == 1 and not worker_1.executor.running

        await eventually(handler_stopped, timeout=15, what="worker 1's lease to run out")
        # Worker 1 reaches PostgreSQL again (it may hold attempt 2's message, waiting for
        # it), and a second worker joins: either may run attempt 2, while attempt 1's
        # upload still waits in worker 1's thread.
        proxy.set_mode(Mode.FORWARD)
        await start_worker(config)
        row = await eventually(
            lambda: status_is(db, job_id, "succeeded"), timeout=30, what="attempt 2's success"
        )
        assert row["attempts"] == 2
        committed = row["result_ref"]

        # Attempt 1's upload, still waiting in worker 1's thread, goes on and ends.
        gate.touch()

        async def stale_upload_done() -> bool:
            bodies = [await asyncio.to_thread(_body, bucket, key) for key in objects(bucket)]
            return b"written by attempt 1" in bodies

        await eventually(stale_upload_done, timeout=30, what="attempt 1's upload to end")
    finally:
        gate.touch()
        proxy.set_mode(Mode.FORWARD)
        await proxy.stop()

    key = (await create_key(db, "t", "tests", actor="tests")).key
    app = create_app(config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as api:
            answer = await api.get(
                f"/jobs/{job_id}/result", headers={"Authorization": f"Bearer {key}"}
            )
    assert answer.status_code == 302
    async with httpx.AsyncClient() as bucket_client:
        body = await bucket_client.get(answer.headers["location"])
    assert (body.status_code, body.content) == (200, b"written by attempt 2")
    assert (await job_row(db, job_id))["result_ref"] == committed

    # The sweep finds attempt 1's object (its job lives, but names another) and deletes
    # it; the committed result stays.
    monkeypatch.setattr(retention_module, "STALE_FILE_AGE", 0.0)
    report = await Retention(config, db).prune(pause=_no_rest)
    assert report.tables["result_files"] == 1
    assert set(objects(bucket)) == {f"jc/results/{committed}"}


def _body(bucket: str, key: str) -> bytes:
    return bytes(s3.client().get_object(Bucket=bucket, Key=key)["Body"].read())
