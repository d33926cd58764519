"""Job priorities: three levels, stored as small integers, and the weights the relay's
claim shares a queue's room by.

Quorum queues (RabbitMQ 3.10) have no message priorities, so priority acts where the
backlog is: in PostgreSQL, before publishing. The relay's fair claim shares each queue's
budget between its lanes (routing key, tenant, priority) in proportion to these weights,
and publishes the batch in weighted round-robin order, so while every level has due rows a
claim batch carries high, normal and low messages 4:2:1 — a high job is never behind a low
backlog in PostgreSQL, and a low one is never starved. The relay's queue depth limit keeps
what waits in the broker (FIFO, no priorities) short. A leaf module: it imports nothing of
ours.
"""

from __future__ import annotations

from enum import IntEnum


class Priority(IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: str | int) -> Priority:
        """A level from its name (``"high"``) or its number (``2``); ValueError otherwise."""
        try:
            if isinstance(value, int):
                return cls(value)
            text = value.strip().lower()
            return cls(int(text)) if text.isdigit() else cls[text.upper()]
        except (KeyError, ValueError):
            raise ValueError(f"unknown priority {value!r}: one of {', '.join(LABELS)}") from None


DEFAULT_PRIORITY = Priority.NORMAL
LABELS: tuple[str, ...] = tuple(p.label for p in Priority)

# A lane's share of its queue's claim budget is its weight over the sum of the weights of
# the queue's lanes that have due rows. 4:2:1 gives high jobs most of a busy queue while a
# low lane still gets a seventh of it.
WEIGHTS: dict[Priority, int] = {Priority.HIGH: 4, Priority.NORMAL: 2, Priority.LOW: 1}
