"""Training attempts: the worker side, the hardware it detects, the context, checkpoints, settlement and the demo function."""
