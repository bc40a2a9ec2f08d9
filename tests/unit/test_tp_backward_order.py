"""Where a column-parallel linear's input-gradient reduce-scatter sits in the backward, per TP style.

Megatron (LinearWithGradAccumulationAndAsyncCommunication.backward): the reduce-scatter of grad_input is launched
right after the dgrad GEMM and overlaps the wgrad GEMM. TorchTitan's DTensor TP: `aten.mm`'s one autograd node
computes grad_input and grad_weight, and the Partial -> Shard(1) reduce-scatter that PrepareModuleInput's backward
does comes after it; the norm's backward consumes it at once, so it is waited for, not hidden."""

from __future__ import annotations

import pytest

from projection.perf.items import mark_async
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec
from projection.workload.ops import layer_ops

MODEL = ModelSpec(num_layers=2, hidden_size=1024, num_attention_heads=16, num_kv_heads=8, ffn_hidden_size=3584,
                  vocab_size=32000)
TRAINING = TrainingSpec(seq_length=2048)


@pytest.mark.parametrize(("style", "hidden"), [("megatron", True), ("dtensor", False)])
def test_input_gradient_reduce_scatter_placement(style: str, hidden: bool) -> None:
    plan = ParallelPlan(tp=4, sp=True, dp=1, tp_style=style)
    bwd = [o for o in layer_ops(MODEL, TRAINING, plan, 0) if o.phase != "F"]
    names = [o.name for o in bwd]
    for base in ("attn.qkv", "mlp.fc1"):
        rs, dgrad, wgrad = names.index(f"{base}.rs"), names.index(f"{base}.dgrad"), names.index(f"{base}.wgrad")
        assert dgrad < rs
        assert (rs < wgrad) == hidden  # Megatron launches it before the wgrad; DTensor after both GEMMs
        entry = next(e for e in mark_async(bwd) if e.op.name == f"{base}.rs")
        assert entry.asynchronous == hidden
