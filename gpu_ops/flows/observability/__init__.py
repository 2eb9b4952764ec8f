"""Observability flows: hooks, tracing, MLflow, the metric readers and the OTLP sender."""
