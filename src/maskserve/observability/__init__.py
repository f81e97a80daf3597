"""Logs, Prometheus metrics and OpenTelemetry traces: what the server says of its work."""
