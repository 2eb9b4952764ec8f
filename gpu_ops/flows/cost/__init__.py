"""The cost flow: read usage, price it in DuckDB (the price matrix), attribute, budget, ROI, billing, utilization and anomaly scoring."""
