"""Caps on long-polls (``GET /jobs/{id}?wait=``) parked at once in this API process: one
for all tenants together (``JOBCORE_API_MAX_LONG_POLLS``), one per tenant (its
``max_long_polls`` quota, default ``JOBCORE_QUOTA_MAX_LONG_POLLS``).

A parked long-poll holds no database connection but does hold a socket, a task and a
slot in the listener's fan-out; without a cap one tenant's thousands of waits would use
up what every tenant's share. Over a cap the request is answered at once with ``429``
and ``Retry-After`` (never parked): a client that loops on ``?wait=`` backs off instead of
turning into a busy poll. The counts are this process's: a tenant may hold up to its
quota on each API process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from jobcore.kernel.errors import TooManyLongPolls
from jobcore.kernel.quotas import Refusal, under_cap

# Seconds a refused long-poll is told to wait: parked waits end within the longest wait
# (60 s) and most far sooner; a retry costs one authenticated read.
RETRY_AFTER_SECONDS = 1


class LongPollSlots:
    def __init__(self, process_cap: int) -> None:
        self.process_cap = process_cap
        self.total = 0
        self._by_tenant: dict[str, int] = {}

    def held(self, tenant: str) -> int:
        return self._by_tenant.get(tenant, 0)

    @contextlib.contextmanager
    def hold(self, tenant: str, tenant_cap: int) -> Iterator[None]:
        """A slot for one long-poll of ``tenant`` while the block runs, or
        :class:`TooManyLongPolls` at once. (One event loop: nothing runs between the
        check and the count.)"""
        if not under_cap(self.total, self.process_cap):
            raise TooManyLongPolls(
                f"this server holds {self.process_cap} long-polls, its limit; "
                "poll without wait or retry later",
                reason=Refusal.LONG_POLLS_PROCESS,
                retry_after=RETRY_AFTER_SECONDS,
                limit=self.process_cap,
            )
        if not under_cap(self.held(tenant), tenant_cap):
            raise TooManyLongPolls(
                f"the tenant has {tenant_cap} long-polls waiting on this server, its limit; "
                "poll without wait or retry later",
                reason=Refusal.LONG_POLLS_TENANT,
                retry_after=RETRY_AFTER_SECONDS,
                limit=tenant_cap,
            )
        self.total += 1
        self._by_tenant[tenant] = self.held(tenant) + 1
        try:
            yield
        finally:
            self.total -= 1
            left = self._by_tenant[tenant] - 1
            if left:
                self._by_tenant[tenant] = left
            else:
                del self._by_tenant[tenant]
