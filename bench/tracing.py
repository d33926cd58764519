"""What tracing costs: the enqueue and relay benchmarks with tracing off and on, interleaved.

Each round runs ``bench.enqueue`` (``POST /jobs/noop`` against a `jobcore api` process)
and ``bench.relay`` (a `jobcore relay` process draining ``--rows`` outbox rows) once with
tracing off (no OTEL_* variables: the API's no-op tracer) and once on: the processes send
every span over OTLP/HTTP, through the batch span processor, to a collector stand-in in
this process that accepts and discards them (it counts requests and bytes, so "on" is
shown to have exported). The order alternates between rounds, so a neighbour's load
hits both modes alike; medians and the spread (min-max) are reported, with the on/off
ratio of the medians. With tracing on, the API records the request span, the enqueue
span and a span per database statement; the relay a publish span per message.

    .venv/bin/python -m bench.tracing --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from bench import enqueue as enqueue_bench
from bench import relay as relay_bench

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


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        "enqueue": {"off": [], "on": []},
        "relay": {"off": [], "on": []},
    }
    enqueue_args = argparse.Namespace(
        clients=args.clients, requests=args.requests, pool_size=8, log=args.log + ".api"
    )
    relay_args = argparse.Namespace(
        rows=args.rows,
        rounds=1,
        batch_size=500,
        lanes=2,
        window=0,
        samples=20,
        poll=0.01,
        log=args.log + ".relay",
    )
    # Opened before the loop: bench.relay hands the file to its relay process as stdout.
    with Sink() as sink, open(relay_args.log, "wb") as relay_log:  # noqa: ASYNC230
        for number in range(args.rounds):
            order = ("off", "on") if number % 2 == 0 else ("on", "off")
            for mode in order:
                with tracing(mode == "on", sink):
                    if not args.skip_enqueue:
                        result = await enqueue_bench.run(enqueue_args)
                        runs["enqueue"][mode].append({**result["enqueue"], **sink.take()})
                    if not args.skip_relay:
                        result = await relay_bench.run(relay_args, relay_log)
                        runs["relay"][mode].append({**result["relay"], **sink.take()})
    return summarise(runs, args)


def summarise(
    runs: dict[str, dict[str, list[dict[str, Any]]]], args: argparse.Namespace
) -> dict[str, Any]:
    results: dict[str, Any] = {
        "rounds": args.rounds,
        "load_average_at_end": os.getloadavg(),
        "cores": os.cpu_count(),
        "note": "API/relay, PostgreSQL, RabbitMQ and the load generator share the cores",
    }
    rate_key = {"enqueue": "req_per_s", "relay": "msgs_per_s"}
    for bench_name, modes in runs.items():
        if not modes["off"]:
            continue
        key = rate_key[bench_name]
        summary: dict[str, Any] = {}
        for mode, rounds in modes.items():
            summary[mode] = {
                key: spread([r[key] for r in rounds]),
                "otlp_requests": [r["otlp_requests"] for r in rounds],
                "rounds": rounds,
            }
            if bench_name == "enqueue":
                summary[mode]["p50_ms"] = spread([r["p50_ms"] for r in rounds])
                summary[mode]["p99_ms"] = spread([r["p99_ms"] for r in rounds])
        off, on = summary["off"][key]["median"], summary["on"][key]["median"]
        summary["ratio_on_vs_off"] = round(on / off, 3) if off else None
        results[bench_name] = summary
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tracing", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each off and on (2)")
    parser.add_argument("--clients", type=int, default=32, help="enqueue clients (32)")
    parser.add_argument("--requests", type=int, default=2000, help="enqueue requests (2000)")
    parser.add_argument("--rows", type=int, default=10_000, help="relay rows per run (10000)")
    parser.add_argument("--skip-enqueue", action="store_true", help="relay only")
    parser.add_argument("--skip-relay", action="store_true", help="enqueue only")
    parser.add_argument("--log", default="/tmp/jobcore-bench-tracing", help="log file prefix")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    results = asyncio.run(run(args))
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    for name, key in (("enqueue", "req_per_s"), ("relay", "msgs_per_s")):
        if name in results:
            off, on = results[name]["off"][key], results[name]["on"][key]
            print(
                f"{name}: tracing off {off['median']} {key} ({off['min']}-{off['max']}), "
                f"on {on['median']} ({on['min']}-{on['max']}): "
                f"on/off = {results[name]['ratio_on_vs_off']}"
            )


if __name__ == "__main__":
    main()
