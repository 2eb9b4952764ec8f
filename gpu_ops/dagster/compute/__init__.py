"""The GpuCompute resource and its launch gates."""
