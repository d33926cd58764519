"""jobcore: user-visible background jobs for HTTP APIs.

PostgreSQL holds the product state (jobs, outbox, inbox, leases); RabbitMQ is only the
transport. This package is the library that the four services (the API, the relay, the
worker and the web console, under ``services/``) and the ``jobcore`` commands share. Its
packages, the bottom layer first (pyproject.toml has an import contract per layer):

- :mod:`.kernel`: errors, job states, the settings, the wire envelope, the pure rules
  (retry backoff, quotas, gates, priorities, scopes) and the start/stop contract;
- :mod:`.telemetry`: traces (and the trace context carried through the outbox), metrics
  over OTLP, logs, the health endpoints; :mod:`.storage`: the result store;
- :mod:`.amqp`: RabbitMQ; :mod:`.database`: the PostgreSQL gateway, the schema and its
  migrations, the named statements and the stores that run them;
- :mod:`.execution`: what a job type is, and one attempt of a job from its payload to its
  outcome; :mod:`.access`: API keys and the audit log;
- :mod:`.maintenance`: the periodic services, under one leader per database;
- :mod:`.usecases`: what clients and operators can do, enqueueing among them;
- :mod:`.testing`: the testing kit; :mod:`.examples`: the job types jobcore ships;
  :mod:`.client`: the Python client of the HTTP API.

``jobcore.enqueue_in`` and ``jobcore.enqueue_in_sync`` enqueue in the application's own
transaction (:mod:`jobcore.usecases.enqueue.in_transaction`); they are imported when first
used, so that importing any one module of the package does not import the enqueue path
with it. The previous release's paths of the modules applications import
(``jobcore.registry``, ``jobcore.gates``, ...) still import, as the same modules
(:mod:`jobcore.kernel.old_paths`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobcore.kernel import old_paths

if TYPE_CHECKING:
    from jobcore.usecases.enqueue.in_transaction import enqueue_in, enqueue_in_sync

old_paths.install()

__version__ = "0.1.0"
__all__ = ["enqueue_in", "enqueue_in_sync"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from jobcore.usecases.enqueue import in_transaction

        return getattr(in_transaction, name)
    raise AttributeError(f"module 'jobcore' has no attribute {name!r}")
