"""Telemetry: traces, metrics over OTLP, logs and the health endpoints."""
