"""The daily cost assets, their checks and metadata."""
