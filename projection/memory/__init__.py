"""Per-rank memory: model states, activations (schedule-aware), buffers, allocator, verdict."""
