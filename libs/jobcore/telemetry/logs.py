"""Structured JSON logs on stderr, one object a line.

A line written inside a span carries its ``trace_id`` and ``span_id`` (so a log line
leads to its trace and back); ``job_id`` and ``message_id`` come from ``extra=``.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

from jobcore.telemetry.traces import current_ids

# Attributes a LogRecord has by itself; anything else came in through ``extra=`` and is
# a structured field (job_id, message_id, ...).
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if ids := current_ids():
            entry["trace_id"], entry["span_id"] = ids
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aio-pika and aiormq log every reconnect attempt; we log state changes ourselves.
    for noisy in ("aio_pika", "aiormq", "psycopg.pool"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
