"""Training attempts: the worker side, the context, checkpoints, settlement and the demo function."""
