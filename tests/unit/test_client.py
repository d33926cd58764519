"""jobcore.client without a server: the retry budget, the flows the two clients share (fed
answers by hand), problem JSON as errors, and Standard Webhooks verification against
bodies signed here by the spec's own recipe."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any, TypeVar

import httpx
import orjson
import pytest
from pydantic import BaseModel

from jobcore.client import (
    Accepted,
    ApiError,
    AsyncClient,
    Client,
    ClientError,
    ConnectionFailed,
    NotFound,
    RetryPolicy,
    ServerError,
    ServiceUnavailable,
    TooManyRequests,
    UnprocessableContent,
    WaitTimeout,
    WebhookVerificationFailed,
    verify_webhook,
)
from jobcore.client.core import Call, Core, Flow, JobFilter, Sleep
from jobcore.client.errors import retry_after_seconds
from jobcore.client.retries import Attempts

T = TypeVar("T")
BASE = "http://jobcore.test"
JOB_ID = uuid.UUID("0b7c4f9e-8a51-4c1e-9d0c-6f1f3f7c2a10")
PROBLEMS = "https://jobcore.dev/problems/"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def links(job_id: uuid.UUID = JOB_ID) -> dict[str, str]:
    path = f"/jobs/{job_id}"
    return {"self": path, "result": f"{path}/result", "cancel": f"{path}/cancel"}


def job_body(status: str = "pending", job_id: uuid.UUID = JOB_ID) -> dict[str, Any]:
    return {
        "id": str(job_id),
        "type": "echo",
        "status": status,
        "entity_id": None,
        "attempts": 0,
        "max_attempts": 3,
        "last_error": None,
        "created_at": "2026-01-01T00:00:00+00:00",
        "updated_at": "2026-01-01T00:00:00+00:00",
        "started_at": None,
        "finished_at": None,
        "cancel_requested_at": None,
        "links": links(job_id),
        "idempotency_key": None,
        "payload": {"text": "hi"},
        "run_at": None,
        "result": {"text": "hi"} if status == "succeeded" else None,
        "result_ref": None,
    }


def accepted_body() -> dict[str, Any]:
    return {"job_id": str(JOB_ID), "status": "pending", "links": links()}


def problem(status: int, slug: str, headers: dict[str, str] | None = None, **extra: Any) -> Any:
    body = {"type": PROBLEMS + slug, "title": slug, "status": status, "detail": "no", **extra}
    return httpx.Response(
        status,
        content=orjson.dumps(body),
        headers={"content-type": "application/problem+json", **(headers or {})},
    )


def ok(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, content=orjson.dumps(body), headers=headers)


def core(clock: Clock | None = None, **policy: Any) -> Core:
    return Core(
        BASE,
        "jc_key",
        timeout=10.0,
        retry=RetryPolicy(**policy),
        clock=clock or Clock(),
        rng=lambda: 0.5,
    )


def drive(
    flow: Flow[T], outcomes: list[httpx.Response | httpx.TransportError]
) -> tuple[T, list[Call], list[float]]:
    """Run a flow on answers given in order: its result, the calls it made, its sleeps."""
    calls: list[Call] = []
    sleeps: list[float] = []
    pending = iter(outcomes)
    sent: Any = None
    try:
        while True:
            step = flow.send(sent)
            if isinstance(step, Sleep):
                sleeps.append(step.seconds)
                sent = None
            else:
                calls.append(step)
                sent = next(pending)
    except StopIteration as done:
        return done.value, calls, sleeps


# --- the retry budget -------------------------------------------------------------------


def test_backoff_grows_with_full_jitter_and_stops_at_max_attempts() -> None:
    attempts = Attempts(RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=3.0), rng=lambda: 0.5)
    delays = [attempts.next_delay() for _ in range(5)]
    assert delays == [0.5, 1.0, 1.5, 1.5, None]  # half of 1, 2, 4→3, 8→3; then spent


def test_retry_after_is_honoured_and_spread() -> None:
    low = Attempts(RetryPolicy(), rng=lambda: 0.0)
    high = Attempts(RetryPolicy(), rng=lambda: 0.999)
    assert low.next_delay(retry_after=2.0) == 2.0
    assert 2.0 < (high.next_delay(retry_after=2.0) or 0) < 2.4


def test_the_deadline_bounds_waits() -> None:
    clock = Clock()
    policy = RetryPolicy(deadline=5.0, max_delay=60.0, base_delay=8.0)
    attempts = Attempts(policy, clock=clock, rng=lambda: 0.99)
    # A Retry-After that ends past the deadline: giving up now beats sleeping in vain.
    assert attempts.next_delay(retry_after=6.0) is None
    # A backoff past the deadline is cut to it: one last try at the deadline.
    assert attempts.next_delay() == 5.0
    clock.now += 5.0
    assert attempts.next_delay() is None  # that was the last


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    later = format_datetime(datetime.fromtimestamp(1_000_030, tz=UTC), usegmt=True)
    assert retry_after_seconds(later, now=1_000_000) == pytest.approx(30.0)


# --- the flows ---------------------------------------------------------------------------


def test_a_retried_enqueue_is_the_same_request_every_time() -> None:
    flow = core().enqueue("echo", {"text": "hi"}, entity_id="order-1", delay=5)
    accepted, calls, sleeps = drive(
        flow,
        [
            problem(503, "database-unavailable", {"retry-after": "2"}),
            httpx.ConnectError("refused"),
            httpx.ReadError("reset"),
            ok(accepted_body(), 202, {"idempotent-replayed": "true"}),
        ],
    )
    assert isinstance(accepted, Accepted)
    assert accepted.job_id == JOB_ID
    assert accepted.replayed
    assert len(calls) == 4
    assert all(call == calls[0] for call in calls)  # same key, body and query
    key = calls[0].headers["Idempotency-Key"]
    assert uuid.UUID(key)
    assert accepted.idempotency_key == key
    assert calls[0].url == f"{BASE}/jobs/echo"
    assert calls[0].params == {"entity_id": "order-1", "delay": "5.0"}
    assert orjson.loads(calls[0].content or b"") == {"text": "hi"}
    assert calls[0].headers["Authorization"] == "Bearer jc_key"
    assert sleeps[0] >= 2.0  # Retry-After
    assert sleeps[1:] == [0.2, 0.4]  # after attempts 2 and 3: half of 0.2·2 and 0.2·4


def test_a_retried_batch_resends_the_same_items_with_their_keys() -> None:
    other = uuid.uuid4()
    flow = core().enqueue_batch(
        "echo",
        [{"payload": {"text": "a"}}, {"payload": {"text": "b"}, "idempotency_key": "mine"}],
        callback_url="https://example.com/hook",
    )
    outcomes = [
        {"index": 0, "status": "created", "job_id": str(JOB_ID), "job_status": "pending"},
        {"index": 1, "status": "replayed", "job_id": str(other), "job_status": "running"},
    ]
    counts = {"created": 1, "replayed": 1, "unique_conflict": 0, "refused": 0, "invalid": 0}
    answer, calls, _ = drive(
        flow,
        [
            httpx.ReadError("reset"),
            ok({"items": [{**o, "problem": None} for o in outcomes], "counts": counts}),
        ],
    )
    assert len(calls) == 2
    assert calls[0] == calls[1]  # the same items and keys: a replay if the first got through
    assert calls[0].url == f"{BASE}/jobs/echo/batch"
    assert calls[0].params == {"callback_url": "https://example.com/hook"}
    sent = orjson.loads(calls[0].content or b"")["items"]
    assert sent[1] == {"payload": {"text": "b"}, "idempotency_key": "mine"}
    assert uuid.UUID(sent[0]["idempotency_key"])
    assert [item.idempotency_key for item in answer.items] == [sent[0]["idempotency_key"], "mine"]
    assert [(item.status, item.job_id) for item in answer.items] == [
        ("created", JOB_ID),
        ("replayed", other),
    ]
    assert answer.counts.replayed == 1


def test_each_enqueue_gets_its_own_key_unless_given() -> None:
    c = core()
    keys = {
        drive(c.enqueue("echo", {}), [ok(accepted_body(), 202)])[0].idempotency_key
        for _ in range(3)
    }
    assert len(keys) == 3
    given, calls, _ = drive(c.enqueue("echo", {}, idempotency_key="k-1"), [ok(accepted_body())])
    assert given.idempotency_key == calls[0].headers["Idempotency-Key"] == "k-1"


def test_429_is_retried_after_its_retry_after() -> None:
    _accepted, calls, sleeps = drive(
        core().enqueue("echo", {}),
        [problem(429, "enqueue-rate-limited", {"retry-after": "1"}, limit=5), ok(accepted_body())],
    )
    assert len(calls) == 2
    assert 1.0 <= sleeps[0] <= 1.2


def test_retries_run_out_with_the_last_error() -> None:
    answers = [problem(503, "database-unavailable", {"retry-after": "0"})] * 3
    with pytest.raises(ServiceUnavailable) as caught:
        drive(core(max_attempts=3).enqueue("echo", {}), list(answers))
    assert caught.value.retry_after == 0.0
    assert caught.value.slug == "database-unavailable"
    with pytest.raises(ConnectionFailed) as failed:
        drive(core(max_attempts=2).get(JOB_ID), [httpx.ConnectError("refused")] * 2)
    assert isinstance(failed.value.__cause__, httpx.ConnectError)


def test_a_refusal_is_not_retried_and_carries_the_problem() -> None:
    answer = problem(
        422,
        "invalid-payload",
        errors=[{"loc": ["body", "text"], "msg": "required", "type": "missing"}],
        instance="/jobs/echo",
    )
    with pytest.raises(UnprocessableContent) as caught:
        drive(core().enqueue("echo", {}), [answer])
    error = caught.value
    assert isinstance(error, ClientError)
    assert isinstance(error, ApiError)
    assert (error.type, error.title, error.status, error.detail, error.instance) == (
        PROBLEMS + "invalid-payload",
        "invalid-payload",
        422,
        "no",
        "/jobs/echo",
    )
    assert error.extensions == {
        "errors": [{"loc": ["body", "text"], "msg": "required", "type": "missing"}]
    }
    assert error.problem["errors"] == error.extensions["errors"]


def test_an_answer_that_is_not_problem_json_still_raises_by_status() -> None:
    page = httpx.Response(502, content=b"<html>bad gateway</html>")
    with pytest.raises(ServerError) as caught:
        drive(core().get(JOB_ID), [page])
    assert caught.value.type == "about:blank"
    assert caught.value.status == 502
    assert "bad gateway" in caught.value.detail


def test_wait_long_polls_until_the_job_ends() -> None:
    job, calls, _ = drive(
        core().wait(JOB_ID, timeout=None, poll=30),
        [ok(job_body("pending")), ok(job_body("running")), ok(job_body("succeeded"))],
    )
    assert job.status == "succeeded"
    assert job.is_terminal
    assert job.result == {"text": "hi"}
    assert [c.params for c in calls] == [{"wait": "30.000"}] * 3
    assert all(c.timeout == 40.0 for c in calls)  # the wait plus the client's timeout


def test_wait_gives_up_at_its_timeout() -> None:
    clock = Clock()
    flow = core(clock).wait(JOB_ID, timeout=45, poll=30)
    step = flow.send(None)
    assert isinstance(step, Call)
    assert step.params == {"wait": "30.000"}
    clock.now += 30
    step = flow.send(ok(job_body("running")))
    assert isinstance(step, Call)
    assert step.params == {"wait": "15.000"}
    clock.now += 15
    with pytest.raises(WaitTimeout) as caught:
        flow.send(ok(job_body("running")))
    assert caught.value.job.status == "running"
    assert isinstance(caught.value, TimeoutError)


STORE = "http://127.0.0.1:9571"
PRESIGNED = f"{STORE}/bucket/jc/results/{JOB_ID.hex}.csv?X-Amz-Signature=abc"


def test_a_redirect_to_the_store_is_followed_without_the_api_key() -> None:
    """Same host, another port: another origin (RFC 6454), so the key stays behind."""
    api = Core("http://127.0.0.1:8000", "jc_key", timeout=10.0, retry=RetryPolicy())
    stored = httpx.Response(200, content=b"a,b\n", headers={"content-type": "text/csv"})
    result, calls, _ = drive(
        api.result(JOB_ID), [httpx.Response(302, headers={"location": PRESIGNED}), stored]
    )
    assert (result.content, result.media_type) == (b"a,b\n", "text/csv")
    assert [c.url for c in calls] == [f"http://127.0.0.1:8000/jobs/{JOB_ID}/result", PRESIGNED]
    assert calls[0].headers["Authorization"] == "Bearer jc_key"
    assert "Authorization" not in calls[1].headers


def test_a_same_origin_redirect_keeps_the_key_and_a_store_503_is_retried() -> None:
    moved = httpx.Response(302, headers={"location": "/elsewhere/result"})
    busy = problem(503, "store-unavailable", {"retry-after": "0"})
    result, calls, sleeps = drive(core().result(JOB_ID), [moved, busy, ok({"n": 1})])
    assert result.json() == {"n": 1}
    assert [c.url for c in calls][1:] == [f"{BASE}/elsewhere/result"] * 2
    assert calls[1].headers["Authorization"] == "Bearer jc_key"
    assert len(sleeps) == 1


class FakeStore:
    """The API answering a stored result with a 302 to the store, and the store; each
    request kept with the host it went to."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.host == "jobcore.test":
            return httpx.Response(302, headers={"location": PRESIGNED})
        # What S3 says of an object stored without a content type.
        return httpx.Response(
            200, content=self.body, headers={"content-type": "binary/octet-stream"}
        )

    def store_requests(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.host == "127.0.0.1"]


def test_client_reads_streams_and_saves_a_stored_result(tmp_path: Any) -> None:
    store = FakeStore(b"x" * 300_000)
    http = httpx.Client(transport=httpx.MockTransport(store))
    with Client(BASE, "jc_key", http=http) as client:
        whole = client.result(JOB_ID)
        with client.stream_result(JOB_ID) as stream:
            chunks = list(stream.iter_bytes(100_000))
            assert stream.media_type == "text/csv"  # from the object's name
        written = client.save_result(JOB_ID, tmp_path / "r.csv")
    http.close()
    assert (whole.content, whole.media_type) == (store.body, "text/csv")
    assert [len(c) for c in chunks] == [100_000] * 3
    assert written == len(store.body)
    assert (tmp_path / "r.csv").read_bytes() == store.body
    assert len(store.store_requests()) == 3
    # The presigned URL as signed: its query is its signature.
    assert all(str(r.url) == PRESIGNED for r in store.store_requests())
    assert all("authorization" not in r.headers for r in store.store_requests())


async def test_async_client_reads_streams_and_saves_a_stored_result(tmp_path: Any) -> None:
    store = FakeStore(b"y" * 1000)
    http = httpx.AsyncClient(transport=httpx.MockTransport(store))
    async with AsyncClient(BASE, "jc_key", http=http) as client:
        whole = await client.result(JOB_ID)
        async with client.stream_result(JOB_ID) as stream:
            streamed = b"".join([chunk async for chunk in stream.aiter_bytes()])
        with (tmp_path / "r.bin").open("wb") as handle:
            written = await client.save_result(JOB_ID, handle)
    await http.aclose()
    assert whole.content == streamed == store.body
    assert written == len(store.body)
    assert (tmp_path / "r.bin").read_bytes() == store.body
    assert all("authorization" not in r.headers for r in store.store_requests())


def test_a_payload_stored_by_reference_reads_as_none_and_is_fetched_by_its_link() -> None:
    body = {
        **job_body("pending"),
        "payload": None,
        "payload_ref": f"payloads/{JOB_ID.hex}.json",
        "links": {**links(), "payload": f"/jobs/{JOB_ID}/payload"},
    }
    job, _, _ = drive(core().get(JOB_ID), [ok(body)])
    assert job.payload is None
    assert job.payload_ref == f"payloads/{JOB_ID.hex}.json"
    presigned = f"{STORE}/bucket/jc/payloads/{JOB_ID.hex}.json?X-Amz-Signature=abc"
    payload, calls, _ = drive(
        core().payload(JOB_ID),
        [httpx.Response(302, headers={"location": presigned}), ok({"text": "long"})],
    )
    assert payload == {"text": "long"}
    assert calls[0].url == f"{BASE}/jobs/{JOB_ID}/payload"
    assert "Authorization" not in calls[1].headers


def test_a_page_asks_with_its_filter_and_cursor() -> None:
    page = {
        "items": [job_body("succeeded")],
        "next_cursor": "abc",
        "links": {"next": "/jobs?cursor=abc"},
    }
    result, calls, _ = drive(
        core().page(JobFilter(status="succeeded", type="echo"), limit=1, cursor="xyz"), [ok(page)]
    )
    assert result.next_cursor == "abc"
    assert result.items[0].id == JOB_ID
    assert calls[0].params == {"status": "succeeded", "type": "echo", "limit": "1", "cursor": "xyz"}


# --- the two drivers on a fake transport -----------------------------------------------


class FakeApi:
    """Answers like the API would: a 503 first for each new Idempotency-Key, then 202 with
    the same job for the same key; pages of three jobs."""

    def __init__(self) -> None:
        self.jobs: dict[str, uuid.UUID] = {}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "POST":
            key = request.headers["idempotency-key"]
            if key not in self.jobs:
                self.jobs[key] = uuid.uuid4()
                return problem(503, "database-unavailable", {"retry-after": "0"})
            body = {"job_id": str(self.jobs[key]), "status": "pending", "links": links()}
            return ok(body, 202, {"idempotent-replayed": "true"})
        if request.url.path == "/jobs":
            cursor = request.url.params.get("cursor")
            n = 0 if cursor is None else int(cursor)
            items = [job_body("pending", uuid.UUID(int=n + 1))]
            following = str(n + 1) if n < 2 else None
            return ok({"items": items, "next_cursor": following, "links": {"next": None}})
        return problem(404, "job-not-found")


@pytest.fixture
def fake_api() -> FakeApi:
    return FakeApi()


def test_client_retries_and_follows_pages(fake_api: FakeApi) -> None:
    http = httpx.Client(transport=httpx.MockTransport(fake_api))
    with Client(BASE, "jc_key", http=http, retry=RetryPolicy(base_delay=0.001)) as client:
        accepted = client.enqueue("echo", {"text": "x"})
        assert fake_api.jobs == {accepted.idempotency_key: accepted.job_id}
        assert len(fake_api.requests) == 2
        assert [j.id.int for j in client.jobs(limit=1)] == [1, 2, 3]
        with pytest.raises(NotFound):
            client.get(JOB_ID)
    assert not http.is_closed  # passed in: not ours to close
    http.close()


async def test_async_client_retries_and_follows_pages(fake_api: FakeApi) -> None:
    http = httpx.AsyncClient(transport=httpx.MockTransport(fake_api))
    async with AsyncClient(BASE, "jc_key", http=http) as client:
        accepted = await client.enqueue("echo", {"text": "x"})
        assert fake_api.jobs == {accepted.idempotency_key: accepted.job_id}
        pages = [page async for page in client.pages(limit=1)]
        assert [p.next_cursor for p in pages] == ["1", "2", None]
        assert [j.id.int async for j in client.jobs()] == [1, 2, 3]
    await http.aclose()


def test_an_exhausted_quota_wait_past_the_deadline_raises_at_once() -> None:
    answers = iter([problem(429, "too-many-unfinished-jobs", {"retry-after": "3600"}, limit=10)])
    http = httpx.Client(transport=httpx.MockTransport(lambda request: next(answers)))
    with Client(BASE, http=http) as client, pytest.raises(TooManyRequests) as caught:
        client.enqueue("echo", {})
    assert caught.value.retry_after == 3600
    assert caught.value.extensions == {"limit": 10}
    http.close()


# --- Standard Webhooks -------------------------------------------------------------------

KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
BODY = b'{"id":"d-1","event":"job.succeeded","job":{"id":"j-1","status":"succeeded"}}'


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The spec's recipe, by hand: base64 HMAC-SHA256 of "{id}.{timestamp}.{body}"."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def headers_for(body: bytes = BODY, *, key: bytes = KEY, age: int = 0) -> dict[str, str]:
    timestamp = int(time.time()) - age
    return {
        "Webhook-Id": "d-1",
        "Webhook-Timestamp": str(timestamp),
        "Webhook-Signature": sign(key, "d-1", timestamp, body),
    }


def test_a_webhook_signed_per_the_spec_verifies() -> None:
    assert verify_webhook(SECRET, headers_for(), BODY)["event"] == "job.succeeded"
    # Lower-case header names, a str body, and several signatures (a rotated secret's).
    lower = {k.lower(): v for k, v in headers_for().items()}
    other = sign(b"x" * 32, "d-1", int(lower["webhook-timestamp"]), BODY)
    lower["webhook-signature"] = f"{other} {lower['webhook-signature']}"
    assert verify_webhook(SECRET, lower, BODY.decode())["job"]["status"] == "succeeded"
    assert verify_webhook(KEY, headers_for(), BODY)["id"] == "d-1"


def bad_webhooks() -> Iterator[tuple[str, dict[str, str], bytes]]:
    yield "tampered body", headers_for(), BODY.replace(b"succeeded", b"failed")
    yield "another secret", headers_for(key=b"y" * 32), BODY
    yield "too old", headers_for(age=600), BODY
    yield "from the future", headers_for(age=-600), BODY
    no_id = headers_for()
    del no_id["Webhook-Id"]
    yield "missing id", no_id, BODY
    # The signing scheme before Standard Webhooks: hex, "v1=..." over "{ts}.{body}".
    old = headers_for()
    old["Webhook-Signature"] = "v1=" + hmac.new(KEY, BODY, hashlib.sha256).hexdigest()
    yield "old scheme", old, BODY
    garbled = headers_for()
    garbled["Webhook-Signature"] = "v1,not base64!"
    yield "garbled signature", garbled, BODY
    yield "not utf-8", headers_for(b"\xff"), b"\xff"


# By name, built when the test runs: a timestamp made at collection is minutes old by the
# time a long suite reaches the test ("from the future" would no longer be).
@pytest.mark.parametrize("why", [why for why, _, _ in bad_webhooks()])
def test_a_webhook_that_does_not_verify_is_refused(why: str) -> None:
    headers, body = next((h, b) for name, h, b in bad_webhooks() if name == why)
    with pytest.raises(WebhookVerificationFailed):
        verify_webhook(SECRET, headers, body)


def test_a_secret_that_is_not_base64_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="whsec_"):
        verify_webhook("whsec_%%%", headers_for(), BODY)


def test_a_payload_model_is_sent_as_its_json() -> None:
    class Export(BaseModel):
        rows: int
        since: datetime

    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    _, calls, _ = drive(
        core().enqueue("export_csv", Export(rows=5, since=when), run_at=when, max_attempts=2),
        [ok(accepted_body(), 202)],
    )
    assert orjson.loads(calls[0].content or b"") == {"rows": 5, "since": "2026-01-02T03:04:05Z"}
    assert calls[0].params == {"max_attempts": "2", "run_at": "2026-01-02T03:04:05+00:00"}
    assert calls[0].headers["Content-Type"] == "application/json"


# --- workflows ----------------------------------------------------------------------------

WORKFLOW_CREATED = {
    "id": "7a1c3a9e-2b4f-4d7e-9c1a-3f5e6d7c8b9a",
    "status": "running",
    "created_at": "2026-12-06T12:00:00+00:00",
    "jobs": {"a": "0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a"},
}


def test_creating_a_workflow_is_retried_with_one_idempotency_key() -> None:
    """POST /workflows carries an Idempotency-Key (a new UUID unless given), the same on
    every retry: after a lost answer too (the API answers a retry of a request that got
    through with its workflow), so it is retried like an enqueue."""
    jobs = [{"name": "a", "type": "echo", "payload": {"text": "x"}}]
    created, calls, _ = drive(
        core().create_workflow(jobs),
        [
            httpx.ConnectError("refused"),
            httpx.ReadTimeout("no answer"),
            problem(503, "database-unavailable", {"retry-after": "0"}),
            ok(WORKFLOW_CREATED, status=201, headers={"idempotent-replayed": "true"}),
        ],
    )
    assert str(created.id) == WORKFLOW_CREATED["id"]
    assert len(calls) == 4
    keys = {call.headers["Idempotency-Key"] for call in calls}
    assert len(keys) == 1
    assert created.idempotency_key == keys.pop()
    assert uuid.UUID(created.idempotency_key)
    assert created.replayed
    assert {call.content for call in calls} == {orjson.dumps({"jobs": jobs})}
    given, calls, _ = drive(
        core().create_workflow(jobs, idempotency_key="wf-1"), [ok(WORKFLOW_CREATED, status=201)]
    )
    assert given.idempotency_key == calls[0].headers["Idempotency-Key"] == "wf-1"
    assert not given.replayed
