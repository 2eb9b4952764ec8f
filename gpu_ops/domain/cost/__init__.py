"""Cost rules: columns, rule books, usage sources and repeats."""
