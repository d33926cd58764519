"""The demo ledger (``ledger_accounts``, ``ledger_entries``): :class:`LedgerStore`, its
statement (:mod:`jobcore.sql.ledger`), run on a handler's own transaction."""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import Reader, fetch_one
from jobcore.sql.ledger import LEDGER_CREDIT, LedgerCreditParams

__all__ = ["LedgerCreditParams", "LedgerStore", "ledger_store"]


class LedgerStore:
    __slots__ = ()

    async def credit(self, on: Reader, params: LedgerCreditParams) -> DictRow | None:
        """Credit an account of the job's tenant: the entry and the account's new balance."""
        return await fetch_one(on, LEDGER_CREDIT(params))


ledger_store = LedgerStore()
