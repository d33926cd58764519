"""jobcore: user-visible background jobs for HTTP APIs.

PostgreSQL holds the product state (jobs, outbox, inbox, leases); RabbitMQ is only the
transport. This package owns everything the three services share.

``jobcore.enqueue_in`` and ``jobcore.enqueue_in_sync`` enqueue in the application's own
transaction (:mod:`jobcore.usecases.enqueue.in_transaction`); they are imported when first used, so
that importing any one module of the package does not import the enqueue path with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobcore.usecases.enqueue.in_transaction import enqueue_in, enqueue_in_sync

__version__ = "0.1.0"
__all__ = ["enqueue_in", "enqueue_in_sync"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from jobcore.usecases.enqueue import in_transaction

        return getattr(in_transaction, name)
    raise AttributeError(f"module 'jobcore' has no attribute {name!r}")
