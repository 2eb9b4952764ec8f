"""Compute backends (local, Kubetorch), Karpenter NodePools, workers, standby, orphans and hardware."""
