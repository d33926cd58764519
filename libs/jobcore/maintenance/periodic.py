"""Periodic jobs: what a schedule is, where it is declared, and when it ticks.

A schedule enqueues one job of a registered job type at every tick of a cron expression
(5 fields, or 6 with seconds first: ``*/10 * * * * *``), read in an IANA time zone with
Debian cron's rules across DST changes (:mod:`cronsim`). It is declared either in the
``JOBCORE_SCHEDULES`` setting (JSON, keyed by name) or next to its job type, in a module of
``JOBCORE_JOB_MODULES``, with :func:`periodic`. :func:`load_schedules` checks every
declaration against the registry at start-up; anything wrong is one
:class:`ScheduleConfigError` naming the schedule and the field.

This module is pure: tick arithmetic and validation, no database. Enqueueing the due ticks
exactly once is :mod:`jobcore.maintenance.schedule_ticks`; the worker's scheduler runs it under a
lease.

- **Missed ticks**: the ticks due since the last one enqueued, other than the latest, were
  missed (the workers were down, the clock jumped forward). ``skip`` enqueues the latest
  due tick only; ``catch_up:N`` also enqueues up to N missed ones, the most recent first
  kept, oldest enqueued first.
- **Jitter**: a job's run is delayed by a pseudo-random offset in ``[0, jitter)`` seconds,
  fixed for the tick (derived from the schedule's name and the tick), so a retried enqueue
  of the same tick is the same request.
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobcore.access.apikeys import InvalidTenantName, check_tenant_name
from jobcore.execution.registry import MAX_ATTEMPTS_LIMIT, InvalidPayloadError, JobType, Registry
from jobcore.kernel.errors import ConfigurationError, InvalidPayload, JobcoreError, UnknownJobType

NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,62}$"
_NAME_RE = re.compile(NAME_PATTERN)
# Jobs a schedule enqueues belong to this tenant unless its declaration names another:
# a schedule acts for the deployment, not for a caller (its quotas apply as to any tenant).
DEFAULT_TENANT = "scheduler"
MAX_CATCH_UP = 1000
MAX_JITTER = 86_400.0
SKIP = "skip"
CATCH_UP = "catch_up"
_MISSED_RE = re.compile(rf"^(?:{SKIP}|{CATCH_UP}:(?P<n>[0-9]{{1,4}}))$")
# Past this gap since the last tick, counting ticks forward from it could take a step per
# second for a week (a seconds cron after an outage): the last ones are found backwards
# from now instead, and counted forwards from a margin before them, where the forward
# rules (Debian's, for DST) decide. DST changes move the clock by less than three hours.
_LONG_GAP = timedelta(hours=6)
_DST_MARGIN = timedelta(hours=3)


class ScheduleConfigError(ConfigurationError):
    """A schedule's declaration is invalid."""


class ScheduleNotFound(JobcoreError):
    """No schedule is declared under that name."""


class ScheduleSpec(BaseModel):
    """One declaration, as written in ``JOBCORE_SCHEDULES`` or given to :func:`periodic`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_type: str = Field(min_length=1, max_length=63)
    cron: str = Field(min_length=1, max_length=200)
    timezone: str = Field(default="UTC", min_length=1, max_length=64)
    jitter: float = Field(default=0.0, ge=0, le=MAX_JITTER)
    missed: str = Field(default=SKIP, max_length=20)
    payload: dict[str, Any] = Field(default_factory=dict)
    tenant: str = DEFAULT_TENANT
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS_LIMIT)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A checked declaration: its job type registered, its payload valid, its cron parsed."""

    name: str
    job_type: JobType[Any]
    cron: str
    zone: tzinfo
    timezone: str
    jitter: float
    # Missed ticks enqueued besides the latest due one (0: skip them).
    catch_up: int
    payload: BaseModel
    tenant: str
    max_attempts: int | None

    @property
    def missed(self) -> str:
        return SKIP if self.catch_up == 0 else f"{CATCH_UP}:{self.catch_up}"

    @property
    def entity_id(self) -> str:
        """The jobs' ``entity_id``: `GET /jobs?entity_id=schedule:NAME` lists them."""
        return f"schedule:{self.name}"

    def ticks_after(self, after: datetime) -> Iterator[datetime]:
        """The ticks later than ``after``, in UTC, in order."""
        for tick in CronSim(self.cron, after.astimezone(self.zone)):
            tick = tick.astimezone(UTC)
            # Debian's rules count in wall time: near a DST change the first one may not be
            # later as an instant.
            if tick > after:
                yield tick

    def next_tick(self, after: datetime) -> datetime | None:
        """The first tick later than ``after`` (None: none within 50 years)."""
        return next(self.ticks_after(after), None)

    def latest_ticks(self, now: datetime, count: int) -> list[datetime]:
        """Up to ``count`` ticks at or before ``now``, the latest first (backwards)."""
        start = now.replace(microsecond=0) + timedelta(seconds=1)
        found: list[datetime] = []
        for tick in CronSim(self.cron, start.astimezone(self.zone), reverse=True):
            found.append(tick.astimezone(UTC))
            if len(found) >= count:
                break
        return found

    def jitter_offset(self, tick: datetime) -> float:
        """Seconds a tick's job waits, in ``[0, jitter)``: the same for the same tick, on
        every worker and after a restart."""
        if self.jitter == 0:
            return 0.0
        digest = hashlib.sha256(f"{self.name}|{tick.astimezone(UTC).isoformat()}".encode())
        fraction = int.from_bytes(digest.digest()[:8], "big") / 2**64
        return fraction * self.jitter

    def run_at(self, tick: datetime) -> datetime | None:
        """When a tick's job may start (None: at once)."""
        offset = self.jitter_offset(tick)
        return tick + timedelta(seconds=offset) if offset else None

    def due(self, last: datetime, now: datetime) -> DueTicks:
        """The ticks in ``(last, now]`` to enqueue, by the missed-tick policy.

        A clock that stepped back (``now`` before ``last``) finds nothing due until it
        passes ``last`` again: a tick already made is never made twice.
        """
        if now <= last:
            return DueTicks((), None, 0)
        keep = self.catch_up + 1
        start = last
        if now - last > _LONG_GAP:
            back = self.latest_ticks(now, keep)
            if len(back) == keep:
                start = max(last, back[-1] - _DST_MARGIN)
        kept: deque[datetime] = deque(maxlen=keep)
        seen = 0
        for tick in self.ticks_after(start):
            if tick > now:
                break
            kept.append(tick)
            seen += 1
        skipped = seen - len(kept)
        if start > last:
            before = self.next_tick(last)
            if before is not None and before <= start:
                skipped += 1  # at least: the ticks in (last, start] were not counted
        return DueTicks(tuple(kept), kept[-1] if kept else None, skipped)


@dataclass(frozen=True, slots=True)
class DueTicks:
    """What a scheduler round does for one schedule."""

    # Oldest first; the last one is ``latest``.
    enqueue: tuple[datetime, ...]
    latest: datetime | None
    # Missed ticks left out by the policy (a lower bound after a long gap).
    skipped: int


def tick_key(name: str, tick: datetime) -> str:
    """The idempotency key of a tick's job: one job per schedule and tick, whoever
    enqueues it and however often."""
    return f"schedule:{name}:{tick.astimezone(UTC).isoformat()}"


# --- declarations ----------------------------------------------------------------------

# Declared in code by job modules (periodic()), by name.
_declared: dict[str, ScheduleSpec] = {}


def periodic(
    name: str,
    *,
    job_type: str,
    cron: str,
    timezone: str = "UTC",
    jitter: float = 0.0,
    missed: str = SKIP,
    payload: Mapping[str, Any] | None = None,
    tenant: str = DEFAULT_TENANT,
    max_attempts: int | None = None,
) -> None:
    """Declare a schedule in a job module: ``periodic("nightly_export",
    job_type="export_csv", cron="0 3 * * *", timezone="Europe/Paris", jitter=300)``.

    Checked against the registry when the worker (or a command) loads the schedules, so
    the job type may be registered after this call."""
    source = f"periodic({name!r})"
    _check_name(source, name)
    spec = _spec(
        source,
        {
            "job_type": job_type,
            "cron": cron,
            "timezone": timezone,
            "jitter": jitter,
            "missed": missed,
            "payload": dict(payload or {}),
            "tenant": tenant,
            "max_attempts": max_attempts,
        },
    )
    existing = _declared.get(name)
    if existing is not None and existing != spec:
        raise ScheduleConfigError(f"{source}: a different schedule is declared under that name")
    _declared[name] = spec


def declared_in_code() -> dict[str, ScheduleSpec]:
    return dict(_declared)


def load_schedules(
    declarations: Mapping[str, Mapping[str, Any]],
    registry: Registry,
    *,
    in_code: Mapping[str, ScheduleSpec] | None = None,
) -> tuple[Schedule, ...]:
    """Every schedule, checked: the ``JOBCORE_SCHEDULES`` declarations and those made in
    code (default: by :func:`periodic`), sorted by name. Raises
    :class:`ScheduleConfigError` for the first one that is wrong."""
    code = declared_in_code() if in_code is None else dict(in_code)
    schedules: list[Schedule] = []
    for name, raw in declarations.items():
        source = f"JOBCORE_SCHEDULES: schedule {name!r}"
        if name in code:
            raise ScheduleConfigError(f"{source} is also declared in code (periodic)")
        _check_name(source, name)
        if not isinstance(raw, Mapping):
            raise ScheduleConfigError(f"{source}: must be a JSON object")
        schedules.append(_build(source, name, _spec(source, raw), registry))
    for name, spec in code.items():
        schedules.append(_build(f"periodic({name!r})", name, spec, registry))
    return tuple(sorted(schedules, key=lambda s: s.name))


def find(schedules: tuple[Schedule, ...], name: str) -> Schedule:
    for schedule in schedules:
        if schedule.name == name:
            return schedule
    raise ScheduleNotFound(f"no schedule named {name!r} is declared")


def _check_name(source: str, name: object) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ScheduleConfigError(
            f"{source}: a schedule name is 1-63 lower-case letters, digits, '_', '.' or '-', "
            "starting with a letter"
        )


def _spec(source: str, raw: Mapping[str, Any]) -> ScheduleSpec:
    try:
        return ScheduleSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "declaration"
        raise ScheduleConfigError(f"{source}: {where}: {first['msg']}") from None


def _zone(source: str, name: str) -> tzinfo:
    if name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleConfigError(
            f"{source}: timezone: unknown time zone {name!r} (use an IANA name such as "
            "'Europe/Paris' or 'UTC')"
        ) from None


def _build(source: str, name: str, spec: ScheduleSpec, registry: Registry) -> Schedule:
    missed = _MISSED_RE.match(spec.missed)
    catch_up = int(missed["n"]) if missed is not None and missed["n"] is not None else 0
    if missed is None or (missed["n"] is not None and not 1 <= catch_up <= MAX_CATCH_UP):
        raise ScheduleConfigError(
            f"{source}: missed: {spec.missed!r} is not '{SKIP}' or '{CATCH_UP}:N' "
            f"(N from 1 to {MAX_CATCH_UP})"
        )
    try:
        job_type = registry.get(spec.job_type)
    except UnknownJobType:
        raise ScheduleConfigError(
            f"{source}: job_type: {spec.job_type!r} is not a registered job type "
            "(JOBCORE_JOB_MODULES)"
        ) from None
    try:
        payload = job_type.validate_payload(spec.payload)
    except InvalidPayloadError as exc:
        first = exc.errors[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ScheduleConfigError(
            f"{source}: payload{'.' + where if where else ''}: {first['msg']}"
        ) from None
    except InvalidPayload as exc:  # pragma: no cover - validate_payload raises the subclass
        raise ScheduleConfigError(f"{source}: payload: {exc}") from None
    if b"\\u0000" in orjson.dumps(payload.model_dump(mode="json")):
        # PostgreSQL's jsonb refuses it: every tick would fail at the insert.
        raise ScheduleConfigError(f"{source}: payload: cannot contain NUL characters")
    try:
        check_tenant_name(spec.tenant)
    except InvalidTenantName:
        raise ScheduleConfigError(f"{source}: tenant: {InvalidTenantName.__doc__}") from None
    zone = _zone(source, spec.timezone)
    schedule = Schedule(
        name=name,
        job_type=job_type,
        cron=spec.cron,
        zone=zone,
        timezone=spec.timezone,
        jitter=spec.jitter,
        catch_up=catch_up,
        payload=payload,
        tenant=spec.tenant,
        max_attempts=spec.max_attempts,
    )
    try:
        upcoming = schedule.next_tick(datetime.now(UTC))
    except CronSimError as exc:
        raise ScheduleConfigError(
            f"{source}: cron: {spec.cron!r} is not a cron expression ({exc}; 5 fields, or 6 "
            "with seconds first)"
        ) from None
    if upcoming is None:
        raise ScheduleConfigError(f"{source}: cron: {spec.cron!r} never fires")
    return schedule
