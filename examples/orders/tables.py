"""The shop's own tables, in the same database as jobcore's: orders, and the receipts
the send_receipt job records."""

from datetime import datetime

from sqlalchemy import ForeignKey, String, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(254))
    total_cents: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class Receipt(Base):
    """One row per receipt sent: a receipt sent twice would show as two rows."""

    __tablename__ = "receipts"

    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"), index=True)
    job_id: Mapped[str] = mapped_column(String(36))
    sent_at: Mapped[datetime] = mapped_column(server_default=func.now())
