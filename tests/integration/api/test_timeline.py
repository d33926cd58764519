"""GET /jobs/{id}/timeline and the `where` of GET /jobs/{id}: the caller's own jobs only,
after authentication with the read scope, with problem JSON for errors."""

from __future__ import annotations

import uuid

import httpx

from jobcore.database.gateway import Database
from jobcore.kernel.scopes import Scope
from jobcore.usecases import keys as key_usecases
from services.api.schemas import JobTimelineView, JobView
from tests.integration.api.conftest import TENANT
from tests.integration.api.support import assert_problem, enqueue, finish_job, start_job


async def test_the_timeline_lists_the_jobs_events_and_where_it_is(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    created = await enqueue(api_client, auth, params={"delay": 3600})
    job_id = created.json()["job_id"]
    assert created.json()["links"]["timeline"] == f"/jobs/{job_id}/timeline"

    response = await api_client.get(f"/jobs/{job_id}/timeline", headers=auth)
    assert response.status_code == 200, response.text
    timeline = JobTimelineView.model_validate(response.json())
    assert (timeline.job_id, timeline.type, timeline.status) == (
        uuid.UUID(job_id),
        "echo",
        "pending",
    )
    assert [e.kind for e in timeline.events] == ["accepted"]
    assert "run_at" in timeline.events[0].detail
    assert timeline.where.startswith("due at ")
    assert "tenant" not in response.json()

    view = JobView.model_validate((await api_client.get(f"/jobs/{job_id}", headers=auth)).json())
    assert view.where == timeline.where

    # The API's cancel of a pending job records its end.
    assert (await api_client.post(f"/jobs/{job_id}/cancel", headers=auth)).status_code == 200
    timeline = JobTimelineView.model_validate(
        (await api_client.get(f"/jobs/{job_id}/timeline", headers=auth)).json()
    )
    assert [e.kind for e in timeline.events] == ["accepted", "cancelled"]
    assert timeline.where.startswith("cancelled at ")


async def test_get_job_says_where_a_running_and_a_failed_job_are(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id = (await enqueue(api_client, auth)).json()["job_id"]
    view = JobView.model_validate((await api_client.get(f"/jobs/{job_id}", headers=auth)).json())
    assert view.where.endswith(": relay lag")

    await start_job(db, job_id)
    view = JobView.model_validate((await api_client.get(f"/jobs/{job_id}", headers=auth)).json())
    assert view.where.startswith("running on worker ")

    await finish_job(db, job_id, "failed", last_error="ValueError: boom")
    view = JobView.model_validate((await api_client.get(f"/jobs/{job_id}", headers=auth)).json())
    assert view.where.endswith("after attempt 1 of 3: ValueError: boom")


async def test_another_tenants_job_and_an_unknown_one_are_404(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    other_auth: dict[str, str],
) -> None:
    job_id = (await enqueue(api_client, auth)).json()["job_id"]
    response = await api_client.get(f"/jobs/{job_id}/timeline", headers=other_auth)
    body = assert_problem(response, 404, "job-not-found")
    assert job_id not in body["detail"]
    unknown = await api_client.get(f"/jobs/{uuid.uuid4()}/timeline", headers=auth)
    assert_problem(unknown, 404, "job-not-found")
    malformed = await api_client.get("/jobs/nope/timeline", headers=auth)
    assert_problem(malformed, 422, "invalid-request")


async def test_the_timeline_needs_a_key_with_the_read_scope(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id = (await enqueue(api_client, auth)).json()["job_id"]
    path = f"/jobs/{job_id}/timeline"
    assert_problem(await api_client.get(path), 401, "missing-api-key")
    enqueuer = await key_usecases.create_key(
        db, TENANT, "enqueue only", scopes=[Scope.ENQUEUE], actor="tests"
    )
    refused = await api_client.get(path, headers={"Authorization": f"Bearer {enqueuer.key}"})
    assert assert_problem(refused, 403, "insufficient-scope")["required_scope"] == "read"


async def test_the_route_is_documented(api_client: httpx.AsyncClient) -> None:
    document = (await api_client.get("/openapi.json")).json()
    route = document["paths"]["/jobs/{job_id}/timeline"]["get"]
    assert set(route["responses"]) >= {"200", "401", "403", "404", "422"}
    assert "JobTimelineView" in document["components"]["schemas"]
    assert "where" in document["components"]["schemas"]["JobView"]["required"]
