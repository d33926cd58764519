"""The console's composition root and pages: sign-in, overview, jobs, outbox, dead letters,
webhook deliveries, tenants and keys.

Every page but sign-in needs a session of an admin key (:mod:`services.ui.sessions`); the
key is checked again on every request, before any other work. Every action is a POST with
the session's form token, calls the use case the command of the same name calls, and is
audited with the actor ``ui:key:<key id>``. Pages are rendered on the server (Jinja2);
the CSS and the little script are served from the package, nothing from elsewhere.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.applications import Starlette
from starlette.routing import Mount, Route

from jobcore.access import apikeys
from jobcore.access.apikeys import InvalidApiKey, Principal
from jobcore.access.audit import url_fingerprint
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.payloads import read_payload
from jobcore.execution.registry import Registry, load_job_modules
from jobcore.kernel.errors import (
    BatchNotFound,
    BrokerUnavailable,
    DatabaseUnavailable,
    InvalidField,
    JobcoreError,
    JobNotFound,
    ServiceStateError,
)
from jobcore.kernel.priorities import Priority
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.kernel.states import JobStatus, is_terminal
from jobcore.storage.objectstore import open_result_store
from jobcore.storage.results import ResultNotFound, ResultStore
from jobcore.usecases import batches as batch_usecases
from jobcore.usecases import console, dlq, job_edits, outbox
from jobcore.usecases import jobs as job_usecases
from jobcore.usecases import keys as key_usecases
from jobcore.usecases import quotas as quota_usecases
from jobcore.usecases import webhooks as webhook_usecases
from jobcore.usecases import workflows as workflow_usecases
from services.ui.charts import sparkline
from services.ui.jobpage import job_actions
from services.ui.sessions import (
    COOKIE_NAME,
    CSRF_FIELD,
    DEFAULT_TTL_SECONDS,
    Session,
    SessionStore,
    csrf_matches,
    same_origin,
)
from services.ui.timeline import render_timeline
from services.ui.workflowgraph import workflow_svg

# How the jobs list and the job page name each kind of key.
KEY_KIND_WORDS = {
    "ordering": "ordering key",
    "concurrency": "concurrency limit",
    "rate": "rate limit",
    "unique": "unique key",
}

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
MOUNT_PATH = "/ui"
LIST_LIMIT = 100
# The page refreshes its live part this often (milliseconds).
LIVE_INTERVAL_MS = 5000
# Enough of the overview's history for its sparklines (one sample per refresh).
SAMPLES_KEPT = 60
# One answer for every key that may not sign in: unknown, revoked, expired or not admin.
SIGN_IN_REFUSED = "That key cannot sign in to the console."

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@dataclass
class Console:
    settings: Settings
    registry: Registry
    sessions: SessionStore
    db: Database | None = None
    # (total pending, oldest due outbox row's age) per overview refresh, oldest first.
    samples: list[tuple[int, float]] | None = None
    results: ResultStore | None = None

    def result_store(self) -> ResultStore:
        """The result store, opened on first use and kept: opening it (a client of the
        bucket, with its own connections) on every job page view would cost each one.
        Opened when first needed, so a console whose store is misconfigured still starts,
        and says so on the pages that read from it."""
        if self.results is None:
            self.results = open_result_store(self.settings)
        return self.results


class SignInRequired(Exception):
    """No usable session: the browser is sent to the sign-in page."""


class Forbidden(Exception):
    """A POST without this site's Origin or without the session's form token."""


@dataclass(frozen=True, slots=True)
class Operator:
    session: Session
    principal: Principal


def _console(request: Request) -> Console:
    found: Console = request.app.state.console
    return found


def _db(request: Request) -> Database:
    db = _console(request).db
    if db is None:
        raise ServiceStateError("the database pool is not open")
    return db


async def operator(request: Request) -> Operator:
    """The signed-in operator: a live session whose key is still active and admin."""
    app = _console(request)
    session = app.sessions.get(request.cookies.get(COOKIE_NAME))
    if session is None:
        raise SignInRequired()
    try:
        async with _db(request).session() as db_session:
            principal = await apikeys.authenticate_hash(db_session, session.key_hash)
    except InvalidApiKey:
        app.sessions.end(session.id)
        raise SignInRequired() from None
    if Scope.ADMIN not in principal.scopes:
        app.sessions.end(session.id)
        raise SignInRequired()
    return Operator(session, principal)


OperatorDep = Annotated[Operator, Depends(operator)]


async def checked_post(request: Request, who: OperatorDep) -> Operator:
    """A signed-in operator's POST from a page of this site with the session's token."""
    if not same_origin(request):
        raise Forbidden("the request does not come from this site")
    form = await request.form()
    if not csrf_matches(who.session, form.get(CSRF_FIELD)):
        raise Forbidden("the form token is missing or wrong; reload the page")
    return who


ActionDep = Annotated[Operator, Depends(checked_post)]


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals.update(
        sparkline=sparkline,
        render_timeline=render_timeline,
        statuses=[s.value for s in JobStatus],
        is_terminal=lambda status: is_terminal(JobStatus(status)),
        origin_of=lambda url: url_fingerprint(url)["url_origin"],
        live_interval_ms=LIVE_INTERVAL_MS,
        key_kind_words=KEY_KIND_WORDS,
    )
    templates.env.filters["age"] = _age
    return templates


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = float(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# Batches the console's list shows, newest first.
BATCHES_SHOWN = 100

TEMPLATES = _templates()


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def page(
    request: Request,
    name: str,
    who: Operator | None,
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    flash: list[tuple[str, str]] = []
    if who is not None:
        flash, who.session.flash = who.session.flash, []
    return TEMPLATES.TemplateResponse(
        request,
        name,
        {
            "base": _base(request),
            "who": who,
            "csrf": who.session.csrf if who else "",
            "flash": flash,
            **context,
        },
        status_code=status_code,
    )


def back(request: Request, path: str) -> RedirectResponse:
    return RedirectResponse(_base(request) + path, status_code=303)


async def act(
    request: Request,
    who: Operator,
    path: str,
    action: Callable[[], Awaitable[str]],
) -> RedirectResponse:
    """Run an action; its outcome (or the reason it was refused) shows on the next page."""
    try:
        done = await action()
    except (DatabaseUnavailable, BrokerUnavailable, ServiceStateError):
        raise
    except JobcoreError as exc:
        who.session.flash.append(("error", str(exc)))
    else:
        who.session.flash.append(("ok", done))
    return back(request, path)


def _wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def _problem(request: Request, status: int, title: str, detail: str) -> Response:
    """An HTML page for a browser, RFC 9457 problem JSON for anything else."""
    if _wants_html(request):
        return TEMPLATES.TemplateResponse(
            request,
            "error.html",
            {"base": _base(request), "who": None, "flash": [], "title": title, "detail": detail},
            status_code=status,
        )
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status_code=status,
        media_type="application/problem+json",
    )


def create_app(settings: Settings, *, session_ttl: float = DEFAULT_TTL_SECONDS) -> FastAPI:
    """The console, its routes at its root (mount it, e.g. at ``/ui``); its own pool,
    opened and closed in its lifespan."""
    state = Console(
        settings=settings,
        registry=load_job_modules(settings.job_modules),
        sessions=SessionStore(session_ttl),
        samples=[],
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        db = Database(settings, min_size=1, max_size=4, name="jobcore-ui")
        await db.open(wait=True)
        state.db = db
        try:
            yield
        finally:
            state.db = None
            await db.close()

    app = FastAPI(
        title="jobcore console",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.console = state
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.exception_handler(SignInRequired)
    async def to_sign_in(request: Request, _: SignInRequired) -> Response:
        if request.method == "GET" and _wants_html(request):
            return back(request, "/login")
        return _problem(request, 401, "Sign-in required", "Sign in with an admin key first.")

    @app.exception_handler(Forbidden)
    async def forbidden(request: Request, exc: Forbidden) -> Response:
        return _problem(request, 403, "Forbidden", str(exc))

    @app.exception_handler(JobNotFound)
    @app.exception_handler(BatchNotFound)
    async def not_found(request: Request, exc: JobcoreError) -> Response:
        return _problem(request, 404, "Not found", str(exc))

    @app.exception_handler(console.InvalidPageCursor)
    async def bad_cursor(request: Request, exc: console.InvalidPageCursor) -> Response:
        return _problem(request, 400, "Bad page link", str(exc))

    @app.exception_handler(DatabaseUnavailable)
    @app.exception_handler(BrokerUnavailable)
    @app.exception_handler(ServiceStateError)
    async def unavailable(request: Request, exc: JobcoreError) -> Response:
        return _problem(request, 503, "Unavailable", str(exc))

    _sign_in_routes(app, state)
    _overview_routes(app, state)
    _job_routes(app, state)
    _batch_routes(app, state)
    _workflow_routes(app, state)
    _operator_routes(app, state)
    return app


def _batch_routes(app: FastAPI, state: Console) -> None:
    @app.get("/batches", response_class=HTMLResponse)
    async def batch_list(request: Request, who: OperatorDep, tenant: str = "") -> Response:
        rows = await batch_usecases.list_batches(
            _db(request), tenant=tenant.strip() or None, limit=BATCHES_SHOWN
        )
        return page(request, "batches.html", who, batches=rows, tenant=tenant)

    @app.get("/batches/{batch_id}", response_class=HTMLResponse)
    async def batch_page(request: Request, who: OperatorDep, batch_id: uuid.UUID) -> Response:
        batch = await batch_usecases.get_batch(_db(request), tenant=None, batch_id=batch_id)
        return page(request, "batch.html", who, batch=batch)

    @app.post("/batches/{batch_id}/close")
    async def close_batch(request: Request, who: ActionDep, batch_id: uuid.UUID) -> Response:
        async def run() -> str:
            await batch_usecases.close_any_batch(_db(request), batch_id, actor=who.session.actor)
            return "Batch closed."

        return await act(request, who, f"/batches/{batch_id}", run)

    @app.post("/batches/{batch_id}/cancel")
    async def cancel_batch(request: Request, who: ActionDep, batch_id: uuid.UUID) -> Response:
        async def run() -> str:
            batch = await batch_usecases.cancel_any_batch(
                _db(request), state.settings, batch_id, actor=who.session.actor
            )
            return f"Batch cancelled: {batch['cancelled']} of its jobs cancelled."

        return await act(request, who, f"/batches/{batch_id}", run)


def _sign_in_routes(app: FastAPI, state: Console) -> None:
    @app.get("/login", response_class=HTMLResponse)
    async def login_form(request: Request) -> Response:
        return page(request, "login.html", None)

    @app.post("/login")
    async def login(request: Request) -> Response:
        if not same_origin(request):
            return _problem(request, 403, "Forbidden", "the request does not come from this site")
        form = await request.form()
        key = form.get("key")
        principal: Principal | None = None
        if isinstance(key, str):
            try:
                async with _db(request).session() as db_session:
                    principal = await apikeys.authenticate(db_session, key.strip())
            except InvalidApiKey:
                principal = None
        if principal is None or Scope.ADMIN not in principal.scopes:
            # The same answer for every refusal; the key is neither echoed nor logged.
            log.info("console sign-in refused")
            return page(request, "login.html", None, status_code=401, error=SIGN_IN_REFUSED)
        assert isinstance(key, str)
        session = state.sessions.create(principal.key_id, apikeys.hash_key(key.strip()))
        log.info("console sign-in", extra={"key_id": str(principal.key_id)})
        response = back(request, "/")
        response.set_cookie(
            COOKIE_NAME,
            session.id,
            max_age=int(state.sessions.ttl_seconds),
            path=_base(request) or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @app.post("/logout")
    async def logout(request: Request, who: ActionDep) -> Response:
        state.sessions.end(who.session.id)
        response = back(request, "/login")
        response.delete_cookie(COOKIE_NAME, path=_base(request) or "/")
        return response


def _overview_routes(app: FastAPI, state: Console) -> None:
    async def snapshot(request: Request) -> dict[str, Any]:
        view = await console.overview(_db(request), state.settings)
        samples = state.samples if state.samples is not None else []
        pending = sum(int(q["pending"]) for q in view.queues)
        samples.append((pending, float(view.outbox["oldest_due_age_seconds"])))
        del samples[:-SAMPLES_KEPT]
        return {
            "view": view,
            "pending_history": [s[0] for s in samples],
            "lag_history": [s[1] for s in samples],
        }

    @app.get("/", response_class=HTMLResponse)
    async def overview_page(request: Request, who: OperatorDep) -> Response:
        return page(request, "overview.html", who, **await snapshot(request))

    @app.get("/overview/live", response_class=HTMLResponse)
    async def overview_live(request: Request, who: OperatorDep) -> Response:
        return page(request, "overview_live.html", who, **await snapshot(request))


def _job_routes(app: FastAPI, state: Console) -> None:
    @app.get("/jobs", response_class=HTMLResponse)
    async def job_search(
        request: Request,
        who: OperatorDep,
        q: str = "",
        tenant: str = "",
        type: str = "",
        status: str = "",
        entity_id: str = "",
        key_kind: str = "",
        key: str = "",
        after: str = "",
        limit: str = "",
    ) -> Response:
        job_id = console.parse_job_id(q) if q else None
        if job_id is not None:
            return back(request, f"/jobs/{job_id}")
        where = console.JobSearch(
            tenant=tenant.strip() or None,
            type=type.strip() or None,
            status=JobStatus(status) if status in {s.value for s in JobStatus} else None,
            entity_id=(entity_id.strip() or q.strip()) or None,
            key_kind=key_kind if key_kind in console.KEY_COLUMNS else "ordering",
            key=key.strip() or None,
        )
        per_page = _bounded_int(limit, default=LIST_LIMIT, high=LIST_LIMIT)
        found = await console.search_jobs(
            _db(request), where, limit=per_page, after=after.strip() or None
        )
        filters = where.query()
        if per_page != LIST_LIMIT:
            filters["limit"] = str(per_page)
        return page(
            request,
            "jobs.html",
            who,
            rows=found.rows,
            where=where,
            filters=filters,
            after=after.strip(),
            next_after=found.next_after,
            key_kinds=list(console.KEY_COLUMNS),
        )

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    async def job_page(
        request: Request, who: OperatorDep, job_id: uuid.UUID, show: str = ""
    ) -> Response:
        view = await console.job_view(_db(request), job_id)
        shown = show == "payload"
        payload, payload_note = await _payload(state, view.job) if shown else (None, None)
        return page(
            request,
            "job.html",
            who,
            job=view.job,
            view=view,
            actions=job_actions(view),
            fields=_shown_fields(view.job),
            payload=payload,
            payload_note=payload_note,
            result=_pretty(view.job.get("result")) if shown else None,
            deliveries=view.deliveries,
        )

    @app.post("/jobs/{job_id}/cancel")
    async def cancel(request: Request, who: ActionDep, job_id: uuid.UUID) -> Response:
        async def run() -> str:
            outcome = await job_usecases.cancel_any_job(
                _db(request), state.settings, job_id, actor=who.session.actor
            )
            if outcome.requested:
                return "Cancel requested: the worker running the job was asked to stop."
            return "Job cancelled."

        return await act(request, who, f"/jobs/{job_id}", run)

    @app.post("/jobs/{job_id}/edit")
    async def edit(request: Request, who: ActionDep, job_id: uuid.UUID) -> Response:
        form = await request.form()

        async def run() -> str:
            changes = _edit_changes(form)
            outcome = await job_edits.edit_job(
                _db(request),
                state.settings,
                state.registry,
                job_id,
                version=str(form.get("version") or "") or None,
                changes=changes,
                actor=who.session.actor,
            )
            return f"Job changed ({', '.join(outcome.fields)}); its message {outcome.message}."

        return await act(request, who, f"/jobs/{job_id}", run)

    @app.post("/jobs/{job_id}/retry")
    async def retry(request: Request, who: ActionDep, job_id: uuid.UUID) -> Response:
        async def run() -> str:
            outcome = await job_usecases.retry_job(
                _db(request), state.settings, state.registry, job_id, actor=who.session.actor
            )
            return f"Retried as job {outcome.job_id}."

        return await act(request, who, f"/jobs/{job_id}", run)

    @app.post("/jobs/{job_id}/unblock")
    async def unblock(request: Request, who: ActionDep, job_id: uuid.UUID) -> Response:
        async def run() -> str:
            row = await job_usecases.unblock_job(_db(request), job_id, actor=who.session.actor)
            return f"Ordering key {row['ordering_key']} goes on without this job."

        return await act(request, who, f"/jobs/{job_id}", run)

    @app.post("/jobs/{job_id}/replay")
    async def replay_job(request: Request, who: ActionDep, job_id: uuid.UUID) -> Response:
        async def run() -> str:
            report = await dlq.replay_job_dead_letters(
                _db(request), state.settings, job_id, actor=who.session.actor
            )
            return _replayed_words(report)

        return await act(request, who, f"/jobs/{job_id}", run)


def _edit_changes(form: Any) -> job_edits.JobChanges:
    """The edit form's fields: each left empty stays as it is. InvalidField for one that
    does not parse (shown on the page like any refusal)."""
    run_at = str(form.get("run_at") or "").strip()
    priority = str(form.get("priority") or "").strip()
    payload = str(form.get("payload") or "").strip()
    when = None
    if run_at:
        try:
            when = datetime.fromisoformat(run_at)
        except ValueError:
            raise InvalidField("run_at", "is not an ISO 8601 time", kind="format") from None
    level = None
    if priority:
        try:
            level = Priority.parse(priority)
        except ValueError as exc:
            raise InvalidField("priority", str(exc), kind="enum") from None
    document = None
    if payload:
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise InvalidField("payload", "is not JSON", kind="json") from None
    return job_edits.JobChanges(run_at=when, priority=level, payload=document)


def _replayed_words(report: dlq.ReplayReport) -> str:
    skipped = "".join(f"; skipped {s.message_id}: {why}" for s, why in report.skipped)
    return f"Replayed {len(report.replayed)} message(s), skipped {len(report.skipped)}" + skipped


def _workflow_routes(app: FastAPI, state: Console) -> None:
    @app.get("/workflows", response_class=HTMLResponse)
    async def workflows_page(
        request: Request, who: OperatorDep, status: str = "", tenant: str = ""
    ) -> Response:
        async with _db(request).session() as session:
            rows = await workflow_usecases.list_workflows(
                session,
                tenant=tenant.strip() or None,
                status=status.strip() or None,
                limit=LIST_LIMIT,
            )
        return page(request, "workflows.html", who, rows=rows, status=status, tenant=tenant)

    @app.get("/workflows/{workflow_id}", response_class=HTMLResponse)
    async def workflow_page(request: Request, who: OperatorDep, workflow_id: uuid.UUID) -> Response:
        async with _db(request).session() as session:
            workflow = await workflow_usecases.get_workflow(session, workflow_id, tenant=None)
        graph = workflow_svg(workflow["jobs"], base=_base(request))
        return page(request, "workflow.html", who, workflow=workflow, graph=graph)

    @app.post("/workflows/{workflow_id}/cancel")
    async def cancel_workflow(request: Request, who: ActionDep, workflow_id: uuid.UUID) -> Response:
        async def run() -> str:
            outcome = await workflow_usecases.cancel_workflow(
                _db(request), workflow_id, tenant=None, actor=who.session.actor
            )
            return (
                f"Workflow cancelled: {outcome.cancelled} job(s) cancelled, "
                f"{outcome.asked_to_stop} asked to stop."
            )

        return await act(request, who, f"/workflows/{workflow_id}", run)

    @app.post("/workflows/{workflow_id}/jobs/{name}/retry")
    async def retry_workflow_job(
        request: Request, who: ActionDep, workflow_id: uuid.UUID, name: str
    ) -> Response:
        async def run() -> str:
            await workflow_usecases.retry_step(
                _db(request),
                Topology.from_settings(state.settings),
                workflow_id,
                name,
                tenant=None,
                actor=who.session.actor,
            )
            return f"Job {name} runs again; the jobs it made unreachable wait for it."

        return await act(request, who, f"/workflows/{workflow_id}", run)


def _operator_routes(app: FastAPI, state: Console) -> None:
    @app.get("/outbox", response_class=HTMLResponse)
    async def outbox_page(request: Request, who: OperatorDep) -> Response:
        db = _db(request)
        return page(
            request,
            "outbox.html",
            who,
            status=await outbox.outbox_status(db),
            quarantined=await outbox.list_quarantined(db, limit=LIST_LIMIT),
            failing=await outbox.list_failing(db, limit=LIST_LIMIT),
        )

    @app.post("/outbox/{row_id}/requeue")
    async def requeue(request: Request, who: ActionDep, row_id: int) -> Response:
        async def run() -> str:
            key = outbox.OutboxRowKey(id=row_id)
            row = await outbox.requeue(_db(request), key, actor=who.session.actor)
            return f"Outbox row {row['id']} requeued: the relays publish it now."

        return await act(request, who, "/outbox", run)

    @app.post("/outbox/{row_id}/discard")
    async def discard(request: Request, who: ActionDep, row_id: int) -> Response:
        async def run() -> str:
            key = outbox.OutboxRowKey(id=row_id)
            row = await outbox.discard(_db(request), key, actor=who.session.actor)
            return f"Outbox row {row['id']} discarded."

        return await act(request, who, "/outbox", run)

    @app.get("/dlq", response_class=HTMLResponse)
    async def dlq_page(request: Request, who: OperatorDep) -> Response:
        letters = await dlq.list_dead_letters(state.settings, limit=LIST_LIMIT)
        return page(request, "dlq.html", who, letters=[letter.as_dict() for letter in letters])

    @app.post("/dlq/replay")
    async def replay(request: Request, who: ActionDep) -> Response:
        # Read here, after the sign-in and form token checks (a Form parameter would be
        # parsed before them).
        limit = _bounded_int((await request.form()).get("limit"), default=100, high=100_000)

        async def run() -> str:
            report = await dlq.replay_dead_letters(
                _db(request), state.settings, limit=limit, actor=who.session.actor
            )
            return _replayed_words(report)

        return await act(request, who, "/dlq", run)

    @app.get("/webhooks", response_class=HTMLResponse)
    async def webhooks_page(
        request: Request,
        who: OperatorDep,
        status: Annotated[str, Query(pattern="^(|pending|delivered|failed)$")] = "failed",
    ) -> Response:
        rows = await webhook_usecases.list_deliveries(
            _db(request), job_id=None, status=status or None, limit=LIST_LIMIT
        )
        return page(request, "webhooks.html", who, rows=rows, status=status)

    @app.post("/webhooks/{delivery_id}/redeliver")
    async def redeliver(request: Request, who: ActionDep, delivery_id: uuid.UUID) -> Response:
        # From a job's page, back to it; else to the deliveries list.
        from_job = (await request.form()).get("job")
        job_id = console.parse_job_id(from_job) if isinstance(from_job, str) else None
        to = f"/jobs/{job_id}" if job_id is not None else "/webhooks"

        async def run() -> str:
            row = await webhook_usecases.redeliver(
                _db(request), state.settings, delivery_id, actor=who.session.actor
            )
            return f"Delivery {row['id']} queued again (attempt {row['attempt']})."

        return await act(request, who, to, run)

    @app.get("/tenants", response_class=HTMLResponse)
    async def tenants_page(request: Request, who: OperatorDep) -> Response:
        db = _db(request)
        keys = await key_usecases.list_keys(db)
        quotas = await quota_usecases.list_quotas(db, state.settings.quota_defaults)
        return page(request, "tenants.html", who, keys=keys, quotas=quotas)


# What the details table leaves out: payload and result (behind "show payload"), and
# `where` (the page's first line). What it shows only in part: a callback URL by its origin
# (webhook URLs carry tokens), the lease token (the worker's fence, no use to a person) by
# whether a worker holds it (an outcome leaves the token on the row: only a running job's
# is held). Columns without a value are left out.
HIDDEN_FIELDS = frozenset({"payload", "result", "where"})


def _shown_fields(job: dict[str, Any]) -> list[tuple[str, Any]]:
    shown: list[tuple[str, Any]] = []
    for name, value in job.items():
        if name in HIDDEN_FIELDS or value is None:
            continue
        if name == "callback_url":
            value = url_fingerprint(value)["url_origin"] + "/…"
        elif name == "lease_token":
            if job.get("status") != "running":
                continue
            value = "(held)"
        shown.append((name, value))
    return shown


async def _payload(state: Console, job: dict[str, Any]) -> tuple[str, str | None]:
    """The job's payload as the page shows it, and a note on where it came from: a payload
    stored by reference (``payload_ref``; the row keeps ``{}``) is read from the store,
    and one that cannot be read is said to be so, never shown as that ``{}``."""
    ref = job.get("payload_ref")
    if ref is None:
        return _pretty(job.get("payload")) or "null", None
    try:
        store = state.result_store()
        value = await read_payload(store, job.get("payload"), ref)
    except (OSError, ResultNotFound, ValueError) as exc:
        return "–", f"Stored by reference at {ref}; it could not be read now: {exc}"
    return _pretty(value) or "null", f"Stored by reference at {ref} (in the result store)."


def _bounded_int(given: object, *, default: int, high: int) -> int:
    if isinstance(given, str) and given.strip().isdigit():
        return max(1, min(int(given), high))
    return default


def _pretty(value: Any) -> str | None:
    if value is None:
        return None
    return orjson.dumps(value, default=str, option=orjson.OPT_INDENT_2).decode()


def standalone_app(settings: Settings, *, session_ttl: float = DEFAULT_TTL_SECONDS) -> Starlette:
    """`jobcore ui`: the console under ``/ui``, and ``/`` sending browsers there."""
    console_app = create_app(settings, session_ttl=session_ttl)

    async def root(_: Request) -> Response:
        return RedirectResponse(MOUNT_PATH + "/", status_code=307)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with console_app.router.lifespan_context(console_app):
            yield

    return Starlette(
        routes=[Route("/", root), Mount(MOUNT_PATH, app=console_app)], lifespan=lifespan
    )
