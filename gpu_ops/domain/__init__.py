"""The domain: settings, rules, models and pure functions. Imports nothing of gpu_ops's above it, nor Dagster."""
