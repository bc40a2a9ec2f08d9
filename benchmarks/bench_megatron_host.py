"""Host (CPU) time of Megatron-Core's own GPT layer, forward and backward, at shapes so small that the time is the
framework's Python and dispatch work (docs/performance.md, Megatron functional tests: evidence for what the
performance model's per-kernel host issue time leaves out).

Run: pip install megatron-core   (not a dependency of projection)
     python3 benchmarks/bench_megatron_host.py [--layers 2 12] [--repeat 100]

Megatron-Core's local layer spec (no Transformer Engine) on the CPU, one process (gloo), fp32, hidden 64, 4 heads,
sequence 16, batch 1, dropout off. Three CUDA-only calls of the local path are bypassed for the CPU (the memory
buffer's device, the CUDA RNG tracker's fork, the default causal mask: an explicit mask is passed). The per-layer
figure is the difference between two depths divided by the layer difference, so the embedding, output layer and loss
cancel out. torch.nn.Linear's forward on the same machine is printed as a reference point (TE issue #2053 measured
13.48 us for it on a DGX H100's Xeon 8480C with CUDA tensors).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any


def _setup() -> Any:
    import torch

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    from megatron.core import parallel_state, tensor_parallel

    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    return torch


def _model(torch: Any, layers: int) -> Any:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                            hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32,
                            gradient_accumulation_fusion=False)
    return GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=128,
                    max_sequence_length=16)


def _step_times(torch: Any, model: Any, repeat: int) -> tuple[float, float]:
    ids = torch.randint(0, 128, (1, 16))
    pos = torch.arange(16).unsqueeze(0)
    mask = torch.triu(torch.ones(16, 16), diagonal=1).bool()[None, None]
    fwd, bwd = [], []
    for i in range(repeat + 20):
        t0 = time.perf_counter()
        out = model(ids, pos, mask, labels=ids)
        t1 = time.perf_counter()
        out.sum().backward()
        t2 = time.perf_counter()
        if i >= 20:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return statistics.median(fwd), statistics.median(bwd)


def main() -> int:
    ap = argparse.ArgumentParser(description="Host time of Megatron-Core's GPT layer on the CPU.")
    ap.add_argument("--layers", type=int, nargs=2, default=(2, 12))
    ap.add_argument("--repeat", type=int, default=100)
    args = ap.parse_args()
    try:
        torch = _setup()
    except ImportError as err:
        print(f"needs megatron-core ({err}); pip install megatron-core", file=sys.stderr)
        return 2
    lo, hi = args.layers
    f_lo, b_lo = _step_times(torch, _model(torch, lo), args.repeat)
    f_hi, b_hi = _step_times(torch, _model(torch, hi), args.repeat)
    lin, x = torch.nn.Linear(64, 64), torch.randn(16, 64, requires_grad=True)
    for _ in range(100):
        lin(x)
    t0 = time.perf_counter()
    for _ in range(2000):
        lin(x)
    ref = (time.perf_counter() - t0) / 2000
    print(f"Megatron-Core GPT layer (local spec, CPU): host {(f_hi - f_lo) / (hi - lo) * 1e3:.3f} ms forward, "
          f"{(b_hi - b_lo) / (hi - lo) * 1e3:.3f} ms backward per layer; torch.nn.Linear forward {ref * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
