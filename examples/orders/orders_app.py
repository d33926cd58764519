"""The shop: ``POST /orders`` writes an order and enqueues its ``send_receipt`` job in one
transaction, so the receipt is sent exactly when the order exists.

Run it beside a jobcore relay and worker (the worker with ``receipts`` in
``JOBCORE_JOB_MODULES``), on the same database:
``uvicorn orders_app:app``. It reads the ``JOBCORE_*`` environment as they do.
"""

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated

import receipts  # noqa: F401 (registers the send_receipt job type)
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from tables import Base, Order, Receipt

import jobcore
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings

# The tenant the shop's jobs belong to: code inside the app names it, no API key needed.
TENANT = os.environ.get("ORDERS_TENANT", "shop")

settings = Settings()  # the JOBCORE_* environment, as the relay and the worker read it
# The same database, through SQLAlchemy on psycopg 3 (what enqueue_in takes).
engine = create_async_engine(
    "postgresql+psycopg://" + settings.database_url.split("://", 1)[1],
    connect_args={"application_name": "orders-example"},
)
Sessions = async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    yield
    await engine.dispose()


app = FastAPI(title="orders", lifespan=lifespan)


async def session() -> AsyncIterator[AsyncSession]:
    # Rolled back unless the route commits: an error anywhere undoes the order and its job.
    async with Sessions() as s:
        yield s


SessionDep = Annotated[AsyncSession, Depends(session)]


class NewOrder(BaseModel):
    email: str = Field(min_length=3, max_length=254)
    total_cents: int = Field(gt=0, le=10_000_000)
    card: str = Field(min_length=4, max_length=19)


class Problem(Exception):
    """An answer as RFC 9457 problem JSON."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail


@app.exception_handler(Problem)
async def problem(_: Request, exc: Problem) -> JSONResponse:
    body = {"type": "about:blank", "title": exc.title, "status": exc.status, "detail": exc.detail}
    return JSONResponse(body, status_code=exc.status, media_type="application/problem+json")


@app.post("/orders", status_code=201)
async def place_order(new: NewOrder, session: SessionDep) -> dict[str, object]:
    order = Order(email=new.email, total_cents=new.total_cents)
    session.add(order)
    await session.flush()  # the order's id, in the open transaction
    job = await jobcore.enqueue_in(
        session,
        default_registry,
        "send_receipt",
        {"order_id": order.id},
        tenant=TENANT,
        settings=settings,
        idempotency_key=f"receipt-{order.id}",
    )
    await _hold_before_commit()
    if new.card.endswith("0002"):  # the card is declined: the order and its job go
        raise Problem(402, "Payment declined", f"card ending {new.card[-4:]} was declined")
    await session.commit()  # the order and its job, together
    return {"order_id": order.id, "job_id": str(job.job_id)}


@app.get("/orders/{order_id}")
async def get_order(order_id: int, session: SessionDep) -> dict[str, object]:
    order = await session.get(Order, order_id)
    if order is None:
        raise Problem(404, "Not found", f"no order {order_id}")
    sent = await session.scalar(
        select(func.count()).select_from(Receipt).where(Receipt.order_id == order_id)
    )
    return {"order_id": order.id, "receipts_sent": sent}


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _hold_before_commit() -> None:
    """Tests only: with ORDERS_HOLD_BEFORE_COMMIT set to a file name, create that file
    once the order and its job are written, then wait (the test kills the process here,
    before the commit)."""
    path = os.environ.get("ORDERS_HOLD_BEFORE_COMMIT")
    if not path:
        return
    await asyncio.to_thread(Path(path).write_text, str(os.getpid()))
    for _ in range(3000):  # at most five minutes; the test kills the process first
        await asyncio.sleep(0.1)
