"""Saved-activation bytes of a TorchTitan MoE decoder block under expert parallelism (ep 2), measured per rank on a
real CPU forward across 2 gloo processes, against the estimator.

The tp 1 oracle (test_memory_torchtitan_layers.py) has this one's method and block (tt-moe: hidden 256, 8 experts
top-2 with expert FFN 128, one shared expert of FFN 256; seq 256, micro batch 2, fp32). Here each of 2 spawned
processes (tests/oracle/torchtitan_ep_worker.py) builds that block, runs its MoE as TorchTitan's `MoE.forward` and
applies TorchTitan's `ExpertParallel` to the routed experts with `distribute_module` (the experts' weights Shard(0):
4 experts a rank; token dispatch: `all_to_all_single` of the per-expert counts, then of the routed copies, then the
rank-major -> expert-major permutation; combine: the inverse permutation and `all_to_all_single` back). The router
and the shared expert stay replicated, attention too: dp = ep = 2, each rank its own micro batch. Routing is
balanced (TorchTitan's `_debug_force_load_balance_routing`, the tp 1 block's choice): each rank sends 512 token copies
to each rank and its 4 experts receive 1024 = k T copies, what the estimator's balanced inventory assumes. Each rank's
output and input gradient are checked against the unsharded tp 1 block on the same tokens.

Per rank, alive after forward (less parameters, buffers and the block output, plus the block input): what it keeps
for backward without recompute (the tp 1 oracle's flash-attention stand-in) and under TorchTitan's per-op selective
checkpointing (`OpSacBlock`; its save list includes `_c10d_functional.all_to_all_single`, so the dispatch and combine
outputs are cached). The estimate is `projection.memory.activations.saved_layer_bytes` for the same ModelSpec, fp32,
`kernels.transformer_impl = "torchtitan"`, tp 1, ep 2, dp 2 (`moe_tensors` without recompute; `op_sac_tensors` under
'op', with `sac.all_to_all_out` = 2 e k T h for the two all_to_all outputs). Must agree within 1 % per rank, as at
tp 1.

Measured (both ranks alike): no recompute 10,559,504 B against 10,518,528 B projected (0.996; the difference is the
int64 routing indices (chosen experts, their sort, the token ids, the permutation: 8 kB each), the fp32 top-k scores
and the norms' per-row statistics, 40,976 B the estimator leaves out); op SAC
4,874,304 B against 4,866,048 B (0.998), of which the two routed all_to_all outputs are 1 MiB each. The ep 1
inventory is unchanged per rank at ep 2 with dp = ep and balanced routing (each rank's experts receive k T copies),
and autograd keeps no all_to_all output without recompute: the MoE's token-choice gather feeds the dispatch, whose
output only feeds the permutation gather (which saves its indices, not its input). `EPMoE` unsorts with index_put as
TorchTitan's `_unpermute` does (the tp 1 oracle's `MoE` used `index_copy`, whose derivative keeps its source, 1 MiB
TorchTitan does not keep, until this oracle showed it; both use index_put now).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

pytest.importorskip("torch")  # tests/oracle/spawn.py imports it
from tests.oracle.spawn import require_gloo  # noqa: E402

require_gloo()
import torch  # noqa: E402

try:
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import distribute_module  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the torch build
    pytest.skip(f"functional collectives / DTensor are not available: {exc}", allow_module_level=True)
if not hasattr(funcol, "all_to_all_single_autograd") or not hasattr(torch, "_grouped_mm"):
    pytest.skip("all_to_all_single_autograd or torch._grouped_mm is not available", allow_module_level=True)

from projection.specs.model import ModelSpec, MoESpec  # noqa: E402
from projection.specs.plan import ParallelPlan, RecomputeSpec  # noqa: E402
from projection.specs.training import KernelSpec, TrainingSpec  # noqa: E402
from projection.workload.ops import layer_ops  # noqa: E402
from tests.oracle.rank_probes import case_params, projected, run_ranks  # noqa: E402

pytestmark = pytest.mark.slow  # two spawned gloo processes, a forward and backward per case: seconds

EP, SEQ, MICRO_BATCH = 2, 256, 2

# the MoE block of test_memory_torchtitan_layers.py
MOE = ModelSpec(name="tt-moe", num_layers=1, hidden_size=256, num_attention_heads=8, num_kv_heads=2,
                ffn_hidden_size=704, vocab_size=1000,
                moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=128, shared_expert_ffn_hidden_size=256,
                            num_shared_experts=1))

CASES: list[tuple[ModelSpec, bool]] = [(MOE, False), (MOE, True)]


def _setup(op_sac: bool) -> tuple[TrainingSpec, ParallelPlan]:
    training = TrainingSpec(seq_length=SEQ, micro_batch_size=MICRO_BATCH, params_dtype="fp32",
                            attention_backend="flash", kernels=KernelSpec(transformer_impl="torchtitan"))
    rec = RecomputeSpec(granularity="selective", modules=("op",)) if op_sac else RecomputeSpec()
    return training, ParallelPlan(tp=1, pp=1, dp=EP, ep=EP, recompute=rec)


@functools.cache
def _measured() -> list[list[dict[str, Any]]]:
    """Per rank, per case of CASES: {"kept", "storages", "splits", "max_abs_err", "max_grad_err"}."""
    from tests.oracle.torchtitan_ep_worker import worker

    return run_ranks(worker, EP, CASES, SEQ, MICRO_BATCH, "TorchTitan EP block")


def _report(spec: ModelSpec, op_sac: bool, rank: int) -> tuple[float, int]:
    m = _measured()[rank][CASES.index((spec, op_sac))]
    want, got = m["kept"], projected(spec, *_setup(op_sac))[1]
    print(f"\n{spec.name} {'op SAC' if op_sac else 'no AC'} ep {EP} rank {rank}: projected {got:.0f} B, measured "
          f"{want} B, ratio {got / want:.4f}; splits in/out {m['splits']}, output max |err| {m['max_abs_err']:.2e}"
          "\n  projected: " + ", ".join(f"{k} {v:.0f}" for k, v in projected(spec, *_setup(op_sac))[0].items())
          + "\n  alive: " + ", ".join(f"{op} {tuple(shape)} {dtype.removeprefix('torch.')} {n}"
                                      for n, op, shape, dtype in sorted(m["storages"], key=lambda s: -s[0])))
    return got, want


PARAMS = case_params(CASES, EP)


@pytest.mark.parametrize(("spec", "op_sac", "rank"), PARAMS)
def test_torchtitan_ep_block_saved_bytes(spec: ModelSpec, op_sac: bool, rank: int) -> None:
    got, want = _report(spec, op_sac, rank)
    assert abs(got / want - 1) <= 0.01


def test_ep_blocks_are_dispatched_and_correct() -> None:
    """Every rank's EP block reproduces the unsharded block's output and input gradient on its tokens, and its
    all_to_all moved half of its 1024 routed copies to the other rank (balanced): the comparisons above are of a
    real expert-parallel forward."""
    assert MOE.moe is not None
    copies = MOE.moe.top_k * MICRO_BATCH * SEQ
    for rank in range(EP):
        for (spec, op_sac), m in zip(CASES, _measured()[rank], strict=True):
            assert m["max_abs_err"] < 1e-4 and m["max_grad_err"] < 1e-4, (spec.name, op_sac, rank, m)
            assert m["splits"] == [[copies // EP] * EP] * 2, (spec.name, op_sac, rank, m["splits"])


def test_all_to_all_outputs_kept_only_under_op_sac() -> None:
    """Under per-op SAC the rank keeps exactly the two routed all_to_all_single outputs (dispatch and combine, k T h
    fp32 each: what `sac.all_to_all_out` counts) plus the 64-byte token-count exchange; without recompute autograd
    keeps none of them (the permutation gather and the all_to_all save no input): the ep 2 term is exercised."""
    assert MOE.moe is not None
    routed = 4 * MOE.moe.top_k * MICRO_BATCH * SEQ * MOE.hidden_size
    for rank in range(EP):
        for (spec, op_sac), m in zip(CASES, _measured()[rank], strict=True):
            a2a = sorted(n for n, op, _, _ in m["storages"] if "all_to_all_single" in op)
            assert a2a == ([8 * MOE.moe.num_experts, routed, routed] if op_sac else []), (spec.name, op_sac, rank)
            assert projected(spec, *_setup(op_sac))[0].get("sac.all_to_all_out", 0.0) == (2 * routed if op_sac else 0.0)


def test_op_sac_recompute_per_rank() -> None:
    """Under 'op' at ep 2, the GEMM and grouped-GEMM FLOPs the op list re-runs before the block's backward equal the
    ones each rank's backward replayed (the grouped GEMMs over its 4 local experts' k T copies), and, the dispatch
    and combine outputs being kept, no all_to_all is replayed: the backward issues the no-recompute block's
    collectives and no more."""
    training, plan = _setup(True)
    projected = sum(o.flop for o in layer_ops(MOE, training, plan, 0)
                    if o.recompute and o.kind in ("gemm", "grouped_gemm"))
    assert not [o for o in layer_ops(MOE, training, plan, 0) if o.recompute and o.kind == "collective"]
    for rank in range(EP):
        sac = _measured()[rank][CASES.index((MOE, True))]
        plain = _measured()[rank][CASES.index((MOE, False))]
        print(f"\ntt-moe ep {EP} rank {rank}: recomputed GEMM FLOPs projected {projected / 1e9:.4f} G, measured "
              f"{sac['recomputed_flop'] / 1e9:.4f} G; backward collectives {sac['recomputed_collectives']} "
              f"(no recompute: {plain['recomputed_collectives']})")
        assert sac["recomputed_flop"] > 0
        assert projected == pytest.approx(sac["recomputed_flop"], rel=1e-9)
        assert sac["recomputed_collectives"] == plain["recomputed_collectives"]
