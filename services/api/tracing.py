"""A SERVER span per HTTP request, continuing the caller's W3C ``traceparent``.

Pure ASGI, so it sees every answer (problem JSON included) without buffering bodies.
The span is named ``METHOD route-template`` (``POST /jobs/echo``, ``GET /jobs/{job_id}``)
once routing has picked the route: a template, never the raw path, so names stay few.
With tracing off the middleware passes requests straight through.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import propagate
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobcore.telemetry import span_if_enabled, tracer, tracing_enabled


def route_template(scope: Scope) -> str | None:
    route = scope.get("route")
    if route is None:
        return None
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    return template if isinstance(template, str) else None


def _carrier(scope: Scope) -> dict[str, str]:
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope.get("headers", ())
        if name in (b"traceparent", b"tracestate")
    }


class RequestSpans:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not tracing_enabled():
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET")
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.path": scope.get("path", ""),
            "url.scheme": scope.get("scheme", "http"),
        }
        status: dict[str, int] = {}

        async def send_with_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        parent = propagate.extract(_carrier(scope))
        with tracer().start_as_current_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            try:
                await self.app(scope, receive, send_with_status)
            finally:
                template = route_template(scope)
                if template is not None:
                    span.update_name(f"{method} {template}")
                    span.set_attribute("http.route", template)
                if "code" in status:
                    span.set_attribute("http.response.status_code", status["code"])
                    if status["code"] >= 500:
                        span.set_status(Status(StatusCode.ERROR))


def install(app: Any) -> None:
    """Add the request spans to a FastAPI/Starlette app (outermost but for error pages)."""
    app.add_middleware(RequestSpans)


def enqueue_span(tenant: str, job_type: str) -> AbstractContextManager[Span | None]:
    """The INTERNAL ``enqueue`` span around writing a job and its outbox row (``None``
    when tracing is off). The caller adds ``job.id`` once the statement returned it."""
    return span_if_enabled("enqueue", attributes={"tenant": tenant, "job.type": job_type})
