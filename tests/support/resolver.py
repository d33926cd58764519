"""A stand-in for DNS: every name resolves to the addresses a test chooses."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from unittest import mock

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@contextmanager
def resolving_to(found: Sequence[IPAddress] | BaseException) -> Iterator[list[str]]:
    """On the running loop, every name resolves to ``found`` (or fails with it) while
    inside; yields the names that were looked up."""
    asked: list[str] = []

    async def getaddrinfo(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        asked.append(host)
        if isinstance(found, BaseException):
            raise found
        return [
            (socket.AF_INET6 if a.version == 6 else socket.AF_INET, 1, 6, "", (str(a), port))
            for a in found
        ]

    with mock.patch.object(asyncio.get_running_loop(), "getaddrinfo", getaddrinfo):
        yield asked
