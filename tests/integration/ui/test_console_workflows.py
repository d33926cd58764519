"""The console's workflow pages: the graph (server-rendered SVG, each job in its state),
the jobs table, and the cancel and retry actions."""

from __future__ import annotations

import re
from typing import Any

import httpx

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute
from jobcore.execution.payloads import validate_payload
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.usecases.workflows import WorkflowCreated, create_workflow, steps_from_documents
from tests.integration.ui.test_console_pages import (
    AUDIT,
    FAIL_JOB,
    HTML,
    ORIGIN,
    client,
    csrf_of,
    run,
)

__all__ = ["client"]  # the fixture, used by name


async def add_workflow(db: Database, settings: Settings) -> WorkflowCreated:
    def resolve(name: str, payload: Any, _: int) -> tuple[Any, Any]:
        kind = default_registry.get(name)
        return kind, validate_payload(kind, payload)

    def echo(name: str, *deps: Any, **extra: Any) -> dict[str, Any]:
        return {
            "name": name,
            "type": "echo",
            "payload": {"text": name},
            "depends_on": list(deps),
            **extra,
        }

    documents = [
        echo("extract"),
        echo("load", "extract"),
        echo("rollback", {"name": "load", "policy": "on_failure"}),
        echo("report", {"name": "load", "policy": "on_complete"}),
        echo("<tidy>", **{"finally": True}),
    ]
    async with db.unit_of_work() as uow:
        created = await create_workflow(
            uow,
            Topology.from_settings(settings),
            tenant="acme",
            steps=steps_from_documents(documents, resolve, "acme"),
            name="nightly",
        )
        await uow.commit()
    return created


def node_states(page: str) -> dict[str, str]:
    return dict(
        (name, state)
        for state, name in re.findall(r'<g class="node (\w+)" data-name="([^"]+)"', page)
    )


async def test_the_graph_shows_each_job_in_its_state_and_the_actions_work(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    created = await add_workflow(db, settings)
    listed = await client.get("/workflows", headers=HTML)
    assert listed.status_code == 200
    assert f'href="/workflows/{created.id}"' in listed.text
    page = await client.get(f"/workflows/{created.id}", headers=HTML)
    assert page.status_code == 200, page.text
    assert "<svg" in page.text
    assert node_states(page.text) == {
        "extract": "pending",
        "load": "waiting",
        "rollback": "waiting",
        "report": "waiting",
        "&lt;tidy&gt;": "waiting",  # escaped, never markup
    }
    assert page.text.count('<line class="edge') == 3
    assert 'class="edge on_failure"' in page.text
    # The first job fails: the success path's dependents react in the same transaction.
    async with db.unit_of_work() as uow:
        await execute(uow, FAIL_JOB({"id": created.jobs["extract"]}))
        await uow.commit()
    page = await client.get(f"/workflows/{created.id}", headers=HTML)
    states = node_states(page.text)
    assert (states["extract"], states["load"], states["rollback"]) == (
        "failed",
        "cancelled",
        "cancelled",
    )
    assert states["report"] == "pending"  # on_complete of a cancelled job: it runs
    assert "unreachable: its dependency" in page.text
    retried = await client.post(
        f"/workflows/{created.id}/jobs/extract/retry",
        data={"csrf": csrf_of(page.text)},
        headers=ORIGIN,
    )
    assert retried.status_code == 303
    page = await client.get(f"/workflows/{created.id}", headers=HTML)
    states = node_states(page.text)
    assert (states["extract"], states["load"]) == ("pending", "waiting")
    cancelled = await client.post(
        f"/workflows/{created.id}/cancel", data={"csrf": csrf_of(page.text)}, headers=ORIGIN
    )
    assert cancelled.status_code == 303
    page = await client.get(f"/workflows/{created.id}", headers=HTML)
    assert set(node_states(page.text).values()) == {"cancelled"}
    assert 'id="workflow-status">cancelled' in page.text
    # Both actions are audited as the session's key, as the console's job actions are.
    actions = await run(db, AUDIT({"actor": client.headers["X-Actor"]}))
    assert [(a["action"], a["outcome"], a["target_id"]) for a in actions][-2:] == [
        ("workflow.retry", "succeeded", str(created.id)),
        ("workflow.cancel", "succeeded", str(created.id)),
    ]
