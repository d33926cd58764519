"""Statements that change ``ledger_entries`` and ``ledger_accounts``: the tables of the
example job type ``credit_account`` (:mod:`jobcore.examples.jobtypes`), run on its handler's
transaction (``ctx.transaction()``), which commits them with the job's success."""

from __future__ import annotations

import uuid
from typing import TypedDict

from jobcore.database.sql import Query


class LedgerCreditParams(TypedDict):
    account: str
    amount_cents: int
    attempt: int
    job_id: uuid.UUID


# One statement: the entry (in the job's tenant, read from the job row) and the account's
# new balance. The account row is locked until the handler's transaction ends, so credits
# to one account queue up rather than lose an update.
LEDGER_CREDIT = Query[LedgerCreditParams](
    "ledger_credit",
    "Add a credit entry for a job's tenant's account and raise the account's balance by it.",
    """
    WITH entry AS (
        INSERT INTO jobcore.ledger_entries (tenant, account, amount_cents, job_id, attempt)
        SELECT jobs.tenant, %(account)s, %(amount_cents)s, jobs.id, %(attempt)s
        FROM jobcore.jobs WHERE jobs.id = %(job_id)s
        RETURNING id, tenant, account, amount_cents
    ), account AS (
        INSERT INTO jobcore.ledger_accounts AS a (tenant, account, balance_cents)
        SELECT tenant, account, amount_cents FROM entry
        ON CONFLICT (tenant, account) DO UPDATE
        SET balance_cents = a.balance_cents + excluded.balance_cents, updated_at = now()
        RETURNING balance_cents
    )
    SELECT entry.id AS entry_id, account.balance_cents FROM entry, account
    """,
)
