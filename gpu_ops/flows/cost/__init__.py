"""The cost flow: read usage, price it in DuckDB, attribute, budget, ROI, billing and utilization."""
