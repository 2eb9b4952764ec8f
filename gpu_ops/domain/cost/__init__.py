"""Cost rules: columns, prices, rule books, usage sources, repeats and anomaly scoring."""
