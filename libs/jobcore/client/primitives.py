"""What the asyncio client does differently from the blocking one, beyond ``async`` and
``await``: how it pauses and how it writes a file. :mod:`jobcore.client.sync` is generated
from :mod:`jobcore.client.aio` by ``scripts/unasync_client.py``, which turns each
``async_*`` name here into the one without the prefix."""

from __future__ import annotations

import asyncio
import time
from typing import IO


async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


async def async_write(target: IO[bytes], chunk: bytes) -> None:
    """In a thread: a file write blocks, and the event loop must go on meanwhile."""
    await asyncio.to_thread(target.write, chunk)


def write(target: IO[bytes], chunk: bytes) -> None:
    target.write(chunk)
