"""Facts about the machine and the services a report was measured on."""

from __future__ import annotations

import datetime
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

from jobcore.amqp.connection import connect as connect_broker
from jobcore.kernel.settings import Settings

PACKAGES = (
    "sqlalchemy",
    "psycopg",
    "aio-pika",
    "aiormq",
    "fastapi",
    "uvicorn",
    "pydantic",
    "orjson",
    "opentelemetry-sdk",
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return 0.0


async def _rabbitmq_version(config: Settings) -> str:
    connection = await connect_broker(config, timeout=10)
    async with connection:
        assert connection.transport is not None
        properties = connection.transport.connection.server_properties
        version = properties.get("version", b"unknown")
    return version.decode() if isinstance(version, bytes) else str(version)


async def _postgresql_version(url: str) -> str:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SHOW server_version")
        row = await cur.fetchone()
    return str(row[0]) if row else "unknown"


async def facts(config: Settings) -> dict[str, Any]:
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = "not installed"
    return {
        "started_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": await _postgresql_version(config.maintenance_database_url()),
        "rabbitmq": await _rabbitmq_version(config),
        "packages": packages,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
