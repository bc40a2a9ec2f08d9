"""One rank of the TorchTitan expert-parallel memory oracle (tests only; spawned by test_memory_torchtitan_ep.py).

Each rank builds the MoE decoder block of tests/oracle/torchtitan_layers.py (same seed, same weights on every rank)
and swaps its `MoE` for `EPMoE`, which keeps the router gate and the shared expert (replicated: with dp = ep every
rank routes its own tokens) and hands the routed experts to `GroupedExperts`, parallelized the way TorchTitan's
`apply_moe_ep_tp` does at tp 1 (pytorch/torchtitan torchtitan/distributed/expert_parallel.py `ExpertParallel` and
torchtitan/models/common/moe, read through the public-code index; no code copied): `distribute_module` on the 1-D
gloo mesh of the ranks, with

- partition_fn: every expert weight (E, ., .) becomes a DTensor sharded on dim 0 (Shard(0)), E / ep experts a rank;
  the experts' forward runs on `to_local()` of each;
- input_fn (token dispatch, a forward pre-hook): under no_grad, `all_to_all_single` of the per-expert token counts
  (`_c10d_functional.all_to_all_single` and `wait_tensor`), the input / output splits per rank from them, then
  `all_to_all_single_autograd` of the routed token copies (sorted by expert, hence by destination rank), then the
  rank-major -> expert-major permutation of what arrived (a gather by permuted indices, as TorchTitan's `_permute`);
- output_fn (token combine, a forward hook): the inverse permutation (`new_empty` + index_put, as `_unpermute`),
  then `all_to_all_single_autograd` back with the splits swapped.

The local experts are `torch._grouped_mm` SwiGLUs over the 4 local experts (fp32; TorchTitan casts to bf16 for the
GEMMs, which the fp32 oracle leaves out, as the tp 1 block does). `EPMoE.forward` is TorchTitan's `MoE.forward`
with scores applied after the experts (score_before_experts=False, as the tp 1 block): fp32 softmax router, top-k
(here TorchTitan's `_debug_force_load_balance_routing`: token i's copies go to experts (k i + j) mod E, the tp 1
block's balanced choice), per-expert counts, a stable argsort of the chosen experts, the gather of the routed copies,
the experts, the shared expert, the unsort (`zeros` + index_put) and the `bmm` with the top scores.

Forward runs under a dispatch mode keeping a weak reference to the storage of every op output (a DTensor's local
tensor's); after it, the storages still alive, less the parameters' (local shards), buffers' and the block output's,
plus the block input (read after a short pause that lets gloo's worker threads drop the inputs of completed
collectives), are what the rank keeps for backward, without recompute or under the tp 1 block's per-op
selective checkpointing (`OpSacBlock`, whose save list includes `_c10d_functional.all_to_all_single`). The backward
then runs; the rank's output and input gradient are compared with an unsharded copy of the tp 1 block (all 8 experts
local) on the same tokens. Results (per case: kept bytes, alive storages' op, shape, dtype, the largest deviations,
the all_to_all splits) go to a JSON file per rank.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_module, distribute_tensor

from projection.specs.model import ModelSpec
from tests.oracle.rank_probes import AliveStorages, ReplayedOps, kept_bytes, run_cases
from tests.oracle.torchtitan_layers import MoE, OpSacBlock


class GroupedExperts(nn.Module):
    """The routed experts: SwiGLU grouped GEMMs over the experts this rank holds (weights (E, h, f), (E, f, h))."""

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = (nn.Parameter(w.detach().clone()) for w in (w1, w2, w3))

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (w.to_local() if isinstance(w, DTensor) else w for w in (self.w1, self.w2, self.w3))
        offs = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
        hid = F.silu(torch._grouped_mm(x, w1, offs=offs)) * torch._grouped_mm(x, w3, offs=offs)
        out: torch.Tensor = torch._grouped_mm(hid, w2, offs=offs)
        return out


def _rank_major_to_expert_major(counts: torch.Tensor, ep: int, local: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices reordering rows grouped (source rank, local expert) into (local expert, source rank), and the
    rows per local expert (what TorchTitan's `_generate_permute_indices` computes, without padding)."""
    starts = torch.cumsum(counts, 0) - counts
    c, s = counts.view(ep, local).t().reshape(-1), starts.view(ep, local).t().reshape(-1)
    idx = torch.cat([torch.arange(int(b), int(b) + int(n)) for b, n in zip(s, c, strict=True)])
    return idx, counts.view(ep, local).sum(0)


class ExpertParallel:
    """TorchTitan's `ExpertParallel` style (module docstring) applied with `distribute_module`."""

    def __init__(self) -> None:
        self.input_splits: list[int] = []
        self.output_splits: list[int] = []
        self.input_shape: torch.Size | None = None
        self.permuted_indices: torch.Tensor | None = None

    def _partition_fn(self, name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
        for pname, param in list(mod.named_parameters(recurse=False)):
            mod.register_parameter(pname, nn.Parameter(distribute_tensor(param, mesh, [Shard(0)])))

    def _token_dispatch(self, mod: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor],
                        mesh: DeviceMesh) -> tuple[torch.Tensor, torch.Tensor]:
        routed_input, num_tokens_per_expert = inputs
        ep = mesh.size()
        local = num_tokens_per_expert.shape[0] // ep
        group = mesh.get_group()
        with torch.no_grad():
            counts_group = funcol.all_to_all_single(num_tokens_per_expert, None, None, group=group)
            counts_group = torch.ops._c10d_functional.wait_tensor(counts_group)
            self.input_splits = num_tokens_per_expert.view(ep, -1).sum(dim=1).tolist()
            self.output_splits = counts_group.view(ep, -1).sum(dim=1).tolist()
        routed = funcol.all_to_all_single_autograd(routed_input, self.output_splits, self.input_splits, group)
        with torch.no_grad():
            self.permuted_indices, counts_local = _rank_major_to_expert_major(counts_group, ep, local)
        self.input_shape = routed.shape
        return routed[self.permuted_indices, :], counts_local

    def _token_combine(self, mod: nn.Module, routed_output: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        assert self.input_shape is not None and self.permuted_indices is not None
        out = routed_output.new_empty(self.input_shape)
        out[self.permuted_indices, :] = routed_output
        return funcol.all_to_all_single_autograd(out, self.input_splits, self.output_splits, mesh.get_group())

    def apply(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
        # torch types input_fn / output_fn as returning None; a returned value replaces the inputs / output
        return distribute_module(module, mesh, partition_fn=self._partition_fn,
                                 input_fn=self._token_dispatch,  # type: ignore[arg-type]
                                 output_fn=self._token_combine)  # type: ignore[arg-type]


class EPMoE(nn.Module):
    """TorchTitan's MoE forward (module docstring) around the tp 1 block's `MoE` weights."""

    def __init__(self, moe: MoE) -> None:
        super().__init__()
        self.num_experts, self.k = moe.experts, moe.k
        self.gate, self.shared = moe.gate, moe.shared
        self.experts = GroupedExperts(moe.w1, moe.w2, moe.w3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        x2 = x.view(-1, h)
        scores = F.softmax(self.gate(x2).float(), dim=-1)
        n = x2.shape[0]
        chosen = torch.arange(n * self.k).reshape(n, self.k) % self.num_experts
        top = scores.gather(1, chosen)
        counts = torch.bincount(chosen.view(-1), minlength=self.num_experts)
        order = torch.argsort(chosen.view(-1), stable=True)
        routed_input = x2[order // self.k]
        routed_output = self.experts(routed_input, counts)
        out = self.shared(x2) if self.shared is not None else None
        unsorted = torch.zeros((n * self.k, h), dtype=routed_output.dtype, device=routed_output.device)
        unsorted[order] = routed_output
        combined = torch.bmm(top.reshape(-1, 1, self.k), unsorted.reshape(-1, self.k, h).float()).to(x.dtype)
        combined = combined.squeeze(1)
        return (combined if out is None else combined + out).reshape(b, s, h)


def measure(spec: ModelSpec, op_sac: bool, mesh: DeviceMesh, seq: int, micro_batch: int) -> dict[str, Any]:
    """Bytes this rank's EP block keeps after its forward, and the alive storages (module docstring)."""
    torch.manual_seed(0)
    outer = OpSacBlock(spec, 0, seq)  # the same weights with or without SAC (the policy is built from the gate)
    block = outer.block
    reference = copy.deepcopy(block)  # all experts local, tp 1 MoE
    moe = block.feed_forward
    assert isinstance(moe, MoE)
    block.feed_forward = EPMoE(moe)
    ep_style = ExpertParallel()
    ep_style.apply(block.feed_forward.experts, mesh)
    run: nn.Module = outer if op_sac else block
    if not op_sac:
        block.attention.sdpa = False  # the tp 1 oracle's no-recompute block: flash attention's saved set
        reference.attention.sdpa = False
    torch.manual_seed(1 + mesh.get_local_rank())  # each rank its own tokens (dp = ep)
    x = torch.randn(micro_batch, seq, spec.hidden_size, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    mode = AliveStorages()
    with mode:
        y = run(x)
    # gloo runs a collective on a worker thread whose Work holds the input until the thread lets it go, a moment
    # after wait() returned: without this pause the dispatch or combine input (1 MiB each) is now and then still
    # alive (9 of 360 measurements). A transient of the CPU backend, not something autograd or the checkpoint keeps.
    time.sleep(0.2)
    kept, storages = kept_bytes(mode, y, x, block)
    splits = [list(ep_style.input_splits), list(ep_style.output_splits)]
    grad = torch.randn_like(y)
    replayed = ReplayedOps()
    with replayed:
        y.backward(grad)
    assert x.grad is not None and all(p.grad is not None for p in block.parameters())
    want = reference(x_ref)
    want.backward(grad)
    assert x_ref.grad is not None
    return {"kept": kept, "storages": storages, "splits": splits, "recomputed_flop": replayed.flop,
            "recomputed_collectives": replayed.collectives,
            "max_abs_err": (y.detach() - want.detach()).abs().max().item(),
            "max_grad_err": (x.grad - x_ref.grad).abs().max().item()}


def worker(rank: int, world: int, port: int, cases: list[tuple[ModelSpec, bool]], seq: int, micro_batch: int,
           out: str) -> None:
    run_cases(rank, world, port, cases, seq, micro_batch, out, measure, "ep")
