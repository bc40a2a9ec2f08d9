"""One rank of the TorchTitan tensor-parallel memory oracle (tests only; spawned by test_memory_torchtitan_tp.py).

Each rank builds a decoder block of tests/oracle/torchtitan_layers.py, applies TorchTitan's per-block TP plan with
sequence parallelism (pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py `apply_tp`, read through the
public-code index; no code copied) with `parallelize_module` on a 1-D gloo mesh of the CPU ranks:

    attention_norm, ffn_norm, attention.q_norm / k_norm (use_local_output=True)   SequenceParallel()
    attention      PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    attention.wq / wk / wv, feed_forward.w1 / w3                         ColwiseParallel()
    attention.wo, feed_forward.w2                                        RowwiseParallel(output_layouts=Shard(1))
    feed_forward   PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))

(TorchTitan's attention takes four inputs, the last three None; the test block takes one.) The block's input is the
rank's sequence shard, a plain (b, s / tp, h) tensor as TorchTitan's RowwiseParallel embedding hands it over
(use_local_output=True); its output is one too. The column-parallel linears' local outputs hold tp-th of the heads,
which the block's attention views as (b, s, -1, head_dim), so each rank runs n_heads / tp query and n_kv / tp KV heads.

The norms are the test's `_RMSNormFn` (what CUDA's `_fused_rms_norm` saves) run on the local shard of their DTensor
input, with the replicated weight's gradient marked Partial: the per-rank saved set of `_fused_rms_norm`'s DTensor
(pointwise over the sequence) strategy.

The forward runs under a dispatch mode keeping a weak reference to the storage of every op output (a DTensor's local
tensor's); after it, the storages still alive, less the parameters' (local shards), buffers' and the block output's,
plus the block input, are what the rank keeps for backward. The backward then runs, to check the block is a real one
and to count the matmul FLOPs it replays (under per-op SAC, from the local shapes), and the rank's output is
compared with an unsharded copy of the block run on the gathered input. Results (per rank, per case: the kept bytes,
the alive storages' creating op, shape and dtype, the output's largest deviation) go to a JSON file.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from projection.specs.model import ModelSpec
from tests.oracle.memory_models import _RMSNormFn
from tests.oracle.rank_probes import AliveStorages, ReplayedOps, kept_bytes, run_cases
from tests.oracle.torchtitan_layers import Block, OpSacBlock, RMSNorm


class TPRMSNorm(RMSNorm):
    """`RMSNorm` on a DTensor input sharded along the sequence: the fused kernel on the local shard."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, DTensor):
            return super().forward(x)
        w = self.weight
        w_local = w.to_local(grad_placements=[Partial()]) if isinstance(w, DTensor) else w
        out = _RMSNormFn.apply(x.to_local(), w_local, 1e-6)
        return DTensor.from_local(out, x.device_mesh, x.placements, run_check=False)


def _tp_norms(block: nn.Module) -> None:
    """Swap every RMSNorm of the block for a TPRMSNorm of the same width (weights are ones)."""
    for name, mod in list(block.named_modules()):
        if type(mod) is RMSNorm:
            parent, _, leaf = name.rpartition(".")
            setattr(block.get_submodule(parent) if parent else block, leaf, TPRMSNorm(mod.weight.shape[0]))


def tp_plan(spec: ModelSpec) -> dict[str, Any]:
    """TorchTitan's per-TransformerBlock TP plan (module docstring) for the test block's one-input attention."""
    plan: dict[str, Any] = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }
    if spec.qk_norm:
        plan["attention.q_norm"] = SequenceParallel(use_local_output=True)
        plan["attention.k_norm"] = SequenceParallel(use_local_output=True)
    return plan


def measure(spec: ModelSpec, op_sac: bool, mesh: DeviceMesh, seq: int, micro_batch: int) -> dict[str, Any]:
    """Bytes this rank's TP block keeps after its forward, and the alive storages (module docstring)."""
    torch.manual_seed(0)
    outer = OpSacBlock(spec, 0, seq) if op_sac else None
    block = outer.block if outer is not None else Block(spec, 0, seq)
    reference = copy.deepcopy(block)  # the same weights on every rank (same seed), unsharded
    _tp_norms(block)
    parallelize_module(block, mesh, tp_plan(spec))
    run = outer if outer is not None else block
    tp, rank = mesh.size(), mesh.get_local_rank()
    torch.manual_seed(1 + rank)
    x = torch.randn(micro_batch, seq // tp, spec.hidden_size, requires_grad=True)
    shards = [torch.empty_like(x) for _ in range(tp)]
    dist.all_gather(shards, x.detach())
    with torch.no_grad():
        want = reference(torch.cat(shards, 1)).chunk(tp, 1)[rank]
    mode = AliveStorages()
    with mode:
        y = run(x)
    assert not isinstance(y, DTensor) and tuple(y.shape) == tuple(x.shape)
    err = (y.detach() - want).abs().max().item()  # the sharded block computes the unsharded one's output
    kept, storages = kept_bytes(mode, y, x, block)
    flops = ReplayedOps()
    with flops:
        y.backward(torch.ones_like(y))
    assert x.grad is not None and all(p.grad is not None for p in block.parameters())
    return {"kept": kept, "storages": storages, "max_abs_err": err, "recomputed_flop": flops.flop,
            "recomputed_collectives": flops.collectives}


def worker(rank: int, world: int, port: int, cases: list[tuple[ModelSpec, bool]], seq: int, micro_batch: int,
           out: str) -> None:
    run_cases(rank, world, port, cases, seq, micro_batch, out, measure, "tp")
