"""What a path segment under ``/jobs/`` names, decided by routing: a job or a job type.

``/jobs/{job_id}`` (``GET``) and ``/jobs/{job_type}`` (``POST``) share one segment. With
both matching every segment, Starlette answered ``OPTIONS /jobs/<job id>`` with the
enqueue route's ``Allow: POST`` and ``GET /jobs/echo`` from the job route. So:

- the job route takes no segment shaped like a job type name (``GET /jobs/echo`` is a
  405 with ``Allow: POST``); a malformed id still reaches it (401 without a key, then 422);
- the enqueue catch-all takes no segment shaped like a job id (``POST /jobs/<job id>`` is
  a 405 with ``Allow: GET``); any other unregistered name is a 404 ``unknown-job-type``.

Starlette's convertors are registered process-wide by name; these two are fixed regexes,
so registering them again (one app per test) changes nothing.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.routing import iter_route_contexts
from starlette.convertors import Convertor, register_url_convertor
from starlette.routing import Match

# The envelope's rule for a job type name, and a job id as /openapi.json gives it
# (format uuid), both without anchors.
_JOB_TYPE_SHAPE = r"[a-z][a-z0-9_]{0,62}"
_JOB_ID_SHAPE = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"


class _Segment(Convertor[str]):
    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


class JobIdSegment(_Segment):
    """Any segment not shaped like a job type name; FastAPI validates it as a UUID."""

    regex = rf"(?!{_JOB_TYPE_SHAPE}(?:/|$))[^/]+"


class JobTypeSegment(_Segment):
    """Any segment not shaped like a job id."""

    regex = rf"(?!{_JOB_ID_SHAPE}(?:/|$))[^/]+"


register_url_convertor("job_id", JobIdSegment())
register_url_convertor("job_type", JobTypeSegment())

# The route paths that use them (/openapi.json shows them as /jobs/{job_id}, /jobs/{job_type}).
ONE_JOB = "/jobs/{job_id:job_id}"
ANY_JOB_TYPE = "/jobs/{job_type:job_type}"


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path: a 405's ``Allow``. Starlette
    names only the first route whose path matched, though several may share a path."""
    scope: dict[str, Any] = {**request.scope, "path_params": {}}
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.routes):
        match, _ = route.matches(scope)
        if match is not Match.NONE and route.methods:
            methods.update(route.methods)
    return sorted(methods)
