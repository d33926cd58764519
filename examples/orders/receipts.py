"""The send_receipt job type, for a jobcore worker (JOBCORE_JOB_MODULES=...,receipts)."""

from pydantic import BaseModel, ConfigDict

from jobcore.execution.registry import JobContext, job


class ReceiptPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order_id: int


@job("send_receipt", payload=ReceiptPayload, queue="default", max_attempts=5, lease=30)
async def send_receipt(ctx: JobContext[ReceiptPayload]) -> None:
    # The receipt is recorded in the attempt's own transaction, which commits with the
    # job's success: a message delivered twice, or an attempt retried, records it once.
    async with ctx.transaction() as tx:
        await tx.connection.execute(
            "INSERT INTO receipts (order_id, job_id) VALUES (%s, %s)",
            (ctx.payload.order_id, str(ctx.job_id)),
        )
        tx.set_result({"order_id": ctx.payload.order_id})
