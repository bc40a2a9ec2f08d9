"""Megatron-Core's unfused MoE permute / unpermute (no --moe-permute-fusion) against the op list's glue ops.

The workload (projection/workload/ops_mlp.py `_unfused_permute`) prices each kernel moe_utils runs by the bytes it
moves. The oracle runs Megatron-Core's own `permute` and `unpermute` (fused=False) on the CPU at the scenario's
shapes (one MoE layer, bf16, router probabilities in bf16) under a TorchDispatchMode that records every aten call
and the bytes of its tensors: reads are each input's bytes (at most its storage: an expanded index is read once),
nothing for allocations (zeros, new_zeros, zeros_like) and only the source for copy_; writes are each output's.
Views (permute, expand, unsqueeze, detach ...) and uninitialised allocations move no data and are not kernels.
Per phase, the kernel count and the bytes read and written must equal the op list's exactly.
Needs megatron-core (a test dependency); skipped, saying so, where it is not installed.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils",
                                    reason="megatron-core is not installed (pip install -e '.[test]')")

from projection.specs.model import ModelSpec  # noqa: E402
from projection.specs.plan import ParallelPlan  # noqa: E402
from projection.specs.training import KernelSpec, TrainingSpec  # noqa: E402
from projection.workload.ops import layer_ops  # noqa: E402
from tests.oracle.test_op_bytes import KernelBytes  # noqa: E402

TOKENS, HIDDEN, EXPERTS, TOP_K = 64, 32, 8, 2
MODEL = ModelSpec(num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=64, vocab_size=256,
                  moe={"num_experts": EXPERTS, "top_k": TOP_K, "expert_ffn_hidden_size": 64})
VIEWS = {"permute", "expand", "unsqueeze", "view", "_unsafe_view", "detach", "t", "transpose", "as_strided", "alias",
         "slice", "select", "squeeze"}
NO_DATA = {"new_empty_strided", "empty", "new_empty", "empty_strided", "empty_like"}
ALLOCATIONS = {"zeros", "new_zeros", "zeros_like"}


class Kernels(KernelBytes):
    """(aten op, bytes read, bytes written) of every call that moves data (module docstring)."""

    def read_bytes(self, name: str, inputs: list[Any]) -> int | None:
        if name in VIEWS or name in NO_DATA:
            return None
        if name in ALLOCATIONS:
            inputs = []
        elif name == "copy_":
            inputs = inputs[1:]
        return sum(min(t.nbytes, t.untyped_storage().nbytes()) for t in inputs)


def test_unfused_permute_kernels_equal_megatron_cores() -> None:
    training = TrainingSpec(seq_length=TOKENS, micro_batch_size=1, params_dtype="bf16",
                            kernels=KernelSpec(moe_permute_fusion=False))
    glue = [o for o in layer_ops(MODEL, training, ParallelPlan(), 0)
            if o.name.startswith(("moe.permute", "moe.unpermute"))]
    torch.manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    top, idx = torch.randn(TOKENS, EXPERTS).softmax(-1).topk(TOP_K, -1)
    routing_map = torch.zeros(TOKENS, EXPERTS, dtype=torch.bool).scatter_(1, idx, True)
    probs = torch.zeros(TOKENS, EXPERTS).scatter_(1, idx, top).to(torch.bfloat16).requires_grad_(True)
    with Kernels() as fwd:
        rows, row_probs, indices = moe_utils.permute(x, routing_map, probs=probs, num_out_tokens=TOKENS * TOP_K,
                                                     fused=False)
        y = moe_utils.unpermute(rows, indices, x.shape, probs=None, routing_map=routing_map, fused=False)
    grads = (torch.randn_like(y), torch.randn_like(row_probs))
    with Kernels() as bwd:
        torch.autograd.backward([y, row_probs], list(grads))
    for phase, mode in (("F", fwd), ("I", bwd)):
        ops = [o for o in glue if o.phase == phase]
        measured = (len(mode.calls), sum(r for _, r, _ in mode.calls), sum(w for _, _, w in mode.calls))
        projected = (len(ops), sum(o.bytes_read for o in ops), sum(o.bytes_written for o in ops))
        print(f"\n{phase}: Megatron-Core {measured} {[c[0] for c in mode.calls]}; op list {projected} "
              f"{[o.name for o in ops]}")
        assert projected == measured


def test_the_fused_path_is_priced_without_the_unfused_glue() -> None:
    """--moe-permute-fusion (Transformer Engine's kernels): one permute and one unpermute kernel each way."""
    training = TrainingSpec(seq_length=TOKENS, micro_batch_size=1, params_dtype="bf16",
                            kernels=KernelSpec(moe_permute_fusion=True))
    names = [o.name for o in layer_ops(MODEL, training, ParallelPlan(), 0)
             if o.name.startswith(("moe.permute", "moe.unpermute"))]
    assert names == ["moe.permute", "moe.unpermute", "moe.unpermute.bwd", "moe.permute.bwd"]
