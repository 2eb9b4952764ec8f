"""The flows: the cost engine, compute backends and workers, training attempts, alerts and observability, each a plain Python function or class without Dagster. Import storage and the domain."""
