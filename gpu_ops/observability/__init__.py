"""Where platform teams look: Prometheus metrics, Grafana dashboards, OpenTelemetry spans
and MLflow runs, all read from (or written beside) the tables the Dagster UI shows.

- :mod:`gpu_ops.observability.metrics`: the metric catalog and pure functions from table
  rows to metric families (no I/O);
- :mod:`gpu_ops.observability.readers`: the bounded SQL reads behind each family;
- :mod:`gpu_ops.observability.exporter`: ``gpu-ops exporter``, the HTTP endpoint
  Prometheus scrapes;
- :mod:`gpu_ops.observability.dashboards`: Grafana dashboards generated from the catalog;
- :mod:`gpu_ops.observability.tracing`: one span per training attempt and per cost
  partition over OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set;
- :mod:`gpu_ops.observability.mlflow_runs`: the attempt's cost on the active MLflow run.

Importing this package imports nothing else.
"""
