"""Telemetry: what the processes tell about themselves.

- :mod:`.traces`: OpenTelemetry set up from ``OTEL_*``, and the trace context carried
  through the outbox (captured at enqueue, injected by the relay, extracted by the worker);
- :mod:`.semconv`: the semantic conventions jobcore's spans follow, in one place;
- :mod:`.otlp_metrics`: the Prometheus instruments pushed over OTLP as well;
- :mod:`.logs`: structured JSON logs, each line inside a span carrying its trace;
- :mod:`.health`: the /healthz, /readyz and /metrics server of the relay and the worker.

The statements' spans are the database's (:mod:`jobcore.database.statement_spans`); the
backlog gauges are a read (:mod:`jobcore.usecases.backlog`).
"""
