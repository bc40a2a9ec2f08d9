"""A caching-allocator model for reserved (not just allocated) bytes. (GEMM workspaces and other framework buffers:
buffers.py.)

Default allocator: the caching allocator rounds large blocks (> 1 MiB) up to 2 MiB multiples, gives each cudaMalloc
a segment of its own and keeps freed blocks cached; blocks of different segments never merge, and activations are
allocated and freed every microbatch in varying sizes, so part of their peak is lost to fragmentation.
FRAGMENTATION_OF_ACTIVATIONS is an assumption (not fitted to any end-to-end result): 10 % of the activation peak,
plus the 2 MiB rounding slack of one block.

Expandable segments (`expandable_segments:True` in PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF /
PYTORCH_HIP_ALLOC_CONF): one segment per stream reserves the virtual range of the whole device and maps physical
memory into it in 20 MiB pages as it grows (the large pool's page; "When does fragmentation occur in the CUDA
caching allocator?", pytorch/devlogs, E. Yang, 2026-06-01). Freed blocks merge with their neighbours across the
whole segment, so the activations freed after each backward leave no per-segment holes: no fragmentation allowance,
the allocated peak rounded up to whole pages. Blocks still live can pin holes between them, which is not modelled.
"""

from __future__ import annotations

FRAGMENTATION_OF_ACTIVATIONS = 0.10
BLOCK_ROUNDING_BYTES = 2 * 1024 * 1024
EXPANDABLE_PAGE_BYTES = 20 * 1024 * 1024


def reserved_bytes(allocated_peak: int, activation_bytes: int, expandable_segments: bool = False) -> int:
    """Reserved-bytes peak of the caching allocator for an allocated peak (see module docstring)."""
    if expandable_segments:
        return int(-(-allocated_peak // EXPANDABLE_PAGE_BYTES) * EXPANDABLE_PAGE_BYTES)
    slack = FRAGMENTATION_OF_ACTIVATIONS * activation_bytes
    return int(-(-(allocated_peak + slack) // BLOCK_ROUNDING_BYTES) * BLOCK_ROUNDING_BYTES)
