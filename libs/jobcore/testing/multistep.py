"""The multi-step load of `jobcore chaos` (``--multistep-rate``) and its end-of-run check.

Beside the ``effect`` load, through the stack's HTTP API, one action after another:

- a **diamond** workflow (a → {b, c} → d, b snoozing once, and a ``finally`` job);
- a **compensation** workflow (a fails for good; ``comp`` depends on it ``on_failure``,
  ``b`` ``on_success`` and so is cancelled as unreachable; a ``finally`` job);
- a **batch** of three steps with ``on_success``, ``on_complete`` and ``on_death``
  callbacks (every other batch has a member that fails for good);
- a **burst** of enqueues of a debounced type on one of a few keys;
- an **edit**: a step enqueued 3 s (or 0.3 s) ahead, read (its ETag), then PATCHed
  (``If-Match``) to ``edited: true``.

The job types are :mod:`jobcore.testing.multistep_jobtypes`. The check reads the database
(live rows and the copies :data:`ARCHIVE` keeps of what the pruner deletes during the run)
and counts violations of each kind; every one must be 0. What each means:

- ``workflow_repeated_effects``: a workflow job whose effect is recorded more than once,
  or a succeeded one without it (each job ran at most once per attempt that succeeded).
- ``workflow_order_violations``: a dependent's first ``claimed`` event dated before the
  ``finished``/``cancelled`` event of a dependency (for a ``finally`` job: of any other
  job of its workflow). Both are ``now()`` of their transactions, and a dependent can
  only be released by the commit of its last dependency's outcome, so its claim's
  transaction starts later.
- ``workflows_unsettled`` / ``workflow_unexpected_outcomes``: a workflow still running,
  or a job whose end is not the one its design implies (the diamond all succeeded; the
  compensation: a failed, comp succeeded, b cancelled, the finally job succeeded).
- ``batches_unsettled`` / ``batch_callback_violations``: a batch not ended, or a callback
  event fired a number of times other than expected (on_complete once; on_success once
  iff no member failed; on_death once iff one did), counted both by
  ``jobcore.batch_callbacks`` and by the callback jobs (their payload's tag and event),
  and a callback job that did not succeed.
- ``debounce_lost``: an accepted enqueue (answered 202) whose number is in no succeeded
  run's effect; ``debounce_duplicated``: a number in two runs' effects.
- ``debounce_overlapping_open``: two jobs of one key open at once, an open job being one
  created and not yet claimed (the next job of a key is created only after the previous
  was claimed).
- ``debounce_excess_runs``: runs of a key above the bound. The client sees each enqueue
  between its first send and its answer; two consecutive enqueues whose windows fit
  within one period (the later answer less than ``period`` after the earlier send) are
  certainly in one quiet period: they form a **burst**. A burst can end one run and open
  another only by the ``max_wait`` cap, so the bound is, per key, the sum over bursts of
  ``1 + floor(span / max_wait)``. An upper bound, honest under faults (slow answers make
  bursts shorter and the bound larger), never a guess.
- ``snooze_burned_attempts``: a job that snoozed whose ``attempts`` is not its
  ``claimed`` events less its ``snoozed`` and ``released`` events (an attempt that
  snoozed, or was released at a shutdown, is not spent).
- ``edit_violations``: an edited job (an ``edited`` event, or a 200 to its PATCH) whose
  effect says its attempt ran the old payload, or a 200 without the event; a job never
  edited (a 409: it was claimed first) whose effect says it ran edited. By the payload the
  handler ran, not by timestamps: a claim that waited for the edit's row lock began (its
  ``now()``) before the edit committed, and rightly runs the edited payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg

from jobcore.kernel.jobevents import with_job_row

# The job types (jobcore.testing.multistep_jobtypes, which only the run's processes
# import: importing it registers them) and the debounce the check's bound uses.
STEP = "chaos_step"
CALLBACK = "chaos_callback"
DEBOUNCED = "chaos_debounced"
DEBOUNCE_PERIOD = 1.0
DEBOUNCE_MAX_WAIT = 5.0
# How long a step that snoozes waits before its next run.
SNOOZE_SECONDS = 0.5
MULTISTEP_JOB_MODULE = "jobcore.testing.multistep_jobtypes"
TYPES = (STEP, CALLBACK, DEBOUNCED)
ACTIONS = ("diamond", "compensation", "batch", "burst", "edit")
DEBOUNCE_KEYS = 3
BURST_SIZE = (3, 5)
BURST_SPACING = 0.1  # seconds between the enqueues of a burst: well within a period
# Seconds ahead an edited job is due: most well after the edit, some about when it lands,
# so that an edit and a claim race for the row.
EDIT_AHEAD = (3.0, 3.0, 0.3)
TERMINAL = ("succeeded", "failed", "cancelled")
RETRY_PAUSE = 0.2

# The tables the check reads, copied as JSON when deleted (the pruner works all through
# the run): harness-only, in the run's own database.
ARCHIVED_TABLES = (
    "jobs",
    "job_events",
    "job_effects",
    "batches",
    "batch_callbacks",
    "workflows",
    "workflow_jobs",
    "workflow_edges",
)
ARCHIVE = (
    "CREATE TABLE IF NOT EXISTS public.multistep_pruned (tbl text NOT NULL, row jsonb NOT NULL)",
    """
    CREATE OR REPLACE FUNCTION public.multistep_archive() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO public.multistep_pruned (tbl, row) VALUES (TG_TABLE_NAME, to_jsonb(OLD));
        RETURN OLD;
    END $$
    """,
    *(
        f"CREATE OR REPLACE TRIGGER multistep_archive AFTER DELETE ON jobcore.{table} "
        "FOR EACH ROW EXECUTE FUNCTION public.multistep_archive()"
        for table in ARCHIVED_TABLES
    ),
)


def _every(table: str, where: str = "true") -> str:
    """Every row of a jobcore table, live or pruned during the run, as JSON (``r``)."""
    return (
        f"SELECT r FROM (SELECT to_jsonb(t) AS r FROM jobcore.{table} t "
        f"UNION ALL SELECT row FROM public.multistep_pruned WHERE tbl = '{table}') x "
        f"WHERE {where}"
    )


@dataclass
class Enqueue:
    """One enqueue of the debounced type, as the client saw it."""

    key: str
    n: int
    sent: float  # monotonic, first send
    answered: float | None = None  # monotonic, the 202
    job_id: str | None = None


def debounce_bound(enqueues: list[Enqueue], period: float, max_wait: float) -> tuple[int, int]:
    """(bursts, the most runs allowed) for one key's accepted enqueues (see the module's
    docstring)."""
    accepted = sorted((e for e in enqueues if e.answered is not None), key=lambda e: e.sent)
    if not accepted:
        return 0, 0
    bursts: list[list[Enqueue]] = [[accepted[0]]]
    for earlier, later in itertools.pairwise(accepted):
        assert later.answered is not None
        if later.answered - earlier.sent < period:
            bursts[-1].append(later)
        else:
            bursts.append([later])
    allowed = 0
    for burst in bursts:
        end = max(e.answered or e.sent for e in burst)
        allowed += 1 + math.floor((end - burst[0].sent) / max_wait)
    return len(bursts), allowed


@dataclass
class MultiStep:
    base_url: str
    api_key: str
    rng: random.Random
    give_up: float = 120.0
    timeout: float = 10.0
    sequence: int = 0
    workflows: Counter[str] = field(default_factory=Counter)  # kind -> created (answered)
    batches: dict[str, bool] = field(default_factory=dict)  # batch id -> has a failing member
    batch_tags: dict[str, str] = field(default_factory=dict)  # batch id -> its callbacks' tag
    enqueues: list[Enqueue] = field(default_factory=list)
    edits: dict[str, int] = field(default_factory=dict)  # job id -> the PATCH's status
    answers: Counter[str] = field(default_factory=Counter)
    _client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> MultiStep:
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=self.timeout,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _tag(self, kind: str) -> str:
        self.sequence += 1
        return f"{kind}-{self.sequence}"

    async def _request(
        self, method: str, path: str, ok: tuple[int, ...], **kwargs: Any
    ) -> httpx.Response | None:
        """Retry a 503 or a lost connection until ``give_up``; the answer (None: none)."""
        assert self._client is not None, "use `async with`"
        deadline = time.monotonic() + self.give_up
        while True:
            try:
                response = await self._client.request(method, path, **kwargs)
            except httpx.TransportError:
                self.answers["transport_error"] += 1
                response = None
            if response is not None:
                self.answers[f"{method} {response.status_code}"] += 1
                if response.status_code in ok or response.status_code != 503:
                    return response
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(RETRY_PAUSE)  # retry pacing while the API cannot answer

    async def diamond(self) -> None:
        tag = self._tag("diamond")

        def step(name: str, **extra: Any) -> dict[str, Any]:
            return {"name": name, "type": STEP, "payload": {"tag": f"{tag}.{name}", **extra}}

        jobs = [
            step("a"),
            {**step("b", snooze=True), "depends_on": ["a"]},
            {**step("c"), "depends_on": ["a"]},
            {**step("d"), "depends_on": ["b", "c"]},
            {**step("fin"), "finally": True},
        ]
        # A retry after a lost answer may make the workflow twice: the check reads every
        # workflow of the run by name, so both are checked.
        answer = await self._request("POST", "/workflows", (201,), json={"name": tag, "jobs": jobs})
        if answer is not None and answer.status_code == 201:
            self.workflows["diamond"] += 1

    async def compensation(self) -> None:
        tag = self._tag("compensation")

        def step(name: str, **extra: Any) -> dict[str, Any]:
            return {"name": name, "type": STEP, "payload": {"tag": f"{tag}.{name}", **extra}}

        jobs = [
            step("a", fail=True),
            {**step("b"), "depends_on": ["a"]},
            {**step("comp"), "depends_on": [{"name": "a", "policy": "on_failure"}]},
            {**step("fin"), "finally": True},
        ]
        answer = await self._request("POST", "/workflows", (201,), json={"name": tag, "jobs": jobs})
        if answer is not None and answer.status_code == 201:
            self.workflows["compensation"] += 1

    async def batch(self) -> None:
        tag = self._tag("batch")
        failing = len(self.batches) % 2 == 1
        batch_id = str(uuid.uuid4())
        members = [
            {"type": STEP, "payload": {"tag": f"{tag}.{i}", "fail": failing and i == 2}}
            for i in range(3)
        ]
        callback = {"type": CALLBACK, "payload": {"tag": tag}}
        body = {
            "id": batch_id,  # a repeated request is answered from the batch it made
            "jobs": members,
            "on_success": callback,
            "on_complete": callback,
            "on_death": callback,
        }
        answer = await self._request("POST", "/batches", (200, 201), json=body)
        if answer is not None and answer.status_code in (200, 201):
            self.batches[batch_id] = failing
            self.batch_tags[batch_id] = tag

    async def burst(self) -> None:
        key = f"key-{self.rng.randrange(DEBOUNCE_KEYS)}"
        for _ in range(self.rng.randint(*BURST_SIZE)):
            self.sequence += 1
            enqueue = Enqueue(key, self.sequence, time.monotonic())
            self.enqueues.append(enqueue)
            answer = await self._request(
                "POST",
                f"/jobs/{DEBOUNCED}",
                (202,),
                json={"key": key, "n": enqueue.n},
                headers={"Idempotency-Key": f"multistep-{uuid.uuid4()}"},
            )
            if answer is not None and answer.status_code == 202:
                enqueue.answered = time.monotonic()
                enqueue.job_id = str(answer.json()["job_id"])
            await asyncio.sleep(BURST_SPACING)  # the burst's pacing

    async def edit(self) -> None:
        tag = self._tag("edit")
        run_at = (datetime.now(UTC) + timedelta(seconds=self.rng.choice(EDIT_AHEAD))).isoformat()
        answer = await self._request(
            "POST",
            f"/jobs/{STEP}",
            (202,),
            json={"tag": tag},
            params={"run_at": run_at},
            headers={"Idempotency-Key": f"multistep-{uuid.uuid4()}"},
        )
        if answer is None or answer.status_code != 202:
            return
        job_id = str(answer.json()["job_id"])
        self.edits[job_id] = 0
        for _ in range(3):  # a 412 (changed since read) reads it again
            got = await self._request("GET", f"/jobs/{job_id}", (200,))
            if got is None or got.status_code != 200:
                return
            patched = await self._request(
                "PATCH",
                f"/jobs/{job_id}",
                (200, 409, 412),
                json={"payload": {"tag": tag, "edited": True}},
                headers={"If-Match": got.headers["etag"]},
            )
            if patched is None:
                return
            self.edits[job_id] = patched.status_code
            if patched.status_code != 412:
                return

    async def steady(self, rate: float, stop: asyncio.Event) -> int:
        """The actions in turn, ``rate`` a second, until ``stop``; how many were started."""
        started = 0
        begun = time.monotonic()
        while not stop.is_set():
            due = begun + started / rate
            if (wait := due - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)  # the load's pacing
                continue
            action = ACTIONS[started % len(ACTIONS)]
            started += 1
            await getattr(self, action)()
        return started


async def install_archive(database_url: str) -> None:
    """From now on keep what the pruner deletes of the tables the check reads."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for statement in ARCHIVE:
            await conn.execute(statement)


async def _rows(conn: psycopg.AsyncConnection[Any], sql: str, *params: Any) -> list[Any]:
    cur = await conn.execute(sql, params)
    return [row[0] for row in await cur.fetchall()]


def _at(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


@dataclass
class MultiStepReport:
    counts: dict[str, int]
    violations: dict[str, int]
    examples: list[str]

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            **{f"multistep_{k}": v for k, v in self.counts.items()},
            **{f"multistep_{k}": v for k, v in self.violations.items()},
            "multistep_violations": sum(self.violations.values()),
            "multistep_examples": self.examples[:10],
        }


EXPECTED = {
    "diamond": {"a": "succeeded", "b": "succeeded", "c": "succeeded", "d": "succeeded",
                "fin": "succeeded"},
    "compensation": {"a": "failed", "b": "cancelled", "comp": "succeeded", "fin": "succeeded"},
}  # fmt: skip


async def check_multistep(
    database_url: str, tenant: str, load: MultiStep
) -> tuple[MultiStepReport, list[str]]:
    """The report, and the ids of every job of the multi-step types (for the run's own
    count of accepted jobs)."""
    v: Counter[str] = Counter()
    examples: list[str] = []

    def bad(kind: str, what: str) -> None:
        v[kind] += 1
        examples.append(f"{kind}: {what}")

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        jobs = {
            r["id"]: r
            for r in await _rows(
                conn,
                _every("jobs", "r->>'tenant' = %s AND r->>'type' = ANY(%s)"),
                tenant,
                list(TYPES),
            )
        }
        ids = list(jobs)
        events: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in await _rows(conn, _every("job_events", "r->>'job_id' = ANY(%s)"), ids):
            events[e["job_id"]].append(e)
        # With the events the job rows keep (claims, first publish, end).
        for job_id in ids:
            events[job_id] = with_job_row(events[job_id], jobs[job_id])
        effects: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in await _rows(conn, _every("job_effects", "r->>'job_id' = ANY(%s)"), ids):
            effects[e["job_id"]].append(e)
        workflows = await _rows(
            conn,
            _every("workflows", "r->>'tenant' = %s AND r->>'name' ~ '^(diamond|compensation)-'"),
            tenant,
        )
        wf_ids = [w["id"] for w in workflows]
        steps = await _rows(conn, _every("workflow_jobs", "r->>'workflow_id' = ANY(%s)"), wf_ids)
        step_ids = [s["job_id"] for s in steps]
        edges = await _rows(conn, _every("workflow_edges", "r->>'downstream' = ANY(%s)"), step_ids)
        batch_ids = list(load.batches)
        batches = await _rows(conn, _every("batches", "r->>'id' = ANY(%s)"), batch_ids)
        callbacks = await _rows(
            conn, _every("batch_callbacks", "r->>'batch_id' = ANY(%s)"), batch_ids
        )

    def first(job_id: str, kind: str) -> datetime | None:
        times = [_at(e["at"]) for e in events[job_id] if e["kind"] == kind]
        return min(times) if times else None

    def ended(job_id: str) -> datetime | None:
        times = [_at(e["at"]) for e in events[job_id] if e["kind"] in ("finished", "cancelled")]
        return min(times) if times else None

    def status(job_id: str) -> str:
        return str(jobs[job_id]["status"]) if job_id in jobs else "missing"

    # Every job of the run's types: each effect at most once, and with its success.
    for job_id, job in jobs.items():
        n = len(effects[job_id])
        if n > 1 or (job["status"] == "succeeded") != (n == 1):
            bad("repeated_or_missing_effects", f"{job['type']} {job_id} {job['status']} {n}")

    # Workflows.
    by_workflow: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for s in steps:
        by_workflow[s["workflow_id"]][s["job_id"]] = s
    for w in workflows:
        kind = str(w["name"]).split("-", 1)[0]
        members = by_workflow[w["id"]]
        if w["status"] == "running" or any(status(j) not in TERMINAL for j in members):
            bad("workflows_unsettled", f"{w['name']} {w['status']}")
        expected = EXPECTED[kind]
        got = {s["name"]: status(j) for j, s in members.items()}
        if got != expected:
            bad("workflow_unexpected_outcomes", f"{w['name']} {got}")
        for j in members:
            if len(effects[j]) > 1:
                bad("workflow_repeated_effects", f"{w['name']} {j}")
        for j, s in members.items():
            claimed = first(j, "claimed")
            if claimed is None:
                continue
            ups = (
                [u for u in members if u != j]
                if s["is_finally"]
                else [e["upstream"] for e in edges if e["downstream"] == j]
            )
            for u in ups:
                done = ended(u)
                if done is None or claimed < done:
                    bad("workflow_order_violations", f"{w['name']} {s['name']} before {u}")

    # Batches.
    found = {b["id"]: b for b in batches}
    for batch_id in load.batches:
        b = found.get(batch_id)
        # Settled: every member ended, and on_complete (which says so) was recorded.
        if b is None or not (
            b["total"] == 3
            and b["succeeded"] + b["failed"] + b["cancelled"] == b["total"]
            and b["complete_fired"]
        ):
            bad("batches_unsettled", f"{batch_id} {b}")
    fired = Counter((c["batch_id"], c["event"]) for c in callbacks if c.get("job_id"))
    by_jobs: Counter[tuple[str, str]] = Counter()
    for job in jobs.values():
        if job["type"] == CALLBACK:
            payload = job["payload"]
            by_jobs[(payload["tag"], payload["batch"]["event"])] += 1
            if job["status"] != "succeeded":
                bad("batch_callback_violations", f"callback {job['id']} {job['status']}")
    for batch_id, failing in load.batches.items():
        want = {"success": int(not failing), "complete": 1, "death": int(failing)}
        for event, n in want.items():
            table = next(
                (c for (b, e), c in fired.items() if b == batch_id and e.endswith(event)), 0
            )
            counted = by_jobs[(load.batch_tags[batch_id], event)]
            if table != n or counted != n:
                bad("batch_callback_violations", f"{batch_id} {event}: {table}/{counted} != {n}")
    callbacks_fired = sum(by_jobs.values())

    # Debounce.
    ran: Counter[int] = Counter()
    runs_by_key: Counter[str] = Counter()
    opened: dict[str, list[tuple[datetime, datetime | None]]] = defaultdict(list)
    for job_id, job in jobs.items():
        if job["type"] != DEBOUNCED:
            continue
        key = job["payload"]["key"]
        opened[key].append((_at(job["created_at"]), first(job_id, "claimed")))
        for effect in effects[job_id]:
            runs_by_key[key] += 1
            ran.update(effect["detail"]["ns"])
    for e in load.enqueues:
        if e.answered is not None and ran[e.n] == 0:
            bad("debounce_lost", f"{e.key} n={e.n} job {e.job_id}")
    for n, c in ran.items():
        if c > 1:
            bad("debounce_duplicated", f"n={n} in {c} runs")
    for key, windows in opened.items():
        windows.sort(key=lambda window: window[0])
        for (_, claimed), (created, _) in itertools.pairwise(windows):
            if claimed is None or created < claimed:
                bad("debounce_overlapping_open", f"{key} job created {created} before a claim")
    bursts = 0
    allowed_runs = 0
    per_key: dict[str, list[Enqueue]] = defaultdict(list)
    for e in load.enqueues:
        per_key[e.key].append(e)
    for key, enqueues in per_key.items():
        key_bursts, allowed = debounce_bound(enqueues, DEBOUNCE_PERIOD, DEBOUNCE_MAX_WAIT)
        bursts += key_bursts
        allowed_runs += allowed
        if runs_by_key[key] > allowed:
            bad("debounce_excess_runs", f"{key}: {runs_by_key[key]} runs > {allowed}")

    # Snoozes: an attempt that snoozed is not spent.
    snoozed_jobs = 0
    for job_id, job in jobs.items():
        kinds = Counter(e["kind"] for e in events[job_id])
        if not kinds["snoozed"]:
            continue
        snoozed_jobs += 1
        spent = kinds["claimed"] - kinds["snoozed"] - kinds["released"]
        if job["attempts"] != spent:
            bad("snooze_burned_attempts", f"{job_id} attempts {job['attempts']} != {spent}")

    # Edits.
    edited = 0
    for job_id, answer in load.edits.items():
        edit_at = first(job_id, "edited")
        ran_edited = [bool(e["detail"].get("edited")) for e in effects[job_id]]
        if edit_at is not None or answer == 200:
            edited += 1
            if edit_at is None:
                bad("edit_violations", f"{job_id} answered 200 without an edited event")
            if False in ran_edited:
                bad("edit_violations", f"{job_id} edited, ran its old payload")
        elif True in ran_edited:
            bad("edit_violations", f"{job_id} never edited, ran edited")

    counts = {
        "workflows": len(workflows),
        "compensation_workflows": sum(
            1 for w in workflows if str(w["name"]).startswith("compensation-")
        ),
        "workflows_answered": sum(load.workflows.values()),
        "batches": len(batches),
        "callbacks_fired": callbacks_fired,
        "debounce_keys": len(per_key),
        "debounce_enqueues": sum(1 for e in load.enqueues if e.answered is not None),
        "debounce_runs": sum(runs_by_key.values()),
        "debounce_bursts": bursts,
        "debounce_runs_allowed": allowed_runs,
        "snoozed_jobs": snoozed_jobs,
        "edits_tried": len(load.edits),
        "edits_applied": edited,
        "edits_refused_running": sum(1 for a in load.edits.values() if a == 409),
        "jobs": len(jobs),
    }
    violation_kinds = (
        "repeated_or_missing_effects",
        "workflow_repeated_effects",
        "workflow_order_violations",
        "workflows_unsettled",
        "workflow_unexpected_outcomes",
        "batches_unsettled",
        "batch_callback_violations",
        "debounce_lost",
        "debounce_duplicated",
        "debounce_overlapping_open",
        "debounce_excess_runs",
        "snooze_burned_attempts",
        "edit_violations",
    )
    report = MultiStepReport(counts, {k: v[k] for k in violation_kinds}, examples)
    return report, ids
