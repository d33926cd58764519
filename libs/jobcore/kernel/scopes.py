"""What an API key may do: the scopes, and those a key gets when none are named.

A leaf module (it imports nothing of ours): the schema, the key lookup, the API's routes
and the command line all name scopes.
"""

from __future__ import annotations

from enum import StrEnum


class Scope(StrEnum):
    ENQUEUE = "enqueue"
    READ = "read"
    CANCEL = "cancel"
    # Operator routes (/admin/...): every tenant's jobs, the outbox, the keys.
    ADMIN = "admin"


# A tenant's client: everything on its own jobs, nothing across tenants.
DEFAULT_SCOPES: tuple[Scope, ...] = (Scope.ENQUEUE, Scope.READ, Scope.CANCEL)
