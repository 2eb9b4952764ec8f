"""A pipeline author's code location that uses gpu_ops (the snippets of docs/how-to/train-on-spot.md come from here)."""
