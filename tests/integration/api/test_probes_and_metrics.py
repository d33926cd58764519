"""/healthz, /readyz, /metrics and /openapi.json."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.api.schemas import Alive, Ready
from tests.integration.api.support import enqueue


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_probes(api_client: httpx.AsyncClient) -> None:
    alive = await api_client.get("/healthz")
    assert Alive.model_validate(alive.json()).status == "alive"
    ready = await api_client.get("/readyz")
    assert ready.status_code == 200
    assert Ready.model_validate(ready.json()).checks == {"database": "ok"}


async def test_metrics_count_enqueue_outcomes(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    headers = {"Idempotency-Key": "m"}
    await enqueue(api_client, auth, payload={"text": "a"}, headers=headers)
    await enqueue(api_client, auth, payload={"text": "a"}, headers=headers)
    await enqueue(api_client, auth, payload={"text": "b"})
    await enqueue(api_client, auth, "noop", payload={})
    await enqueue(api_client, auth, payload={"text": 1})
    await enqueue(api_client, auth, "missing", payload={})
    await enqueue(api_client, {}, payload={"text": "a"})

    response = await api_client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    values = samples(response.text)
    assert values[("jobcore_api_jobs_enqueued_total", (("type", "echo"),))] == 2
    assert values[("jobcore_api_jobs_enqueued_total", (("type", "noop"),))] == 1
    requests = "jobcore_api_enqueue_requests_total"

    def answers(result: str, job_type: str) -> float:
        return values[(requests, (("result", result), ("type", job_type)))]

    assert answers("accepted", "echo") == 2
    assert answers("accepted", "noop") == 1
    assert answers("replayed", "echo") == 1
    assert answers("rejected", "echo") == 2
    assert answers("rejected", "_unknown") == 1
    assert values[("jobcore_api_internal_errors_total", ())] == 0


async def test_openapi_describes_every_route(api_client: httpx.AsyncClient) -> None:
    spec = (await api_client.get("/openapi.json")).json()
    assert spec["openapi"].startswith("3.")
    paths = spec["paths"]
    assert set(paths) >= {
        "/jobs",
        "/jobs/{job_id}",
        "/jobs/{job_id}/result",
        "/jobs/{job_id}/cancel",
        "/healthz",
        "/readyz",
        "/metrics",
    }
    listing = paths["/jobs"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {
        "entity_id",
        "status",
        "type",
        "limit",
        "cursor",
    }
    assert listing["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/JobPage"
    )
    assert "application/problem+json" in listing["responses"]["401"]["content"]
    enqueue_op = paths["/jobs/echo"]["post"]
    assert {p["name"] for p in enqueue_op["parameters"]} >= {
        "Idempotency-Key",
        "entity_id",
        "max_attempts",
        "run_at",
        "delay",
    }
    cancel = paths["/jobs/{job_id}/cancel"]["post"]["responses"]
    assert {"200", "202", "404", "409"} <= set(cancel)
