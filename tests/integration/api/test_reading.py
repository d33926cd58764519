"""GET /jobs/{id}, GET /jobs/{id}/result and GET /jobs: always what the database says."""

from __future__ import annotations

import uuid

import httpx

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.storage.results import LocalResultStore
from services.api.schemas import JobPage, JobView
from tests.integration.api.support import assert_problem, enqueue, finish_job, start_job


async def test_job_view_follows_the_database(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    created = await enqueue(
        api_client,
        auth,
        payload={"text": "a"},
        headers={"Idempotency-Key": "view"},
        params={"entity_id": "e-1"},
    )
    job_id = created.json()["job_id"]
    view = JobView.model_validate((await api_client.get(f"/jobs/{job_id}", headers=auth)).json())
    assert (view.status, view.attempts, view.max_attempts) == ("pending", 0, 3)
    assert (view.entity_id, view.idempotency_key) == ("e-1", "view")
    assert view.payload == {"text": "a", "count": 1}
    assert view.started_at is None
    assert view.finished_at is None
    assert view.result is None

    await start_job(db, job_id)
    view = JobView.model_validate((await api_client.get(f"/jobs/{job_id}", headers=auth)).json())
    assert (view.status, view.attempts) == ("running", 1)
    assert view.started_at is not None

    await finish_job(db, job_id, "failed", last_error="ValueError: boom")
    view = JobView.model_validate((await api_client.get(f"/jobs/{job_id}", headers=auth)).json())
    assert (view.status, view.last_error) == ("failed", "ValueError: boom")
    assert view.finished_at is not None
    assert view.finished_at >= view.started_at


async def test_unknown_job_is_404_and_a_malformed_id_is_422(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    for path in (f"/jobs/{uuid.uuid4()}", f"/jobs/{uuid.uuid4()}/result"):
        assert_problem(await api_client.get(path, headers=auth), 404, "job-not-found")
    response = await api_client.post(f"/jobs/{uuid.uuid4()}/cancel", headers=auth)
    assert_problem(response, 404, "job-not-found")
    body = assert_problem(
        await api_client.get("/jobs/not-a-uuid", headers=auth), 422, "invalid-request"
    )
    assert body["errors"][0]["loc"] == ["path", "job_id"]


async def test_result_inline_json(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id = (await enqueue(api_client, auth)).json()["job_id"]
    body = assert_problem(
        await api_client.get(f"/jobs/{job_id}/result", headers=auth), 409, "result-not-ready"
    )
    assert body["job_status"] == "pending"
    await start_job(db, job_id)
    await finish_job(db, job_id, "succeeded", result={"text": "hellohello", "n": [1, 2]})
    response = await api_client.get(f"/jobs/{job_id}/result", headers=auth)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"text": "hellohello", "n": [1, 2]}


async def test_result_from_the_store_with_its_content_type(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database, settings: Settings
) -> None:
    job_id = (await enqueue(api_client, auth)).json()["job_id"]
    await start_job(db, job_id)
    csv = b"id,name\n1,alice\n2,bob\n"
    key = LocalResultStore(settings.result_dir).put(uuid.UUID(job_id), csv, suffix="csv")
    await finish_job(db, job_id, "succeeded", result_ref=key)
    response = await api_client.get(f"/jobs/{job_id}/result", headers=auth)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert response.content == csv
    view = (await api_client.get(f"/jobs/{job_id}", headers=auth)).json()
    assert view["result_ref"] == key
    assert view["result"] is None


async def test_result_missing_from_the_store_is_404(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id = (await enqueue(api_client, auth)).json()["job_id"]
    await start_job(db, job_id)
    await finish_job(db, job_id, "succeeded", result_ref=f"{uuid.uuid4().hex}.csv")
    response = await api_client.get(f"/jobs/{job_id}/result", headers=auth)
    assert_problem(response, 404, "result-not-found")


async def _page(client: httpx.AsyncClient, auth: dict[str, str], **params: object) -> JobPage:
    response = await client.get("/jobs", headers=auth, params=params)  # type: ignore[arg-type]
    assert response.status_code == 200, response.text
    return JobPage.model_validate(response.json())


async def test_listing_is_newest_first_with_filters(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    ids = []
    for i in range(6):
        entity = "even" if i % 2 == 0 else "odd"
        response = await enqueue(api_client, auth, params={"entity_id": entity})
        ids.append(response.json()["job_id"])
    noop = (await enqueue(api_client, auth, "noop", payload={})).json()["job_id"]
    await start_job(db, ids[0])

    everything = await _page(api_client, auth)
    assert [str(j.id) for j in everything.items] == [noop, *reversed(ids)]
    assert everything.next_cursor is None
    assert everything.links.next is None

    even = await _page(api_client, auth, entity_id="even")
    assert [str(j.id) for j in even.items] == [ids[4], ids[2], ids[0]]
    running = await _page(api_client, auth, status="running")
    assert [str(j.id) for j in running.items] == [ids[0]]
    odd_pending = await _page(api_client, auth, entity_id="odd", status="pending", type="echo")
    assert [str(j.id) for j in odd_pending.items] == [ids[5], ids[3], ids[1]]
    noops = await _page(api_client, auth, type="noop")
    assert [str(j.id) for j in noops.items] == [noop]
    assert (await _page(api_client, auth, type="nothing_like_it")).items == []


async def test_pages_are_stable_while_jobs_are_inserted(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    original = [(await enqueue(api_client, auth)).json()["job_id"] for _ in range(25)]
    seen: list[str] = []
    pages = 0
    params: dict[str, object] = {"limit": 10}
    while True:
        page = await _page(api_client, auth, **params)
        pages += 1
        seen.extend(str(j.id) for j in page.items)
        # New jobs arrive between pages; with OFFSET they would shift what comes next.
        for _ in range(3):
            await enqueue(api_client, auth)
        if page.next_cursor is None:
            break
        assert page.links.next is not None
        assert f"cursor={page.next_cursor}" in page.links.next
        params = {"limit": 10, "cursor": page.next_cursor}
    assert pages == 3
    assert seen == list(reversed(original))


async def test_listing_parameters_are_checked(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    for cursor in ("garbage", "x" * 201, "W10", "WzEsIjIwMjAiLCJ4Il0", "eyJhIjoxfQ", "é"):
        response = await api_client.get("/jobs", headers=auth, params={"cursor": cursor})
        assert response.status_code in (400, 422), response.text
        if response.status_code == 400:
            assert_problem(response, 400, "invalid-cursor")
    for params in ({"limit": 0}, {"limit": 201}, {"status": "sleeping"}, {"type": "x\x00"}):
        response = await api_client.get("/jobs", headers=auth, params=params)
        assert_problem(response, 422, "invalid-request")
