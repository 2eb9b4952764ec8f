"""Attempts, failure classification, the preemption policy, checkpoint intervals and estimates."""
