"""The console's pages and actions over plain HTTP (in-process, on the test's database):
job search by each field, the job page (payload only when asked for), retry, discard and
redeliver through the same use cases as the commands, each audited as the session's key;
webhook URLs shown by their origin only."""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute, fetch_all, fetch_one
from jobcore.database.sql import Query
from jobcore.execution.registry import default_registry
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.storage.objectstore import open_result_store
from jobcore.storage.results import ResultStore
from jobcore.usecases import keys as key_usecases
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from services.ui import app as console_app
from services.ui.app import create_app

BASE = "http://console.test"
ORIGIN = {"Origin": BASE}
HTML = {"Accept": "text/html"}

FAIL_JOB = Query(
    "test_fail_job",
    "End a job as failed, as a worker would after its last attempt.",
    "UPDATE jobs SET status = 'failed', finished_at = now(), last_error = 'boom' "
    "WHERE id = %(id)s RETURNING id",
)
QUARANTINE = Query(
    "test_quarantine",
    "Quarantine a job's outbox rows as the relay would on an unpublishable message.",
    "UPDATE outbox SET quarantined_at = now(), attempts = 1, last_error = 'too_large' "
    "WHERE job_id = %(id)s RETURNING id",
)
FAILED_DELIVERY = Query(
    "test_failed_delivery",
    "A completion webhook that used up its attempts.",
    "INSERT INTO webhook_deliveries (id, job_id, tenant, url, event, status, attempts, "
    "max_attempts, last_error) VALUES (%(id)s, %(job_id)s, 'acme', %(url)s, 'job.failed', "
    "'failed', 3, 3, 'HTTP 500') RETURNING id",
)
SET_CALLBACK = Query(
    "test_set_callback",
    "Give a job a callback URL.",
    "UPDATE jobs SET callback_url = %(url)s WHERE id = %(id)s",
)
SET_LEASE = Query(
    "test_set_lease",
    "Give a job a status and a lease token.",
    "UPDATE jobs SET status = %(status)s, lease_token = gen_random_uuid() WHERE id = %(id)s",
)
OUTBOX_ROW = Query("test_outbox_row", "An outbox row.", "SELECT * FROM outbox WHERE id = %(id)s")
AUDIT = Query(
    "test_audit",
    "Audit entries of one actor, oldest first.",
    "SELECT action, outcome, target_id FROM audit_log WHERE actor = %(actor)s ORDER BY at, id",
)
SECRET_URL = "https://hooks.example.com/T0KEN-in-the-path?sig=s3cret"


@pytest.fixture
async def client(settings: Settings, db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app: FastAPI = create_app(settings)
    key = await key_usecases.create_key(db, "ops", "ops", scopes=[Scope.ADMIN], actor="tests")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            signed_in = await http.post("/login", data={"key": key.key}, headers=ORIGIN)
            assert signed_in.status_code == 303
            http.headers["X-Actor"] = f"ui:key:{key.record.id}"  # for the test's own use
            yield http


async def add_job(
    db: Database, settings: Settings, tenant: str, entity: str, text: str = "hi"
) -> str:
    job_type = default_registry.get("echo")
    async with db.unit_of_work() as uow:
        result = await enqueue(
            uow,
            Topology.from_settings(settings),
            EnqueueRequest(
                tenant=tenant,
                job_type=job_type,
                payload=job_type.validate_payload({"text": text}),
                entity_id=entity,
            ),
        )
        await uow.commit()
    return str(result.job_id)


async def run(db: Database, statement: object) -> list[dict[str, object]]:
    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, statement)  # type: ignore[arg-type]
        await uow.commit()
    return [dict(r) for r in rows]


def job_ids_listed(page: str) -> set[str]:
    return set(re.findall(r'href="/jobs/([0-9a-f-]{36})"', page))


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found
    return found.group(1)


async def test_search_by_tenant_type_status_entity_and_job_id(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    a = await add_job(db, settings, "acme", "invoice-1")
    b = await add_job(db, settings, "acme", "invoice-2")
    c = await add_job(db, settings, "globex", "invoice-1")
    async with db.unit_of_work() as uow:
        await execute(uow, FAIL_JOB({"id": b}))
        await uow.commit()

    async def listed(**params: str) -> set[str]:
        answer = await client.get("/jobs", params=params, headers=HTML)
        assert answer.status_code == 200
        return job_ids_listed(answer.text)

    assert await listed() == {a, b, c}
    assert await listed(tenant="acme") == {a, b}
    assert await listed(status="failed") == {b}
    assert await listed(entity_id="invoice-1") == {a, c}
    assert await listed(tenant="globex", entity_id="invoice-1") == {c}
    assert await listed(type="echo", status="pending") == {a, c}
    assert await listed(type="noop") == set()
    # The search box: a job id opens the job, anything else is an entity id.
    assert await listed(q="invoice-2") == {b}
    found = await client.get("/jobs", params={"q": c}, headers=HTML)
    assert found.status_code == 303
    assert found.headers["location"] == f"/jobs/{c}"


async def test_the_job_page_shows_the_payload_only_when_asked(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    job_id = await add_job(db, settings, "acme", "e-1", text="private-words")
    page = await client.get(f"/jobs/{job_id}", headers=HTML)
    assert page.status_code == 200
    assert 'id="timeline"' in page.text
    assert "private-words" not in page.text
    assert "Cancel job" in page.text
    # The raw columns sit behind "details", the empty ones left out (a pending job has no
    # lease, worker or result).
    details = page.text[page.text.index('<details id="details">') :]
    assert ">tenant<" in details
    assert "lease_token" not in details
    assert "worker_id" not in details
    assert "–" not in details
    shown = await client.get(f"/jobs/{job_id}", params={"show": "payload"}, headers=HTML)
    assert "private-words" in shown.text
    async with db.unit_of_work() as uow:
        await execute(uow, SET_CALLBACK({"id": job_id, "url": SECRET_URL}))
        await uow.commit()
    page = await client.get(f"/jobs/{job_id}", headers=HTML)
    assert "https://hooks.example.com/…" in page.text
    assert "T0KEN" not in page.text
    # A lease token is shown as held only while the job runs: a retry leaves its token on
    # the pending row, held by no one.
    for status, held in (("pending", False), ("running", True)):
        async with db.unit_of_work() as uow:
            await execute(uow, SET_LEASE({"id": job_id, "status": status}))
            await uow.commit()
        page = await client.get(f"/jobs/{job_id}", headers=HTML)
        details = page.text[page.text.index('<details id="details">') :]
        assert ("lease_token" in details) is held, status
    missing = await client.get(f"/jobs/{uuid.uuid4()}", headers=HTML)
    assert missing.status_code == 404


async def test_a_payload_stored_by_reference_is_shown_from_the_store(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    job_type = default_registry.get("echo")
    async with db.unit_of_work() as uow:
        result = await enqueue(
            uow,
            Topology.from_settings(settings),
            EnqueueRequest(
                tenant="acme",
                job_type=job_type,
                payload=job_type.validate_payload({"text": "words-kept-in-the-store"}),
            ),
            payload_store=open_result_store(settings),
            inline_payload_max_bytes=10,
        )
        await uow.commit()
    shown = await client.get(f"/jobs/{result.job_id}", params={"show": "payload"}, headers=HTML)
    assert shown.status_code == 200
    payload = shown.text[shown.text.index('<pre id="payload">') :]
    assert "words-kept-in-the-store" in payload[: payload.index("</pre>")]
    assert f"payloads/{result.job_id.hex}.json" in shown.text

    # Gone from the store: said so, not shown as an empty payload.
    open_result_store(settings).delete(f"payloads/{result.job_id.hex}.json")
    shown = await client.get(f"/jobs/{result.job_id}", params={"show": "payload"}, headers=HTML)
    assert shown.status_code == 200
    assert '<pre id="payload">{}</pre>' not in shown.text
    assert "could not be read" in shown.text


async def test_the_result_store_is_opened_once_not_per_page_view(
    client: httpx.AsyncClient, db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[ResultStore] = []

    def counting_open(given: Settings) -> ResultStore:
        opened.append(open_result_store(given))
        return opened[-1]

    monkeypatch.setattr(console_app, "open_result_store", counting_open)
    job_type = default_registry.get("echo")
    async with db.session() as session:
        result = await enqueue(
            session,
            Topology.from_settings(settings),
            EnqueueRequest(
                tenant="acme",
                job_type=job_type,
                payload=job_type.validate_payload({"text": "kept-in-the-store"}),
            ),
            payload_store=open_result_store(settings),
            inline_payload_max_bytes=10,
        )
    for _ in range(3):
        shown = await client.get(f"/jobs/{result.job_id}", params={"show": "payload"}, headers=HTML)
        assert shown.status_code == 200
        assert "kept-in-the-store" in shown.text
    assert len(opened) <= 1


async def test_retry_discard_and_redeliver_are_the_commands_use_cases_audited(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    actor = client.headers["X-Actor"]
    failed = await add_job(db, settings, "acme", "e-1")
    await run(db, FAIL_JOB({"id": failed}))
    doomed = await add_job(db, settings, "acme", "e-2")
    [row] = await run(db, QUARANTINE({"id": doomed}))
    delivery = uuid.uuid4()
    await run(db, FAILED_DELIVERY({"id": delivery, "job_id": failed, "url": SECRET_URL}))
    token = csrf_of((await client.get("/", headers=HTML)).text)

    retried = await client.post(f"/jobs/{failed}/retry", data={"csrf": token}, headers=ORIGIN)
    assert retried.status_code == 303
    page = await client.get(retried.headers["location"], headers=HTML)
    new_id = re.search(r"Retried as job ([0-9a-f-]{36})", page.text)
    assert new_id, page.text
    assert job_ids_listed((await client.get("/jobs", headers=HTML)).text) >= {new_id.group(1)}

    discarded = await client.post(
        f"/outbox/{row['id']}/discard", data={"csrf": token}, headers=ORIGIN
    )
    assert discarded.status_code == 303
    assert f"Outbox row {row['id']} discarded" in (await client.get("/outbox", headers=HTML)).text
    async with db.session() as session:
        assert await fetch_one(session, OUTBOX_ROW({"id": row["id"]})) is None

    webhooks = await client.get("/webhooks", headers=HTML)
    assert "https://hooks.example.com" in webhooks.text
    assert "T0KEN" not in webhooks.text
    assert "s3cret" not in webhooks.text
    redelivered = await client.post(
        f"/webhooks/{delivery}/redeliver", data={"csrf": token}, headers=ORIGIN
    )
    assert redelivered.status_code == 303
    assert "queued again (attempt 4)" in (await client.get("/webhooks", headers=HTML)).text
    [pending] = await run(
        db,
        Query("d", "A delivery.", "SELECT status FROM webhook_deliveries WHERE id = %(id)s")(
            {"id": delivery}
        ),
    )
    assert pending["status"] == "pending"

    # A refused action shows why, and is audited as refused.
    again = await client.post(f"/outbox/{row['id']}/discard", data={"csrf": token}, headers=ORIGIN)
    assert "no outbox row" in (await client.get(again.headers["location"], headers=HTML)).text

    entries = await run(db, AUDIT({"actor": actor}))
    assert [(e["action"], e["outcome"]) for e in entries] == [
        ("job.retry", "succeeded"),
        ("outbox.discard", "succeeded"),
        ("webhook.redeliver", "succeeded"),
        ("outbox.discard", "refused"),
    ]


def next_page_link(page: str) -> str | None:
    found = re.search(r'id="next-page" rel="next" href="([^"]+)"', page)
    return html.unescape(found.group(1)) if found else None


async def test_the_list_pages_by_keyset_keeps_its_filters_and_filters_by_key(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    ids = [await add_job(db, settings, "acme", f"e-{n}") for n in range(5)]
    other = await add_job(db, settings, "globex", "e-0")
    seen: list[set[str]] = []
    url: str | None = "/jobs?tenant=acme&limit=2"
    while url is not None:
        answer = await client.get(url, headers=HTML)
        assert answer.status_code == 200
        seen.append(job_ids_listed(answer.text))
        url = next_page_link(answer.text)
        if len(seen) == 1:
            assert url is not None
            assert "tenant=acme" in url
            assert "limit=2" in url
            # A job enqueued while the operator reads page 1 does not shift page 2.
            await add_job(db, settings, "acme", "late")
    assert [len(p) for p in seen] == [2, 2, 1]
    assert set().union(*seen) == set(ids)
    assert other not in set().union(*seen)

    broken = await client.get("/jobs?after=yesterday_x", headers={})
    assert broken.status_code == 400
    assert broken.headers["content-type"] == "application/problem+json"

    job_type = default_registry.get("sync_account")
    async with db.unit_of_work() as uow:
        unique = await enqueue(
            uow,
            Topology.from_settings(settings),
            EnqueueRequest(
                tenant="acme",
                job_type=job_type,
                payload=job_type.validate_payload({"account": "A-1"}),
            ),
        )
        await uow.commit()
    answer = await client.get(
        "/jobs", params={"key_kind": "unique", "key": "A-1", "tenant": "acme"}, headers=HTML
    )
    assert job_ids_listed(answer.text) == {str(unique.job_id)}
    answer = await client.get("/jobs", params={"key_kind": "ordering", "key": "A-1"}, headers=HTML)
    assert job_ids_listed(answer.text) == set()


async def test_the_list_across_tenants_and_statuses_pages_newest_first_through_ties(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    # Jobs of every status and two tenants, three of them created at the same instant:
    # the list with no filter merges the statuses' own orders (CONSOLE_JOB_SEARCH_ANY_STATUS)
    # and must page through them as one order, each job once.
    ids = [await add_job(db, settings, tenant, "e") for tenant in ("acme", "globex") * 4]
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET status = (ARRAY['pending', 'running', 'succeeded', 'failed',"
            " 'cancelled'])[1 + numbered.n % 5] FROM (SELECT id, row_number() OVER"
            " (ORDER BY id) AS n FROM jobs) AS numbered WHERE jobs.id = numbered.id"
        )
        await conn.execute(
            "UPDATE jobs SET created_at = '2026-01-01T00:00:00Z' WHERE id = ANY(%s::uuid[])",
            (ids[2:5],),
        )
        cur = await conn.execute("SELECT id FROM jobs ORDER BY created_at DESC, id DESC")
        newest_first = [str(row["id"]) for row in await cur.fetchall()]
    pages: list[list[str]] = []
    url: str | None = "/jobs?limit=3"
    while url is not None:
        answer = await client.get(url, headers=HTML)
        assert answer.status_code == 200
        pages.append(re.findall(r'href="/jobs/([0-9a-f-]{36})"', answer.text))
        url = next_page_link(answer.text)
    assert [len(page) for page in pages] == [3, 3, 2]
    assert [job for page in pages for job in page] == newest_first
    typed = await client.get("/jobs?type=echo", headers=HTML)
    assert len(job_ids_listed(typed.text)) == 8


async def test_a_failed_job_blocking_its_key_offers_unblock_and_says_what_it_does(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    job_type = default_registry.get("echo")
    async with db.unit_of_work() as uow:
        result = await enqueue(
            uow,
            Topology.from_settings(settings),
            EnqueueRequest(
                tenant="acme",
                job_type=job_type,
                payload=job_type.validate_payload({"text": "first"}),
                ordering_key="acct-1",
            ),
        )
        await uow.commit()
    job_id = str(result.job_id)
    await run(db, FAIL_JOB({"id": job_id}))
    page = await client.get(f"/jobs/{job_id}", headers=HTML)
    assert "Last error</strong>, attempt" in page.text
    assert "Lets the later jobs of ordering key acct-1 go on" in page.text
    assert "takes this job&#39;s place in ordering key acct-1" in page.text
    token = csrf_of(page.text)
    done = await client.post(f"/jobs/{job_id}/unblock", data={"csrf": token}, headers=ORIGIN)
    assert done.status_code == 303
    after = await client.get(done.headers["location"], headers=HTML)
    assert "Ordering key acct-1 goes on without this job." in after.text
    # Unblocked: the action is gone, and retry now goes to the back of the key.
    assert "Unblock its key" not in after.text
    assert "goes to the back of ordering key acct-1" in after.text
    entries = await run(db, AUDIT({"actor": client.headers["X-Actor"]}))
    assert [(e["action"], e["outcome"]) for e in entries] == [("job.unblock", "succeeded")]


async def test_a_pending_jobs_page_edits_the_version_it_shows(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    actor = client.headers["X-Actor"]
    job_id = await add_job(db, settings, "acme", "e-edit")
    page = (await client.get(f"/jobs/{job_id}", headers=HTML)).text
    shown = re.search(r'name="version" value="([^"]+)"', page)
    assert shown, page
    token = csrf_of(page)
    form = {"csrf": token, "version": shown.group(1), "priority": "high", "payload": ""}
    edited = await client.post(
        f"/jobs/{job_id}/edit",
        data={**form, "payload": '{"text": "edited"}'},
        headers=ORIGIN,
    )
    assert edited.status_code == 303
    after = (await client.get(edited.headers["location"], headers=HTML)).text
    assert "Job changed (priority, payload)" in after
    assert "changed in place" in after  # the timeline's edited event
    # The same form again names a version the job no longer is: refused, and said why.
    stale = await client.post(f"/jobs/{job_id}/edit", data=form, headers=ORIGIN)
    assert (
        "changed since that version"
        in (await client.get(stale.headers["location"], headers=HTML)).text
    )
    entries = await run(db, AUDIT({"actor": actor}))
    assert [(e["action"], e["outcome"]) for e in entries] == [
        ("job.edit", "succeeded"),
        ("job.edit", "refused"),
    ]
    [job] = await run(
        db, Query("j", "A job.", "SELECT payload FROM jobs WHERE id = %(id)s")({"id": job_id})
    )
    assert job["payload"] == {"text": "edited", "count": 1}


async def test_the_job_page_shows_a_debounced_jobs_key_and_coalesced_count(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    job_type = default_registry.get("reindex_account")
    topology = Topology.from_settings(settings)
    for change in ("a", "b", "c"):
        async with db.unit_of_work() as uow:
            result = await enqueue(
                uow,
                topology,
                EnqueueRequest(
                    tenant="acme",
                    job_type=job_type,
                    payload=job_type.validate_payload({"account": "acct-7", "change": change}),
                ),
            )
            await uow.commit()
    page = await client.get(f"/jobs/{result.job_id}", headers=HTML)
    assert page.status_code == 200
    assert 'id="coalesced-key">debounce:reindex_account:tenant=acme:account=acct-7<' in (page.text)
    assert '<span id="coalesced-count">3</span> enqueues coalesced' in page.text
    plain = await add_job(db, settings, "acme", "e-1")
    assert 'id="coalesced"' not in (await client.get(f"/jobs/{plain}", headers=HTML)).text


async def test_the_batch_pages_show_counts_and_callbacks_and_close_and_cancel(
    client: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    from jobcore.usecases.batches import Callback, create_batch

    echo = default_registry.get("echo")
    written = await create_batch(
        db,
        Topology.from_settings(settings),
        tenant="acme",
        members=[
            EnqueueRequest(tenant="acme", job_type=echo, payload=echo.validate_payload({"text": t}))
            for t in ("a", "b")
        ],
        callbacks={"on_complete": Callback(default_registry.get("batch_done"), {"note": "n"})},
        close=False,
        description="album 7",
    )
    listed = await client.get("/batches", params={"tenant": "acme"})
    assert listed.status_code == 200
    assert f'href="/batches/{written.batch_id}"' in listed.text
    assert "album 7" in listed.text
    shown = await client.get(f"/batches/{written.batch_id}")
    assert shown.status_code == 200
    assert 'id="action-close"' in shown.text
    assert "batch_done" in shown.text
    closed = await client.post(
        f"/batches/{written.batch_id}/close", data={"csrf": csrf_of(shown.text)}, headers=ORIGIN
    )
    assert closed.status_code == 303
    shown = await client.get(f"/batches/{written.batch_id}")
    assert "Batch closed." in shown.text
    assert 'id="action-close"' not in shown.text
    cancelled = await client.post(
        f"/batches/{written.batch_id}/cancel", data={"csrf": csrf_of(shown.text)}, headers=ORIGIN
    )
    assert cancelled.status_code == 303
    shown = await client.get(f"/batches/{written.batch_id}")
    assert "2 of its jobs cancelled" in shown.text
    assert re.search(r'href="/jobs/[0-9a-f-]{36}"', shown.text)  # the fired on_complete
    actions = await run(db, AUDIT({"actor": client.headers["X-Actor"]}))
    assert [a["action"] for a in actions][-2:] == ["batch.close", "batch.cancel"]
    missing = await client.get(f"/batches/{uuid.uuid4()}", headers={"Accept": "text/html"})
    assert missing.status_code == 404
