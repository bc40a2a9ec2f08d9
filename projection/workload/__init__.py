"""Model workload: stage split, parameter counts, ops per layer."""
