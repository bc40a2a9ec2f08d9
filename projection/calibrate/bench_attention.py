"""Attention microbenchmark: F.scaled_dot_product_attention forward and backward for each (batch, heads, kv heads,
head dim, seq_q, seq_kv, causal, dtype), on whatever kernel PyTorch picks on the device (flash / memory-efficient /
cuDNN on GPUs, the fused CPU kernel on CPUs).

Forward: median time of the call. Backward: median of (forward + backward) minus the forward median, because a
backward needs a fresh forward graph each time. GQA shapes pass `enable_gqa`. Shapes whose value head dim differs
from the query head dim (MLA) are skipped: the calibration's attention rows have one head dim.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from projection.calibrate.bench_common import TORCH_DTYPES, Progress, device_name, time_call, within_memory
from projection.calibrate.calibration import AttentionRow


@dataclass(frozen=True)
class AttentionShape:
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    seq_q: int
    seq_kv: int
    causal: bool = True
    dtype: str = "bf16"


def _time_shape(s: AttentionShape, device: torch.device, warmup: int, repeat: int) -> tuple[float, float]:
    """Seconds of the forward, and of the backward alone (each timed call's forward runs untimed before it: a
    difference of two medians took the forward's noise into the backward, an audit found)."""
    dt = TORCH_DTYPES[s.dtype if s.dtype in TORCH_DTYPES else "bf16"]
    q = torch.randn(s.batch, s.heads, s.seq_q, s.head_dim, device=device, dtype=dt, requires_grad=True)
    k = torch.randn(s.batch, s.kv_heads, s.seq_kv, s.head_dim, device=device, dtype=dt, requires_grad=True)
    v = torch.randn(s.batch, s.kv_heads, s.seq_kv, s.head_dim, device=device, dtype=dt, requires_grad=True)
    grad = torch.randn(s.batch, s.heads, s.seq_q, s.head_dim, device=device, dtype=dt)
    gqa = s.kv_heads != s.heads

    def forward() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=s.causal, enable_gqa=gqa)

    graph: list[torch.Tensor] = []

    def setup() -> None:
        graph[:] = [forward()]

    def backward() -> None:
        graph.pop().backward(grad)

    with torch.no_grad():
        t_fwd = time_call(forward, device, warmup, repeat)
    return t_fwd, time_call(backward, device, warmup, repeat, setup=setup)


def bench_attention(shapes: Iterable[AttentionShape], device: torch.device, *, warmup: int = 3, repeat: int = 10,
                    progress: Progress | None = None) -> tuple[AttentionRow, ...]:
    """A forward and a backward row per shape."""
    rows: list[AttentionRow] = []
    where = device_name(device)
    for s in shapes:
        with within_memory(f"attention b{s.batch} h{s.heads}/{s.kv_heads} d{s.head_dim} s{s.seq_q}x{s.seq_kv}", device):
            t_fwd, t_bwd = _time_shape(s, device, warmup, repeat)
        source = f"R: projection calibrate attention on {where}, median of {repeat} after {warmup} warm-up"
        common: dict[str, object] = dict(batch=s.batch, heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim,
                                         seq_q=s.seq_q, seq_kv=s.seq_kv, causal=s.causal, dtype=s.dtype, count=repeat)
        rows.append(AttentionRow.model_validate({"direction": "fwd", "time_s": t_fwd, "source": source, **common}))
        rows.append(AttentionRow.model_validate({"direction": "bwd", "time_s": t_bwd,
                                                 "source": source + "; the backward alone, its forward untimed before "
                                                 "each call", **common}))
        if progress is not None:
            progress.step(f"b{s.batch} h{s.heads} s{s.seq_q} d{s.head_dim}")
    return tuple(rows)
