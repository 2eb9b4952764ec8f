"""A pipeline author's code location that uses gpu_ops (the README's snippets come from here)."""
