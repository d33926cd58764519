"""The API on an S3-compatible result store (the suite's real S3 server, scripts/s3.sh):
a stored result is a 302 to a presigned URL, large payloads go to the bucket before the
job row and are read back through ``links.payload`` (never answered as an empty payload),
an enqueue whose upload fails is a 503 that writes nothing, and a request that is
replayed or refused uploads nothing."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx
import orjson
import pytest
from fastapi import FastAPI

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.storage.objectstore import open_result_store
from jobcore.testing.tcpproxy import Mode, TcpProxy
from jobcore.testing.waiting import eventually
from services.api.app import create_app
from services.api.schemas import JobView
from tests.integration.api.support import api, assert_problem, enqueue, finish_job, start_job
from tests.support import s3

INLINE_MAX = 64
# One request per 100 s: nothing refills while a test runs.
SLOW_RATE = 0.01


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
    # Typed by its suffix, as the API answers a file of the local store.
    assert fetched.headers["content-type"] == "text/csv"

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


async def test_an_enqueue_whose_upload_the_store_refuses_is_a_502_that_writes_nothing(
    client: httpx.AsyncClient, db: Database, bucket: str, auth: dict[str, str]
) -> None:
    # A refusal is no outage: retrying cannot help until an operator fixes the bucket's
    # policy or the credentials, so the answer is not a 503 with Retry-After.
    s3.deny(bucket, "s3:PutObject", "jc/payloads/")

    answer = await enqueue(client, auth, payload={"text": "y" * (INLINE_MAX * 4)})

    body = assert_problem(answer, 502, "store-refused")
    assert "retry-after" not in answer.headers
    assert s3.SECRET_KEY not in answer.text
    assert "127.0.0.1" not in body["detail"]
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM jobs")
        count = await cur.fetchone()
    assert count is not None
    assert count["n"] == 0


def stored_payloads(bucket: str) -> list[str]:
    """The keys under payloads/ in the bucket, as the S3 server lists them."""
    listing = s3.client().list_objects_v2(Bucket=bucket, Prefix="jc/payloads/")
    return sorted(item["Key"] for item in listing.get("Contents", []))


def uploads(app: FastAPI) -> float:
    """The API's count of payload uploads."""
    registry = app.state.api.metrics.registry
    return float(registry.get_sample_value("jobcore_api_payload_uploads_total") or 0)


async def test_a_payload_stored_by_reference_is_a_link_never_an_empty_payload(
    client: httpx.AsyncClient, bucket: str, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    text = "x" * (INLINE_MAX * 4)
    job_id = (await enqueue(client, auth, payload={"text": text})).json()["job_id"]

    for query in ({}, {"wait": "0.05"}):  # read at once, and the long-poll's answer
        answer = await client.get(f"/jobs/{job_id}", params=query, headers=auth)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["payload"] is None, body["payload"]
        assert body["payload_ref"] == f"payloads/{uuid.UUID(job_id).hex}.json"
        assert body["links"]["payload"] == f"/jobs/{job_id}/payload"
        JobView.model_validate(body)  # what /openapi.json promises

    linked = await client.get(body["links"]["payload"], headers=auth)
    assert linked.status_code == 302, linked.text
    assert linked.headers["cache-control"] == "no-store"
    location = linked.headers["location"]
    assert "X-Amz-Signature=" in location
    assert s3.SECRET_KEY not in location
    async with httpx.AsyncClient() as outside:
        fetched = await outside.get(location)
    assert fetched.status_code == 200
    assert orjson.loads(fetched.content) == {"text": text, "count": 1}
    assert_problem(
        await client.get(f"/jobs/{job_id}/payload", headers=other_auth), 404, "job-not-found"
    )

    # An inline payload: in the job, and the same JSON at its link.
    small = (await enqueue(client, auth, payload={"text": "hi"})).json()["job_id"]
    body = (await client.get(f"/jobs/{small}", headers=auth)).json()
    assert (body["payload"], body["payload_ref"]) == ({"text": "hi", "count": 1}, None)
    inline = await client.get(f"/jobs/{small}/payload", headers=auth)
    assert inline.status_code == 200
    assert inline.headers["content-type"] == "application/json"
    assert inline.json() == {"text": "hi", "count": 1}


async def test_a_payload_in_the_local_store_is_served_at_its_link(
    settings: Settings, auth: dict[str, str]
) -> None:
    config = settings.model_copy(update={"result_store": "", "inline_payload_max_bytes": 10})
    async with api(config) as (_, client):
        job_id = (await enqueue(client, auth, payload={"text": "more than ten bytes"})).json()[
            "job_id"
        ]
        body = (await client.get(f"/jobs/{job_id}", headers=auth)).json()
        assert body["payload"] is None
        assert body["payload_ref"] is not None
        linked = await client.get(body["links"]["payload"], headers=auth)
    assert linked.status_code == 200, linked.text
    assert linked.headers["content-type"] == "application/json"
    assert linked.json() == {"text": "more than ten bytes", "count": 1}


@pytest.mark.parametrize(
    ("quotas", "refusal"),
    [
        ({"quota_enqueue_rate": SLOW_RATE, "quota_enqueue_burst": 1}, "enqueue-rate-limited"),
        ({"quota_max_unfinished": 1}, "too-many-unfinished-jobs"),
    ],
    ids=["rate", "unfinished"],
)
async def test_a_replayed_or_refused_enqueue_uploads_nothing(
    s3_config: Settings,
    bucket: str,
    proxy: TcpProxy,
    auth: dict[str, str],
    quotas: dict[str, float],
    refusal: str,
) -> None:
    config = s3_config.model_copy(update=quotas)
    large = {"text": "z" * (INLINE_MAX * 4)}
    async with api(config) as (app, client):
        first = await enqueue(
            client,
            auth,
            payload=large,
            headers={"Idempotency-Key": "k1"},
            params={"unique_key": "u1"},
        )
        assert first.status_code == 202, first.text
        assert len(stored_payloads(bucket)) == 1
        assert uploads(app) == 1

        # With the store cut off, an upload would be a 503: none of these tries one.
        proxy.set_mode(Mode.REFUSE)
        again = await enqueue(
            client,
            auth,
            payload=large,
            headers={"Idempotency-Key": "k1"},
            params={"unique_key": "u1"},
        )
        assert again.status_code == 202, again.text
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json()["job_id"] == first.json()["job_id"]
        reused = await enqueue(
            client,
            auth,
            payload={"text": "w" * (INLINE_MAX * 4)},
            headers={"Idempotency-Key": "k1"},
        )
        assert_problem(reused, 422, "idempotency-key-reused")
        taken = await enqueue(client, auth, payload=large, params={"unique_key": "u1"})
        assert_problem(taken, 409, "unique-job-exists")
        over = await enqueue(client, auth, payload=large, headers={"Idempotency-Key": "k2"})
        assert_problem(over, 429, refusal)
        assert over.headers["retry-after"].isdigit()
        assert uploads(app) == 1
        proxy.set_mode(Mode.FORWARD)
    assert stored_payloads(bucket) == [f"jc/payloads/{uuid.UUID(first.json()['job_id']).hex}.json"]


async def test_an_upload_the_store_holds_up_holds_no_database_connection(
    s3_config: Settings, proxy: TcpProxy, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    # An upload waits for the store as long as the store takes: a pooled connection held
    # meanwhile is one fewer for every other request, and a few such uploads drain it.
    config = s3_config.model_copy(update={"db_pool_min": 1, "db_pool_max": 1, "s3_timeout": 20.0})
    async with api(config) as (app, client):
        earlier = await enqueue(client, auth, payload={"text": "hi"})
        assert earlier.status_code == 202, earlier.text
        store = app.state.api.results
        put_payload = store.put_payload
        uploading = threading.Event()

        def signalled_put(job_id: uuid.UUID, data: bytes) -> str:
            uploading.set()
            return put_payload(job_id, data)

        store.put_payload = signalled_put
        proxy.set_mode(Mode.BLACKHOLE)  # the upload hangs until the cut ends
        large = asyncio.create_task(enqueue(client, auth, payload={"text": "x" * (INLINE_MAX * 4)}))
        try:
            await eventually(_is_set(uploading), what="the upload under way")

            # While it hangs: a read, and an enqueue whose payload stays in its row (of
            # another tenant: one of the same group would wait for its turn behind it).
            read = await client.get(f"/jobs/{earlier.json()['job_id']}", headers=auth)
            small = await enqueue(client, other_auth, payload={"text": "still"})

            assert not large.done()
            assert read.status_code == 200, read.text
            assert small.status_code == 202, small.text
        finally:
            proxy.set_mode(Mode.FORWARD)
            stored = await large
        # The connection the upload was on was dropped when the cut ended; the client's
        # retry stores it.
        assert stored.status_code == 202, stored.text


def _is_set(event: threading.Event) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return event.is_set()

    return probe
