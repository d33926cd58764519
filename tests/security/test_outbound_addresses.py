"""POST /jobs/{type}?callback_url=: a URL whose host is not public is refused with problem
JSON that names neither the address it resolved to nor anything the resolver said, and
no job is written."""

from __future__ import annotations

import ipaddress
import socket

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobcore.database.gateway import Database
from jobcore.execution.completion_webhooks import (
    IPAddress,
    NonPublicCallbackAddress,
    is_public,
    unwrap,
)
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.usecases import webhooks as webhook_usecases
from tests.integration.api.support import assert_problem, counts, enqueue
from tests.support.resolver import resolving_to

EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
hostnames = st.from_regex(r"\A[a-z][a-z0-9-]{0,15}(\.[a-z][a-z0-9-]{0,10}){1,3}\Z")
non_public = st.ip_addresses().filter(lambda a: not is_public(a))


def spellings(address: IPAddress) -> set[str]:
    texts = {str(address), address.exploded}
    for reached in unwrap(address):
        texts |= {str(reached), reached.exploded}
    return texts


@EXAMPLES
@given(host=hostnames, internal=non_public)
async def test_a_name_resolving_to_an_internal_address_is_a_422_that_does_not_say_where(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    db: Database,
    host: str,
    internal: IPAddress,
) -> None:
    url = f"https://{host}/hooks/jobs"
    with resolving_to([internal]) as asked:
        response = await enqueue(api_client, auth, params={"callback_url": url})
    assert asked == [host]
    body = assert_problem(response, 422, "invalid-request")
    assert body["errors"][0]["loc"] == ["query", "callback_url"]
    assert "refused" in body["detail"]
    text = response.text
    assert host not in text
    assert not any(spelling in text for spelling in spellings(internal))
    assert (await counts(db))["jobs"] == 0


@EXAMPLES
@given(internal=non_public)
async def test_an_internal_address_literal_is_a_422(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database, internal: IPAddress
) -> None:
    host = f"[{internal}]" if internal.version == 6 else str(internal)
    response = await enqueue(api_client, auth, params={"callback_url": f"http://{host}:8080/x"})
    assert_problem(response, 422, "invalid-request")
    assert (await counts(db))["jobs"] == 0


async def test_an_unresolvable_name_is_a_422_without_the_resolvers_words(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    failure = socket.gaierror(socket.EAI_NONAME, "Name or service not known (resolver-detail)")
    with resolving_to(failure):
        response = await enqueue(
            api_client, auth, params={"callback_url": "https://nowhere.example/x"}
        )
    body = assert_problem(response, 422, "invalid-request")
    assert "resolver-detail" not in response.text
    assert "Name or service" not in response.text
    assert body["detail"] == "The callback URL was refused: its host does not resolve."


async def test_a_public_address_is_accepted(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    # The same path with a public answer: the refusals above are about the address.
    with resolving_to([ipaddress.ip_address("93.184.216.34")]):
        response = await enqueue(
            api_client, auth, params={"callback_url": "https://hooks.example/x"}
        )
    assert response.status_code == 202, response.text
    assert (await counts(db))["jobs"] == 1


@EXAMPLES
@given(internal=non_public)
async def test_a_tenant_endpoint_resolving_to_an_internal_address_is_not_set(
    db: Database, settings: Settings, internal: IPAddress
) -> None:
    with resolving_to([internal]), pytest.raises(NonPublicCallbackAddress) as refused:
        await webhook_usecases.set_endpoint(
            db,
            settings,
            default_registry,
            "acme",
            "*",
            "https://endpoint.example/hooks",
            actor="tests",
        )
    assert not any(spelling in str(refused.value) for spelling in spellings(internal))
    assert await webhook_usecases.list_endpoints(db, "acme") == []
