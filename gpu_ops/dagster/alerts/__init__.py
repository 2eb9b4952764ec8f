"""The budget sensor and its definitions."""
