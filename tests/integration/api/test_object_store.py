"""The API on an S3-compatible result store (the suite's real S3 server, scripts/s3.sh):
a stored result is a 302 to a presigned URL, large payloads go to the bucket before the
job row, and an enqueue whose upload fails is a 503 that writes nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import orjson
import pytest

from jobcore.db import Database
from jobcore.objectstore import open_result_store
from jobcore.settings import Settings
from jobcore.tcpproxy import Mode, TcpProxy
from services.api.app import create_app
from tests.integration.api.support import assert_problem, enqueue, finish_job, start_job
from tests.support import s3

INLINE_MAX = 64


@pytest.fixture
def bucket() -> Iterator[str]:
    try:
        name = s3.new_bucket()
    except Exception as exc:
        pytest.fail(f"the suite's S3 server is not reachable: {exc}", pytrace=False)
    yield name
    s3.remove_bucket(name)


@pytest.fixture
async def proxy() -> AsyncIterator[TcpProxy]:
    """The S3 server behind a proxy the test can cut."""
    proxy = TcpProxy("127.0.0.1", s3.PORT)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest.fixture
def s3_config(settings: Settings, bucket: str, proxy: TcpProxy) -> Settings:
    return s3.s3_settings(
        settings,
        bucket,
        endpoint=f"http://127.0.0.1:{proxy.port}",
        inline_payload_max_bytes=INLINE_MAX,
        s3_timeout=1.0,
    )


@pytest.fixture
async def client(s3_config: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(s3_config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as c:
            yield c


async def test_a_stored_result_is_a_redirect_to_a_presigned_url_for_its_tenant_only(
    client: httpx.AsyncClient,
    db: Database,
    s3_config: Settings,
    auth: dict[str, str],
    other_auth: dict[str, str],
) -> None:
    job_id = (await enqueue(client, auth)).json()["job_id"]
    await start_job(db, job_id)
    store = open_result_store(s3_config)
    # In a thread: the proxy in front of the store runs on this event loop.
    key = await asyncio.to_thread(store.put, uuid.UUID(job_id), b"a,b\n1,2\n", suffix="csv")
    await finish_job(db, job_id, "succeeded", result_ref=key)

    answer = await client.get(f"/jobs/{job_id}/result", headers=auth)

    assert answer.status_code == 302, answer.text
    location = answer.headers["location"]
    assert location.startswith(s3_config.s3_endpoint_url)
    assert "X-Amz-Signature=" in location
    assert f"X-Amz-Expires={s3_config.s3_presign_expiry}" in location
    assert s3.SECRET_KEY not in location
    async with httpx.AsyncClient() as outside:  # the client fetches it from the store
        fetched = await outside.get(location)
    assert fetched.status_code == 200
    assert fetched.content == b"a,b\n1,2\n"

    # Another tenant's job is not found, as for an inline result.
    assert_problem(
        await client.get(f"/jobs/{job_id}/result", headers=other_auth), 404, "job-not-found"
    )


async def test_a_large_payload_goes_to_the_store_before_the_job_row(
    client: httpx.AsyncClient, db: Database, bucket: str, auth: dict[str, str]
) -> None:
    text = "x" * (INLINE_MAX * 4)
    answer = await enqueue(client, auth, payload={"text": text})
    assert answer.status_code == 202, answer.text
    job_id = uuid.UUID(answer.json()["job_id"])

    async with db.connection() as conn:
        cur = await conn.execute("SELECT payload, payload_ref FROM jobs WHERE id = %s", (job_id,))
        row = await cur.fetchone()
    assert row is not None
    assert row["payload_ref"] == f"payloads/{job_id.hex}.json"
    assert row["payload"] == {}
    stored = s3.client().get_object(Bucket=bucket, Key=f"jc/payloads/{job_id.hex}.json")
    assert orjson.loads(stored["Body"].read()) == {"text": text, "count": 1}

    small = await enqueue(client, auth, payload={"text": "hi"})
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT payload, payload_ref FROM jobs WHERE id = %s", (small.json()["job_id"],)
        )
        row = await cur.fetchone()
    assert row is not None
    assert (row["payload"], row["payload_ref"]) == ({"text": "hi", "count": 1}, None)


async def test_an_enqueue_whose_upload_fails_is_a_503_that_writes_nothing(
    client: httpx.AsyncClient, db: Database, proxy: TcpProxy, auth: dict[str, str]
) -> None:
    proxy.set_mode(Mode.REFUSE)

    answer = await enqueue(client, auth, payload={"text": "y" * (INLINE_MAX * 4)})

    body = assert_problem(answer, 503, "store-unavailable")
    assert answer.headers["retry-after"].isdigit()
    assert s3.SECRET_KEY not in answer.text
    assert "127.0.0.1" not in body["detail"]  # the client is told to retry, not where
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM jobs")
        count = await cur.fetchone()
    assert count is not None
    assert count["n"] == 0
    # A payload small enough to stay inline does not need the store.
    assert (await enqueue(client, auth, payload={"text": "hi"})).status_code == 202
