"""tracing: what tracing costs the API and the relay, on against off in the same run.

Each run starts an API and a relay with tracing off (no OTEL_* variables: the no-op
tracer) and again with it on: the processes send every span over OTLP/HTTP, through the
batch span processor, to a collector stand-in in this process that accepts and discards
them (it counts requests, so "on" is shown to have exported). With tracing on, the API
records the request span, the enqueue span and a span per database statement; the relay
a publish span per message. The order alternates between runs; the baseline is "off".
Not in the default set of scenarios: `jobcore bench tracing`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg

from jobcore.amqp.topology import Topology
from services.bench.harness import UNLIMITED_QUEUES, Bench, Options, relays_ready
from services.bench.http import http_load, post
from services.bench.report import Figure, Section
from services.bench.scenarios.relay import fill_outbox, until_empty

TITLE = "Tracing on vs off"
CLIENTS = 16

TRACING_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_SDK_DISABLED",
    "JOBCORE_TRACE_FILE",
)


class Sink:
    """An OTLP/HTTP endpoint that answers 200 to everything and counts what it got."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(size)
                with sink._lock:
                    sink.requests += 1
                    sink.bytes += size
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Sink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def take(self) -> dict[str, int]:
        with self._lock:
            counts = {"otlp_requests": self.requests, "otlp_bytes": self.bytes}
            self.requests = self.bytes = 0
        return counts


@contextmanager
def tracing(on: bool, sink: Sink) -> Iterator[None]:
    """The child processes' environment: tracing over OTLP to ``sink``, or nothing."""
    saved = {k: os.environ.pop(k) for k in TRACING_VARIABLES if k in os.environ}
    if on:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.url
        os.environ["OTEL_METRICS_EXPORTER"] = "none"  # measure the tracing alone
    try:
        yield
    finally:
        for key in TRACING_VARIABLES:
            os.environ.pop(key, None)
        os.environ.update(saved)


def steps(options: Options) -> int:
    return 2 * options.runs


async def measure(bench: Bench, mode: str, sink: Sink) -> tuple[float, float, int]:
    """Enqueue requests/s and relay messages/s on a fresh stack; OTLP requests seen."""
    n, rows = bench.options.jobs, max(1000, bench.options.relay_rows // 10)
    with tracing(mode == "on", sink):
        async with (
            bench.scratch("tracing") as config,
            bench.stack(
                config, f"tracing-{mode}", relays=1, workers=0, env=UNLIMITED_QUEUES
            ) as stack,
        ):
            await relays_ready(stack)
            request = post(
                stack.api_port, "/jobs/noop", b"{}", {"Authorization": f"Bearer {stack.api_key}"}
            )
            await http_load(stack.api_port, request, CLIENTS, 200)  # warm-up
            latencies, seconds, errors = await http_load(stack.api_port, request, CLIENTS, n)
            if errors:
                raise RuntimeError(f"{errors} of {n} POSTs were not accepted")
            enqueue_rate = len(latencies) / seconds
            topology = Topology.from_settings(config)
            async with await psycopg.AsyncConnection.connect(
                config.database_url, autocommit=True
            ) as conn:
                await until_empty(conn)  # the enqueued jobs' rows
                await fill_outbox(conn, topology, rows)
                started = time.perf_counter()
                await until_empty(conn)
                relay_rate = rows / (time.perf_counter() - started)
    return enqueue_rate, relay_rate, sink.take()["otlp_requests"]


async def run(bench: Bench) -> Section:
    options = bench.options
    section = Section(
        "tracing",
        TITLE,
        f"Per run and mode a fresh API + relay: {options.jobs:,} `POST /jobs/noop` over "
        f"{CLIENTS} connections, then {max(1000, options.relay_rows // 10):,} outbox rows "
        f"drained; every span exported over OTLP/HTTP to a local sink when on; "
        f"{options.runs} runs, alternating the order.",
    )
    rates: dict[str, dict[str, list[float]]] = {
        "enqueue": {"on": [], "off": []},
        "relay": {"on": [], "off": []},
    }
    exported: dict[str, list[int]] = {"on": [], "off": []}
    with Sink() as sink:
        for number in range(options.runs):
            for mode in ("off", "on") if number % 2 == 0 else ("on", "off"):
                bench.step(f"tracing: {mode}, run {number + 1}")
                enqueue_rate, relay_rate, requests = await measure(bench, mode, sink)
                rates["enqueue"][mode].append(round(enqueue_rate, 1))
                rates["relay"][mode].append(round(relay_rate, 1))
                exported[mode].append(requests)
    if not all(exported["on"]) or any(exported["off"]):
        raise RuntimeError(f"OTLP requests per run do not match the modes: {exported}")
    section.add(
        Figure(
            "enqueue, tracing on",
            "requests/s",
            rates["enqueue"]["on"],
            "tracing off",
            rates["enqueue"]["off"],
        )
    )
    section.add(
        Figure(
            "relay, tracing on",
            "messages/s",
            rates["relay"]["on"],
            "tracing off",
            rates["relay"]["off"],
        )
    )
    section.details["otlp_requests"] = exported
    return section
