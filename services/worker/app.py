"""The worker's composition root: one database pool, the consumer, the maintainer (every
maintenance service under one leader lease: jobcore.maintenance), dead-letter notes, cancel
listener and health server, wired from settings. ``jobcore worker`` and the tests both
build it here.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable
from typing import Any

from jobcore.amqp.deliveries import split_prefetch
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.schema_version import SchemaWatch, check_schema_on
from jobcore.execution.executor import JobExecutor
from jobcore.execution.job_type_records import recording_first_check
from jobcore.execution.preflight import check_job_types, held_connections
from jobcore.execution.registry import Registry, load_job_modules
from jobcore.kernel.settings import Settings
from jobcore.kernel.startstop import Service, run_until_signalled
from jobcore.maintenance import Maintainer, Scheduler, services_from_settings
from jobcore.maintenance.periodic import load_schedules
from jobcore.telemetry.health import HealthServer
from jobcore.telemetry.otlp_metrics import metrics_pusher
from jobcore.usecases.enqueue.scheduled import enqueue_schedule_job
from services.worker.batching import Batcher
from services.worker.cancel import CancelListener
from services.worker.connections import HeldConnections
from services.worker.consumer import RELEASE_TIMEOUT, Consumer
from services.worker.deadletter_notes import DeadLetterNotes
from services.worker.metrics import SchedulerMetrics, WorkerMetrics
from services.worker.webhook_sender import WebhookDeliverer


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """Everything one worker process runs. Services start in order and stop in reverse."""

    def __init__(
        self,
        settings: Settings,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int | None = None,
        registry: Registry | None = None,
        health: bool = True,
        webhooks: bool = True,
    ) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else load_job_modules(settings.job_modules)
        self.queues = sorted(set(queues) if queues else self.registry.queues())
        self.worker_id = new_worker_id()
        self.metrics = WorkerMetrics()
        # Each pool checks the schema on its first connection (a worker starts while the
        # database is down); a refusal stops the worker with it (serve). This one then
        # records the registry's job types, for enqueues from SQL (jobcore.enqueue).
        self.db = Database(
            settings,
            name="jobcore-worker",
            first_check=recording_first_check(
                check_schema_on, self.registry, settings, registered_by=self.worker_id
            ),
        )
        # Start-up checks: settings that would deadlock stop the worker here, in one line.
        check_job_types(self.registry, settings)
        concurrency = concurrency or settings.worker_concurrency
        split_prefetch(settings.job_prefetch(concurrency), self.queues)
        self.dead_letter_notes = DeadLetterNotes(settings, self.db, self.metrics)
        # Maintenance: the reaper, rescuer, pruner, sweeper, gate releaser and (with
        # schedules declared) scheduler, all under one leader lease per database, on one
        # pool connection taken in turn. Their configs are checked here: a bad value stops
        # the worker with one line.
        schedules = load_schedules(settings.schedules, self.registry)
        self.maintainer = Maintainer(
            self.db,
            services_from_settings(
                settings,
                registry=self.registry,
                metrics=self.metrics,
                schedules=schedules,
                schedule_metrics=SchedulerMetrics(self.metrics.registry) if schedules else None,
                enqueue_tick=enqueue_schedule_job,
            ),
            owner=self.worker_id,
        )
        # Whatever else takes pool connections at once, one each; claims and outcomes keep
        # the rest (held, see services.worker.connections).
        pool_users = {
            "cancel listener": 1,
            "maintainer": 1,
            "dead-letter notes": 1,
            **({"webhook deliverer": 1} if webhooks else {}),
        }
        self.connections = HeldConnections(self.db, held_connections(settings, pool_users))
        topology = Topology.from_settings(settings)
        # Handlers' own transactions (ctx.transaction): at most one per running handler, on
        # a pool of their own that opens connections only when handlers use it.
        self.handler_db = Database(
            settings,
            min_size=0,
            max_size=concurrency,
            name="jobcore-worker-handlers",
            first_check=check_schema_on,
        )
        self.schema_watch = SchemaWatch(self.db, self.handler_db)
        # The execution core (claim, payload, handler, outcome), on the held connections;
        # successes that queue up behind a commit share the next one.
        self.executor = JobExecutor(
            settings,
            self.connections,
            topology,
            self.metrics,
            worker_id=self.worker_id,
            transactions=self.handler_db,
            success_commits=Batcher,
        )
        self.metrics.running_handlers.set_function(lambda: len(self.executor.running))
        self.consumer = Consumer(
            settings,
            self.connections,
            self.executor,
            registry=self.registry,
            queues=self.queues,
            concurrency=concurrency,
            worker_id=self.worker_id,
            metrics=self.metrics,
        )
        self.cancels = CancelListener(
            self.db,
            self.executor.request_cancel,
            running=self.executor.cancellable,
            on_outbox=self.consumer.outbox_notified if settings.direct_pickup else None,
        )
        # Completion webhooks: the webhooks queue, on the pool (short checkouts only).
        self.webhooks = WebhookDeliverer(settings, self.db, self.metrics) if webhooks else None
        self.health: HealthServer | None = None
        # Metrics over OTLP too when the environment asks (jobcore.telemetry.otlp_metrics).
        self.metrics_export = metrics_pusher("jobcore-worker", self.render_metrics)
        if health:
            self.health = HealthServer(
                "worker",
                settings.health_host,
                settings.worker_health_port,
                self.probe,
                self.render_metrics,
            )

    @property
    def scheduler(self) -> Scheduler | None:
        found = [s for s in self.maintainer.services if isinstance(s, Scheduler)]
        return found[0] if found else None

    @property
    def services(self) -> list[Service]:
        # Stopped in reverse: the consumer first (it may wait out the grace period), while
        # the cancel listener and health server keep working until it is done.
        head: list[Service] = [self.health] if self.health else []
        if self.metrics_export is not None:
            head.append(self.metrics_export)
        hooks: list[Service] = [self.webhooks] if self.webhooks else []
        return [
            self.schema_watch,
            *head,
            self.cancels,
            self.maintainer,
            self.dead_letter_notes,
            *hooks,
            self.consumer,
        ]

    @property
    def stop_grace(self) -> float:
        """How long stopping may take: the handlers' grace plus giving back leases."""
        return self.settings.shutdown_grace + RELEASE_TIMEOUT + 1.0

    def trouble(self) -> list[str]:
        """Why a consumer of this worker cannot make progress now (docs/operations.md,
        "Readiness"); empty while both can."""
        found = []
        if reason := self.consumer.readiness.trouble():
            found.append(f"jobs: {reason}")
        if self.webhooks is not None and (reason := self.webhooks.readiness.trouble()):
            found.append(f"webhooks: {reason}")
        return found

    async def probe(self) -> tuple[bool, dict[str, Any]]:
        trouble = self.trouble()
        leading = self.maintainer.is_leader
        ready = self.consumer.consuming and self.consumer.broker_connected and not trouble
        return ready, {
            "worker_id": self.worker_id,
            "queues": self.queues,
            "broker_connected": self.consumer.broker_connected,
            "consuming": self.consumer.consuming,
            "trouble": trouble,
            "running_handlers": len(self.executor.running),
            "consumer_priority": self.consumer.priority,
            # False while every handler slot runs a job (services.worker.intake).
            "taking_deliveries": self.consumer.broker.consuming,
            # One leader runs every maintenance service; the per-service keys say the same
            # (kept for dashboards that read them).
            "maintenance_leader": leading,
            "reaper_leader": leading,
            "rescuer_leader": leading,
            "pruner_leader": leading,
            "sweeper_leader": leading,
            # None: no schedule is declared, so this worker runs no scheduler.
            "scheduler_leader": leading if self.scheduler is not None else None,
            "dead_letter_notes_consuming": self.dead_letter_notes.consuming,
            "cancel_listener": self.cancels.listening,
            "cancel_polling": self.cancels.polling,
            "webhooks_consuming": self.webhooks.consuming if self.webhooks else None,
            "counters": self.metrics.snapshot(),
        }

    async def render_metrics(self) -> str:
        self.metrics.stalled.set(1 if self.trouble() else 0)
        return self.metrics.render()

    async def start(self) -> None:
        await self.db.open()
        await self.handler_db.open()
        for service in self.services:
            await service.start()

    async def stop(self) -> None:
        try:
            for service in reversed(self.services):
                await service.stop(self.stop_grace)
        finally:
            await self.executor.close()
            await self.connections.close()
            await self.handler_db.close()
            await self.db.close()

    async def serve(self) -> int:
        """Run until SIGTERM/SIGINT; return the exit code."""
        await self.db.open()
        await self.handler_db.open()
        try:
            code = await run_until_signalled(self.services, self.stop_grace)
        finally:
            await self.executor.close()
            await self.connections.close()
            await self.handler_db.close()
            await self.db.close()
        refusal = self.schema_watch.refusal()
        if refusal is not None:
            raise refusal  # the command's one line (a schema it must not run against)
        return code
