"""Compute backends (local, Kubetorch), Karpenter NodePools, workers, standby and orphans."""
