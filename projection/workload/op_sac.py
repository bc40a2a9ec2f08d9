"""The forward ops TorchTitan's per-op selective activation checkpointing re-runs before a block's backward.

TorchTitan's 'op' policy (torchtitan/distributed/activation_checkpoint.py; the save list in each model's
parallelize.py) keeps the outputs of SDPA, reduce_scatter, all_to_all_single and max, and of every `aten.mm` except
every second one counted in the block; the router gate's mm is recomputed without being counted (the default
`per_op_sac_force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]`). Everything else is re-run when the backward
first needs the block: norms, activations, RoPE and other memory-bound ops, the routed experts' `torch._grouped_mm`,
the counted mm calls the policy skips, and the TP all-gathers (`all_gather_into_tensor`, not in the list). A torchao
float8 linear counts as a bf16 one: it multiplies Float8Tensors with `torch.mm`, which the policy's dispatch mode
sees as `aten.mm` before the subclass turns it into `_scaled_mm` (tests/oracle/test_memory_torchtitan_float8_sac.py);
its casts are memory-bound ops, re-run. The saved set is memory/activations.op_sac_tensors.

projection's op list fuses some of TorchTitan's separate linears: `attn.qkv` stands for wq, wk, wv and a gated
`fc1` for w1, w3. Each is counted as the mm calls it stands for, and the recomputed share of it is re-run as one GEMM
of the recomputed width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.workload.ops_base import Op, gemm


def _mm_widths(op: Op, model: ModelSpec, plan: ParallelPlan) -> list[int]:
    """Output widths of the separate mm calls one GEMM of the op list stands for, in TorchTitan's order."""
    if op.name == "attn.qkv":
        heads, kv, d = model.num_attention_heads // plan.tp, max(1, model.kv_heads // plan.tp), model.head_dim_
        return [heads * d, kv * d, kv * d]  # wq, wk, wv
    if op.name.endswith(".fc1") and model.gated_mlp:
        return [op.m // 2, op.m // 2]  # w1, w3
    return [op.m]


def _narrowed(op: Op, width: int) -> Op:
    """The same GEMM producing only `width` of its output columns."""
    out_bytes = op.bytes_written / max(1.0, op.m * op.n * op.batch)
    return gemm(op.name, op.phase, width, op.n, op.k, op.dtype, out_bytes, layout=op.layout, batch=op.batch,
                tag=op.tag)


def op_sac_recompute(fwd: Sequence[Op], model: ModelSpec, plan: ParallelPlan, fp8_mm: bool = True) -> list[Op]:
    """The forward ops of one block that the per-op policy re-runs (module docstring), in forward order. `fp8_mm`:
    whether fp8 GEMMs reach the policy as aten.mm (Fp8Spec.mm_dispatched; Primus-Turbo's do not: re-run, not
    counted)."""
    count = 0
    chosen: list[Op] = []
    for op in fwd:
        if op.kind == "memory_bound" or op.kind == "grouped_gemm":
            chosen.append(op)
        elif op.kind == "collective":
            if op.coll == "all_gather":
                chosen.append(op)
        elif op.kind == "gemm" and ".core" not in op.name:  # the attention kernel's own GEMMs are SDPA's (kept)
            if op.name.endswith(".router") or (op.dtype == "fp8" and not fp8_mm):
                chosen.append(op)  # the force-recomputed router gate, or an op the policy does not see: re-run
                continue
            widths = _mm_widths(op, model, plan)
            redo = 0
            for w in widths:
                count += 1
                redo += w if count % 2 == 0 else 0
            if redo == op.m:
                chosen.append(op)
            elif redo:
                chosen.append(_narrowed(op, redo))
    return [replace(o, recompute=True) for o in chosen]
