"""The console in a real browser (Playwright driving Debian's chromium) on a real stack:
the API, a relay, a worker and `jobcore ui` as separate processes.

An operator signs in, finds a running job, opens its page and cancels it; requeues a
quarantined outbox row; replays a dead letter. After each step the test checks what the
page shows and what the database (and the broker) hold. Each page's screenshot is saved
in a temporary directory, or under ``$JOBCORE_UI_SHOTS`` when set:
``JOBCORE_UI_SHOTS=docs/ui pytest tests/e2e/test_console_browser.py`` refreshes the ones
the README shows (a run of the suite leaves the checkout as it was).

Set-up, as the other tests make these: the flaky job's outbox row is quarantined with the
UPDATE the relay would make (before any relay runs, so none publishes it first); the echo
job is dead-lettered by a worker deployed without its job type, and a worker that has it
takes its place before the replay.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Dialog, Locator, Page, async_playwright, expect

from jobcore.database.gateway import Database, fetch_all, fetch_one
from jobcore.database.sql import Query
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import FAST_ENV, Process, free_port
from jobcore.testing.processes import ROOT, settings_env
from jobcore.testing.waiting import eventually
from jobcore.usecases import dlq
from jobcore.usecases import keys as key_usecases
from tests.integration.webhooks.support import Receiver
from tests.integration.worker.support import relayed
from tests.support import console_jobtypes

CHROMIUM = "/usr/bin/chromium"
ALL_TYPES = "jobcore.examples.jobtypes,jobcore.examples.demo,jobcore.testing.jobtypes"
# The first worker lacks the test job types: their messages are dead-lettered.
NO_ECHO = "jobcore.examples.jobtypes,jobcore.examples.demo"
START = 90.0
GRACE = 15.0

QUARANTINE = Query(
    "test_quarantine",
    "Quarantine a job's outbox rows as the relay would on an unpublishable message.",
    """
    UPDATE jobcore.outbox SET quarantined_at = now(), attempts = 1, failing_since = now(),
                      last_error = 'too_large: refused before sending'
    WHERE job_id = %(id)s
    RETURNING id
    """,
)
JOB = Query("test_job", "A job's row.", "SELECT * FROM jobcore.jobs WHERE id = %(id)s")
OUTBOX_ROW = Query(
    "test_outbox_row", "An outbox row.", "SELECT * FROM jobcore.outbox WHERE id = %(id)s"
)
RESCUER_LEASE = Query(
    "test_rescuer_lease",
    "The rescuer's lease.",
    "SELECT 1 FROM jobcore.maintenance_leases WHERE name = 'rescuer'",
)
DELIVERIES = Query(
    "test_deliveries",
    "A job's webhook deliveries.",
    "SELECT id, status, attempts FROM jobcore.webhook_deliveries WHERE job_id = %(id)s",
)
AUDIT = Query(
    "test_audit",
    "Audit entries of one actor, oldest first.",
    "SELECT action, outcome FROM jobcore.audit_log WHERE actor = %(actor)s ORDER BY at, id",
)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install_tools.sh", pytrace=False)
    async with async_playwright() as playwright:
        # --no-sandbox: CI runs as root, where chromium's sandbox cannot start.
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


class Processes:
    def __init__(self, settings: Settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.running: list[Process] = []

    def start(self, name: str, *args: str, modules: str = ALL_TYPES, **env: str) -> Process:
        process = Process(
            name,
            args,
            settings_env(self.settings, **FAST_ENV, JOBCORE_JOB_MODULES=modules, **env),
            self.log_dir,
        )
        process.start()
        self.running.append(process)
        return process

    async def stop_all(self) -> None:
        for process in self.running:
            await process.stop(GRACE)


async def until_http_ok(process: Process, url: str) -> None:
    async def ok() -> bool:
        if not process.alive:
            raise AssertionError(f"{process.name} exited:\n{process.all_logs()[-3000:]}")
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                return (await client.get(url)).status_code == 200
        except httpx.HTTPError:
            return False

    await eventually(ok, timeout=START, interval=0.1, what=f"{process.name} to answer {url}")


async def until_consuming(worker: Process) -> None:
    async def consuming() -> bool:
        if not worker.alive:
            raise AssertionError(f"{worker.name} exited:\n{worker.all_logs()[-3000:]}")
        return bool(worker.logged("worker consuming"))

    await eventually(consuming, timeout=START, interval=0.1, what=f"{worker.name} to consume")


async def job(db: Database, job_id: str) -> dict[str, object]:
    async with db.session() as session:
        row = await fetch_one(session, JOB({"id": job_id}))
    assert row is not None
    return dict(row)


async def rescuer_ran(db: Database) -> bool:
    async with db.session() as session:
        return bool(await fetch_all(session, RESCUER_LEASE({})))


async def job_status_is(db: Database, job_id: str, status: str) -> bool:
    return (await job(db, job_id))["status"] == status


@functools.cache
def shots_dir() -> Path:
    """$JOBCORE_UI_SHOTS (docs/ui to refresh the README's), else a temporary directory
    made on the first screenshot."""
    named = os.environ.get("JOBCORE_UI_SHOTS")
    if named:
        return ROOT / named
    return Path(tempfile.mkdtemp(prefix="jobcore-ui-shots-"))


async def shot(page: Page, name: str) -> None:
    shots = shots_dir()
    shots.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(shots / f"{name}.png"), full_page=True)


async def test_an_operator_finds_cancels_requeues_and_replays_in_a_browser(
    settings: Settings,
    db: Database,
    browser: Browser,
    tmp_path: Path,
    amqp_channel: object,  # deletes the test's queues afterwards
) -> None:
    # Relayed: the timeline it reads shows each job's publish.
    procs = Processes(relayed(settings), tmp_path / "logs")
    procs.log_dir.mkdir()
    admin = await key_usecases.create_key(db, "ops", "console", scopes=[Scope.ADMIN], actor="tests")
    client_key = (await key_usecases.create_key(db, "acme", "client", actor="tests")).key
    actor = f"ui:key:{admin.record.id}"
    try:
        api_port, ui_port = free_port(), free_port()
        api = procs.start("api", "api", "--port", str(api_port))
        ui = procs.start("ui", "ui", "--port", str(ui_port))
        console = f"http://127.0.0.1:{ui_port}/ui"
        await until_http_ok(api, f"http://127.0.0.1:{api_port}/readyz")
        await until_http_ok(ui, f"{console}/login")

        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{api_port}",
            headers={"Authorization": f"Bearer {client_key}"},
            timeout=10,
        ) as http:

            async def enqueue(job_type: str, payload: dict[str, object]) -> str:
                answer = await http.post(f"/jobs/{job_type}", json=payload)
                assert answer.status_code == 202, answer.text
                return str(answer.json()["job_id"])

            # The rescuer fails a pending job whose message is quarantined: the first worker
            # runs it once, at its start (the test waits for its lease), and not again.
            first_worker = procs.start(
                "worker-1",
                "worker",
                "--queue",
                "default",
                "--queue",
                "testq",
                modules=NO_ECHO,
                JOBCORE_WORKER_RESCUER_INTERVAL="3600",
            )
            await until_consuming(first_worker)
            await eventually(
                lambda: rescuer_ran(db), timeout=START, what="the rescuer's first round"
            )
            # No relay yet: the flaky job's row is quarantined before anyone publishes it.
            stuck = await enqueue("flaky", {"succeed_on_attempt": 1})
            async with db.unit_of_work() as uow:
                [quarantined] = await fetch_all(uow, QUARANTINE({"id": stuck}))
                await uow.commit()
            row_id = quarantined["id"]
            procs.start("relay", "relay")
            dead = await enqueue("echo", {"text": "replay me"})
            slow = await enqueue("slow", {"seconds": 300})

            async def one_dead_letter() -> bool:
                return await dlq.count_dead_letters(settings) == 1

            await eventually(one_dead_letter, timeout=START, what="the echo job dead-lettered")
            await eventually(
                lambda: job_status_is(db, slow, "running"), timeout=START, what="slow running"
            )

        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        page = await context.new_page()
        page.set_default_timeout(30_000)
        dialogs: list[str] = []

        async def accept(dialog: Dialog) -> None:
            dialogs.append(dialog.message)
            await dialog.accept()

        page.on("dialog", accept)

        # Sign in: the console sends a browser without a session to the sign-in page.
        await page.goto(f"{console}/")
        await expect(page).to_have_url(f"{console}/login")
        await shot(page, "sign-in")
        await page.get_by_label("Admin key").fill(admin.key)
        await page.get_by_label("Admin key").press("Enter")
        await expect(page).to_have_url(f"{console}/")
        await expect(page.locator("#quarantined")).to_have_text("1")
        await expect(page.locator("#dead-letters")).to_have_text("1")
        await expect(page.locator("#running")).to_have_text("1")
        await shot(page, "overview")
        cookies = await context.cookies()
        [session] = [c for c in cookies if c["name"] == "jobcore_ui_session"]
        assert session["httpOnly"]
        assert session["sameSite"] == "Strict"
        assert admin.key not in await page.content()

        # Find the running job (status filter) and open its page.
        await page.goto(f"{console}/jobs")
        await page.get_by_label("Status").select_option("running")
        await page.get_by_role("button", name="Search").click()
        rows = page.locator("#jobs tbody tr")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_contain_text("slow")
        await shot(page, "jobs")
        await rows.first.get_by_role("link").click()
        await expect(page).to_have_url(f"{console}/jobs/{slow}")
        await expect(page.locator("#job-status")).to_have_text("running")
        # The timeline: its events so far, and where the job is now, in words.
        timeline = page.locator("#timeline")
        await expect(timeline.locator("li.event-accepted")).to_have_count(1)
        await expect(timeline.locator("li.event-published")).to_have_count(1)
        await expect(timeline.locator("li.event-claimed")).to_contain_text("started")
        await expect(page.locator("#where")).to_contain_text("running on worker")
        # The payload only when asked for.
        # (The payload's text, not a bare 300: a timestamp's microseconds may hold that.)
        assert '"seconds"' not in await page.locator("#fields").inner_text()
        await expect(page.locator("#payload")).to_have_count(0)
        await shot(page, "job")

        # Cancel it: the worker is asked to stop it, then it is cancelled.
        await page.get_by_role("button", name="Cancel job").click()
        await expect(page.locator(".flash.ok")).to_contain_text("Cancel requested")
        assert dialogs == [f"Cancel job {slow}?"]
        assert (await job(db, slow))["cancel_requested_at"] is not None
        await eventually(
            lambda: job_status_is(db, slow, "cancelled"), timeout=START, what="slow cancelled"
        )
        await page.reload()
        await expect(page.locator("#job-status")).to_have_text("cancelled")
        await page.get_by_role("link", name="Show payload and result").click()
        await expect(page.locator("#payload")).to_contain_text('"seconds": 300')

        # Requeue the quarantined row: published now, and its job runs.
        await page.goto(f"{console}/outbox")
        await expect(page.locator("#quarantined-count")).to_have_text("1")
        row = page.locator(f"#row-{row_id}")
        await expect(row).to_contain_text("too_large")
        await shot(page, "outbox")
        await row.get_by_role("button", name="Requeue").click()
        await expect(page.locator(".flash.ok")).to_contain_text(f"Outbox row {row_id} requeued")
        async with db.session() as s:
            left = await fetch_one(s, OUTBOX_ROW({"id": row_id}))
        # Not quarantined any more (or already published and deleted by the relay).
        assert left is None or left["quarantined_at"] is None
        await eventually(
            lambda: job_status_is(db, stuck, "succeeded"), timeout=START, what="flaky succeeded"
        )
        await page.reload()
        await expect(page.locator("#quarantined-count")).to_have_text("0")

        # Replay the dead letter, once a worker that knows its job type runs.
        await first_worker.stop(GRACE)
        await until_consuming(procs.start("worker-2", "worker"))
        await page.goto(f"{console}/dlq")
        await expect(page.locator("#dead-letter-count")).to_have_text("1")
        await expect(page.locator("#dead-letters")).to_contain_text(dead[:8])
        await shot(page, "dead-letters")
        await page.get_by_role("button", name="Replay").click()
        await expect(page.locator(".flash.ok")).to_contain_text("Replayed 1 message(s)")
        await eventually(
            lambda: job_status_is(db, dead, "succeeded"), timeout=START, what="echo succeeded"
        )
        assert await dlq.count_dead_letters(settings) == 0

        for name, path in (("webhooks", "/webhooks?status="), ("tenants", "/tenants")):
            await page.goto(f"{console}{path}")
            await shot(page, name)
        await page.goto(f"{console}/")
        await expect(page.locator("#quarantined")).to_have_text("0")
        await expect(page.locator("#dead-letters")).to_have_text("0")
        await shot(page, "overview")
        # The overview refreshes itself (its script, allowed by the page's CSP) ...
        as_of = await page.locator("#live time").first.inner_text()
        await expect(page.locator("#live time").first).not_to_have_text(as_of, timeout=20_000)
        # ... and "/" jumps to the search box, from which Enter opens a job.
        await page.keyboard.press("/")
        await expect(page.locator("#q")).to_be_focused()
        await page.keyboard.type(dead)
        await page.keyboard.press("Enter")
        await expect(page).to_have_url(f"{console}/jobs/{dead}")
        await expect(page.locator("#job-status")).to_have_text("succeeded")

        async with db.session() as s:
            audited = [
                (r["action"], r["outcome"]) for r in await fetch_all(s, AUDIT({"actor": actor}))
            ]
        assert audited == [
            ("job.cancel", "succeeded"),
            ("outbox.requeue", "succeeded"),
            ("dlq.replay", "succeeded"),
        ]
        await context.close()
    finally:
        await procs.stop_all()
    # No key in anything the console wrote.
    assert admin.key not in ui.all_logs()


async def held_by_ordering(db: Database, job_id: str) -> bool:
    row = await job(db, job_id)
    return row["status"] == "pending" and row["held_reason"] == "ordering"


async def progress_reported(db: Database, job_id: str) -> bool:
    row = await job(db, job_id)
    return row["status"] == "running" and row["progress_fraction"] is not None


async def delivered(db: Database, job_id: str) -> bool:
    async with db.session() as session:
        rows = await fetch_all(session, DELIVERIES({"id": job_id}))
    return [r["status"] for r in rows] == ["delivered"]


async def test_the_job_page_answers_first_for_each_kind_of_job(
    settings: Settings,
    db: Database,
    browser: Browser,
    tmp_path: Path,
    amqp_channel: object,  # deletes the test's queues afterwards
) -> None:
    """Five real jobs, made through the API and run by a real worker: pending (due in an
    hour), held (behind the running job of its ordering key), running with progress (its
    handler waits for a file the test creates), failed after its retries, and succeeded
    with a webhook delivered to a receiver. Each job page says first what the operator
    came for; the raw columns wait behind "details"; the list filters and pages by URL."""
    procs = Processes(settings, tmp_path / "logs")
    procs.log_dir.mkdir()
    admin = await key_usecases.create_key(db, "ops", "console", scopes=[Scope.ADMIN], actor="tests")
    client_key = (await key_usecases.create_key(db, "acme", "client", actor="tests")).key
    actor = f"ui:key:{admin.record.id}"
    hooks = {"JOBCORE_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1"}
    modules = f"{ALL_TYPES},{console_jobtypes.MODULE}"
    gate = tmp_path / "finish-the-progress-job"
    receiver = Receiver()
    await receiver.start()
    try:
        api_port, ui_port = free_port(), free_port()
        api = procs.start("api", "api", "--port", str(api_port), modules=modules, **hooks)
        ui = procs.start("ui", "ui", "--port", str(ui_port), modules=modules)
        procs.start("relay", "relay", modules=modules)
        worker = procs.start(
            "worker", "worker", "--queue", "default", "--queue", "testq", modules=modules, **hooks
        )
        console = f"http://127.0.0.1:{ui_port}/ui"
        await until_http_ok(api, f"http://127.0.0.1:{api_port}/readyz")
        await until_http_ok(ui, f"{console}/login")
        await until_consuming(worker)

        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{api_port}",
            headers={"Authorization": f"Bearer {client_key}"},
            timeout=10,
        ) as http:

            async def enqueue(
                job_type: str, payload: dict[str, object], **params: str | int
            ) -> str:
                answer = await http.post(f"/jobs/{job_type}", json=payload, params=params)
                assert answer.status_code == 202, answer.text
                return str(answer.json()["job_id"])

            pending = await enqueue("echo", {"text": "later"}, delay=3600, entity_id="order-9")
            running = await enqueue(
                "console_progress",
                {"fraction": 0.4, "message": "step 2 of 5", "gate": str(gate)},
                ordering_key="acct-7",
                entity_id="order-9",
            )
            await eventually(
                lambda: progress_reported(db, running), timeout=START, what="progress reported"
            )
            held = await enqueue("echo", {"text": "after"}, ordering_key="acct-7")
            failed = await enqueue("doomed", {"reason": "the upstream said no"})
            succeeded = await enqueue("echo", {"text": "hooked"}, callback_url=receiver.url())
            await eventually(
                lambda: held_by_ordering(db, held), timeout=START, what="echo held by its key"
            )
            await eventually(
                lambda: job_status_is(db, failed, "failed"), timeout=START, what="doomed failed"
            )
            await eventually(lambda: delivered(db, succeeded), timeout=START, what="webhook sent")

        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        page = await context.new_page()
        page.set_default_timeout(30_000)
        await page.goto(f"{console}/login")
        await page.get_by_label("Admin key").fill(admin.key)
        await page.get_by_label("Admin key").press("Enter")
        await expect(page).to_have_url(f"{console}/")

        # Pending: when it is due, in words; cancel says it will not run.
        await page.goto(f"{console}/jobs/{pending}")
        await expect(page.locator("#job-status")).to_have_text("pending")
        await expect(page.locator("#where")).to_contain_text("due at")
        await expect(page.locator("#hold")).to_have_count(0)
        await expect(page.locator("#action-cancel")).to_contain_text("it will not run")
        await expect(page.locator("#action-retry")).to_have_count(0)
        # The raw columns: behind "details", closed, without the empty ones.
        fields = page.locator("#fields")
        await expect(fields).to_be_hidden()
        await page.locator("#details summary").click()
        await expect(fields).to_be_visible()
        await expect(fields.locator("th", has_text="entity_id")).to_have_count(1)
        await expect(fields.locator("th", has_text="lease_token")).to_have_count(0)
        await expect(fields.locator("th", has_text="rate_burst")).to_have_count(0)
        await expect(fields.locator("td", has_text="–")).to_have_count(0)
        await shot(page, "job-pending")

        # Running with progress: the bar, its message, and what cancel would do now.
        await page.goto(f"{console}/jobs/{running}")
        await expect(page.locator("#job-status")).to_have_text("running")
        await expect(page.locator("#where")).to_contain_text("running on worker")
        await expect(page.locator("#progress-bar")).to_have_attribute("value", "0.4")
        await expect(page.locator("#progress-percent")).to_have_text("40%")
        await expect(page.locator("#progress-message")).to_have_text("step 2 of 5")
        await expect(page.locator("#action-cancel")).to_contain_text("Asks the worker")
        await expect(page.locator("#keys")).to_contain_text("acct-7")
        await shot(page, "job-running")

        # Held: which key holds it, the job it waits for, and the key's other jobs.
        await page.goto(f"{console}/jobs/{held}")
        await expect(page.locator("#job-status")).to_have_text("pending")
        hold = page.locator("#hold")
        await expect(hold).to_contain_text("Held by ordering key acct-7 of tenant acme")
        await expect(hold.locator("#hold-waits-for")).to_have_text(running)
        await expect(page.locator("#where")).to_contain_text("held: an earlier job")
        await shot(page, "job-held")
        await hold.locator("#hold-others").click()
        await expect(page).to_have_url(f"{console}/jobs?tenant=acme&key_kind=ordering&key=acct-7")
        rows = page.locator("#jobs tbody tr")
        await expect(rows).to_have_count(2)
        await expect(page.locator("#jobs")).to_contain_text(held[:8])
        await expect(page.locator("#jobs")).to_contain_text(running[:8])
        await expect(page.locator("#jobs")).to_contain_text("held (ordering)")
        await hold_link_row(page, running).click()
        await expect(page).to_have_url(f"{console}/jobs/{running}")

        # Failed after its retries: the last error with its attempt, and what retry does.
        await page.goto(f"{console}/jobs/{failed}")
        await expect(page.locator("#job-status")).to_have_text("failed")
        await expect(page.locator("#last-error")).to_contain_text("the upstream said no")
        await expect(page.locator("#last-error-attempt")).to_have_text("3")
        await expect(page.locator("#where")).to_contain_text("after attempt 3 of 3")
        await expect(page.locator("#timeline li.event-retry_scheduled")).to_have_count(2)
        await expect(page.locator("#action-retry")).to_contain_text("this job stays failed")
        await expect(page.locator("#action-cancel")).to_have_count(0)
        await shot(page, "job-failed")

        # Succeeded with a webhook: the delivery, and a redelivery from the job's page.
        await page.goto(f"{console}/jobs/{succeeded}")
        await expect(page.locator("#job-status")).to_have_text("succeeded")
        await expect(page.locator("#where")).to_contain_text("succeeded at")
        deliveries = page.locator("#deliveries tbody tr")
        await expect(deliveries).to_have_count(1)
        await expect(deliveries.first).to_contain_text("delivered")
        await expect(deliveries.first).to_contain_text("http://127.0.0.1:")
        await expect(page.locator("#deliveries")).to_contain_text("sends the completion webhook")
        await expect(page.locator("#actions")).to_contain_text("Nothing")
        await shot(page, "job-succeeded")
        received = len(receiver.requests)
        await deliveries.first.get_by_role("button", name="Redeliver").click()
        await expect(page).to_have_url(f"{console}/jobs/{succeeded}")
        await expect(page.locator(".flash.ok")).to_contain_text("queued again (attempt 2)")
        await eventually(
            lambda: _more_than(receiver, received), timeout=START, what="the redelivery"
        )
        first, again = receiver.requests[0], receiver.requests[-1]
        assert again.headers["webhook-id"] == first.headers["webhook-id"]

        # The list: every filter in the URL, so the link opens the same list.
        await page.goto(f"{console}/jobs")
        await page.get_by_label("Status").select_option("failed")
        await page.get_by_label("Type").fill("doomed")
        await page.get_by_label("Tenant").fill("acme")
        await page.get_by_role("button", name="Search").click()
        await expect(page).to_have_url(
            f"{console}/jobs?status=failed&type=doomed&tenant=acme&entity_id=&key_kind=ordering&key="
        )
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_contain_text(failed[:8])
        shared = await context.new_page()
        await shared.goto(f"{console}/jobs?entity_id=order-9")
        await expect(shared.locator("#jobs tbody tr")).to_have_count(2)
        await expect(shared.locator("#jobs")).to_contain_text(pending[:8])
        await expect(shared.locator("#jobs")).to_contain_text(running[:8])
        await shared.close()
        # Keyset pages of two: every job once, newest first, the filters kept.
        await page.goto(f"{console}/jobs?tenant=acme&limit=2")
        listed: list[str] = []
        while True:
            links = page.locator("#jobs tbody tr a")
            await expect(links.first).to_be_visible()
            for href in await links.evaluate_all("(links) => links.map((a) => a.href)"):
                listed.append(href.rsplit("/", 1)[1])
            nxt = page.locator("#next-page")
            if await nxt.count() == 0:
                break
            assert "tenant=acme" in (await nxt.get_attribute("href") or "")
            await nxt.click()
            await expect(page.locator("#first-page")).to_be_visible()
        assert sorted(listed) == sorted([pending, running, held, failed, succeeded])

        # Let the progress job finish: the held job runs after it.
        gate.touch()
        await eventually(
            lambda: job_status_is(db, held, "succeeded"), timeout=START, what="held ran"
        )
        await page.goto(f"{console}/jobs/{held}")
        await expect(page.locator("#job-status")).to_have_text("succeeded")
        await expect(page.locator("#hold")).to_have_count(0)

        async with db.session() as s:
            audited = [
                (r["action"], r["outcome"]) for r in await fetch_all(s, AUDIT({"actor": actor}))
            ]
        assert audited == [("webhook.redeliver", "succeeded")]
        await context.close()
    finally:
        gate.touch()
        await procs.stop_all()
        await receiver.close()
    assert admin.key not in ui.all_logs()


def hold_link_row(page: Page, job_id: str) -> Locator:
    return page.locator("#jobs tbody tr a", has_text=job_id[:8])


async def _more_than(receiver: Receiver, count: int) -> bool:
    return len(receiver.requests) > count
