"""Schemathesis hooks for ``st run`` against a live jobcore API (tests/security/schemathesis.toml).

The API's own rules that an OpenAPI document cannot state, applied to the requests
schemathesis generates as valid (its positive cases) so that they are valid for the API
too; invalid requests are left as they were, and must still be refused:

- ``run_at`` and ``delay`` exclude each other, and ``run_at`` is within a year from now
  (parameters in OpenAPI are independent, and a schema has no "now");
- an ``Idempotency-Key`` sent again with a different request is a 422 by design; each
  valid request (an enqueue, a workflow, and each job of a batch of ``/batches``) gets a
  key of its own (replays are tested in test_idempotency.py and
  tests/integration/api/test_workflows.py);
- a ``cursor`` is one the API handed out: a valid one stands for any well-formed token;
- the open batch the test seeds stays open: a valid ``POST /batches/{id}/jobs`` does not
  close it (every later request would answer 409, however malformed);
- an edit (``PATCH /jobs/{id}``) names the job's current version (its ETag, read here
  first; a version the job no longer is answers 412 by design), and a new payload is the
  job type's, which the document cannot say for a job id: a valid edit changes its
  priority and run_at only (payload edits are tested in tests/integration/api).

And, for every request, a callback URL that would be resolved names a loopback receiver
the test allows (``JOBCORE_WEBHOOK_ALLOWED_HOSTS``): the machine may be offline, and a
made-up host resolves nowhere.

One check is added to schemathesis's own: every error answer is this API's problem JSON.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import MutableMapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import schemathesis
from schemathesis import GenerationMode

from jobcore.execution.registry import JobType, default_registry
from jobcore.usecases.enqueue.submit import MAX_SCHEDULE_AHEAD
from services.api.callbacks import CALLBACK_URL_PATTERN
from services.api.cursor import encode_cursor
from services.api.problems import PROBLEM_BASE, PROBLEM_MEDIA_TYPE

# Discard (port 9) on loopback: nothing is delivered, no worker runs during the test.
CALLBACK_HOST = "127.0.0.1:9"
CALLBACK_URL = f"http://{CALLBACK_HOST}/hooks/jobs"
# A position before every job: a valid cursor whose page is empty.
A_CURSOR = encode_cursor(datetime(2000, 1, 1, tzinfo=UTC), uuid.UUID(int=0))
_ENQUEUE_PATH = re.compile(r"^/jobs/[a-z][a-z0-9_]*$")
# A batch's items answer one by one (200 either way), but its callback_url is resolved once.
_BATCH_PATH = re.compile(r"^/jobs/[a-z][a-z0-9_]*/batch$")
# A batch's jobs (POST /batches, POST /batches/{id}/jobs): each as a batch item.
_BATCHES_PATH = re.compile(r"^/batches(/\{batch_id\}/jobs)?$")


def example_types() -> list[JobType[Any]]:
    """The example types the contract test's API serves."""
    import jobcore.examples.jobtypes  # noqa: F401  (registers them)

    return list(default_registry)


# A margin so a run_at just inside the window when generated is still inside when checked.
_MARGIN = timedelta(minutes=5)
# Types debounced by key (their key's enqueues decide when they run): they take no run_at
# or delay, which the document cannot say per type. The API serves the example types.
_DEBOUNCED = frozenset(kind.name for kind in example_types() if kind.debounce is not None)


def _is_positive(case: Any) -> bool:
    return case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE


def _schedulable(run_at: Any) -> bool:
    """Within the year ahead the API takes, and a time UTC can hold."""
    try:
        when = datetime.fromisoformat(str(run_at))
        if when.tzinfo is None:
            return False
        return when.astimezone(UTC) < datetime.now(UTC) + MAX_SCHEDULE_AHEAD - _MARGIN
    except (ValueError, OverflowError):
        # A form Python does not read (left out rather than guessed at), or year 1 or
        # 9999 with an offset that takes it out of range in UTC.
        return False


def _one_schedule(fields: MutableMapping[str, Any], *, debounced: bool = False) -> None:
    """``run_at`` within the window, and not together with ``delay``; neither for a
    debounced type."""
    if debounced:
        fields.pop("run_at", None)
        fields.pop("delay", None)
    if "run_at" in fields and not _schedulable(fields["run_at"]):
        del fields["run_at"]
    if "run_at" in fields:
        fields.pop("delay", None)


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    operation = case.operation
    query = case.query if isinstance(case.query, MutableMapping) else None
    enqueue = operation.method.upper() == "POST" and _ENQUEUE_PATH.match(operation.path)
    batch = operation.method.upper() == "POST" and _BATCH_PATH.match(operation.path)
    if (
        (enqueue or batch)
        and query
        and re.match(CALLBACK_URL_PATTERN, str(query.get("callback_url", "")))
    ):
        query["callback_url"] = CALLBACK_URL
    if not _is_positive(case):
        return
    debounced = operation.path.split("/")[2] in _DEBOUNCED if (enqueue or batch) else False
    if enqueue and query is not None:
        _one_schedule(query, debounced=debounced)
    if batch and isinstance(case.body, MutableMapping) and isinstance(case.body.get("items"), list):
        for item in case.body["items"]:
            if isinstance(item, MutableMapping):
                _one_schedule(item, debounced=debounced)
    workflows = operation.method.upper() == "POST" and operation.path == "/workflows"
    if workflows and isinstance(case.body, MutableMapping):
        _valid_workflow(case.body)
    batches = operation.method.upper() == "POST" and _BATCHES_PATH.match(operation.path)
    if (
        batches
        and isinstance(case.body, MutableMapping)
        and isinstance(case.body.get("jobs"), list)
    ):
        if operation.path != "/batches":
            case.body.pop("close", None)
        for job in case.body["jobs"]:
            if isinstance(job, MutableMapping):
                _one_schedule(job, debounced=job.get("type") in _DEBOUNCED)
                if "idempotency_key" in job:
                    job["idempotency_key"] = (
                        f"{str(job['idempotency_key'])[:200]}.{uuid.uuid4().hex}"
                    )
    keyed = enqueue or workflows
    if keyed and isinstance(case.headers, MutableMapping) and "Idempotency-Key" in case.headers:
        key = str(case.headers["Idempotency-Key"])
        case.headers["Idempotency-Key"] = f"{key[:200]}.{uuid.uuid4().hex}"
    edit = operation.method.upper() == "PATCH" and operation.path == "/jobs/{job_id}"
    if edit and isinstance(case.body, MutableMapping):
        _valid_edit(case)
    listing = operation.method.upper() == "GET" and operation.path == "/jobs"
    if listing and query and query.get("cursor"):
        query["cursor"] = A_CURSOR


def _valid_workflow(body: MutableMapping[str, Any]) -> None:
    """A graph the API can take: jobs of a type it serves (``noop``, whose payload is
    empty), with names of their own and no edges (which the document cannot tie to the
    names it generates); a graph's own checks are tested in tests/integration."""
    jobs = body.get("jobs")
    if not isinstance(jobs, list):
        return
    for n, job in enumerate(jobs):
        if isinstance(job, MutableMapping):
            job.update(name=f"step-{n}", type="noop", payload={}, depends_on=[])
            job["finally"] = False


def _valid_edit(case: Any) -> None:
    body = case.body
    body.pop("payload", None)
    _one_schedule(body)
    if not body:
        body["priority"] = "normal"
    # The key the config sends (schemathesis.toml: JOBCORE_ST_API_KEY).
    auth = {"Authorization": f"Bearer {os.environ.get('JOBCORE_ST_API_KEY', '')}"}
    url = f"{str(case.operation.base_url).rstrip('/')}{case.formatted_path}"
    found = httpx.get(url, headers=auth, timeout=10)
    if found.status_code == 200 and "etag" in found.headers and case.headers is not None:
        case.headers["If-Match"] = found.headers["etag"]


@schemathesis.check
def errors_are_problem_json(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx and 5xx answer is RFC 9457 problem JSON with this API's problem types."""
    if response.status_code < 400:
        return None
    content_type = response.headers.get("content-type", [""])
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    assert content_type == PROBLEM_MEDIA_TYPE, f"{response.status_code} as {content_type}"
    body = response.json()
    assert body["status"] == response.status_code, body
    assert body["type"].startswith(PROBLEM_BASE), body
    assert isinstance(body["title"], str), body
    assert isinstance(body["detail"], str), body
    return None
