"""Table storage: SQLite by default, PostgreSQL in production (see tables.py, io_manager.py)."""
