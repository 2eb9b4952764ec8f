"""Cost rules: columns, rule books, usage sources and repeats (no third-party import at module level)."""
