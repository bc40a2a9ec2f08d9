"""A caching-allocator model for reserved (not just allocated) bytes. (GEMM workspaces and other framework buffers:
buffers.py.)

Reserved: the caching allocator rounds large blocks (> 1 MiB) up to 2 MiB multiples and keeps freed blocks
cached; activations are allocated and freed every microbatch in varying sizes, so part of their peak is lost to
fragmentation. FRAGMENTATION_OF_ACTIVATIONS is an assumption (not fitted to any end-to-end result): 10 % of the
activation peak, plus the 2 MiB rounding slack of one block per saved tensor kind (small against GiB peaks).
"""

from __future__ import annotations

FRAGMENTATION_OF_ACTIVATIONS = 0.10
BLOCK_ROUNDING_BYTES = 2 * 1024 * 1024


def reserved_bytes(allocated_peak: int, activation_bytes: int) -> int:
    """Reserved-bytes peak of the caching allocator for an allocated peak (see module docstring)."""
    slack = FRAGMENTATION_OF_ACTIVATIONS * activation_bytes
    return int(-(-(allocated_peak + slack) // BLOCK_ROUNDING_BYTES) * BLOCK_ROUNDING_BYTES)
