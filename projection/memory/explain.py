"""`projection memory --explain`: each memory term as a sympy formula and with the numbers substituted.

Activation terms are derived by running the same inventory functions (activations.py) on sympy symbols for the
batch, sequence, hidden and element-size dimensions, so the printed formula is the code's own arithmetic, not a
second transcription. Model-state formulas are written out here; tests check that every formula evaluates to the
estimator's number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import sympy as sp

from projection.memory import activations as act
from projection.memory.model_states import shard_groups
from projection.memory.offload import layer_offload_splits
from projection.memory.report import MemoryReport
from projection.specs.scenario import Scenario
from projection.specs.training import DTYPE_BYTES
from projection.workload.params import per_rank_params
from projection.workload.stages import split_stages

b, s, h, e = sp.symbols("b s h e", positive=True)


def layer_formula(sc: Scenario, i: int) -> tuple[sp.Expr, Mapping[sp.Symbol, float]]:
    """Saved bytes of decoder layer i per microbatch as a formula in b, s, h, e (no recompute)."""
    m, p = sc.model, sc.plan
    t = sc.training.for_layer(i, m.num_layers)  # a layer kept in bf16 under fp8 saves bf16 inputs
    D = act.dims(m, t, p)
    sym = replace(D, b=b, s=s, T=b * s, h=h, e=e, e_lin=e if D.e_lin == D.e else D.e_lin,
                  e_blk=e if D.e_blk == D.e else D.e_blk, e_exp=e if D.e_exp == D.e else D.e_exp)
    terms = act.attention_tensors(m, sym)
    if m.is_moe_layer(i):
        terms.update(act.moe_tensors(m, p, sym))
    else:
        terms.update(act.mlp_tensors(m, sym, m.ffn_hidden_size))
    expr = sp.nsimplify(sum(terms.values()), rational=True)
    return sp.simplify(expr), {b: D.b, s: D.s, h: D.h, e: D.e}


def state_formulas(sc: Scenario, pp_rank: int) -> list[tuple[str, sp.Expr, Mapping[sp.Symbol, float]]]:
    """Weights, gradients and optimizer formulas for one rank (Megatron mixed precision; ZeRO / FSDP sharding)."""
    rp = per_rank_params(sc.model, sc.plan)[pp_rank]
    P_d, P_e, G_d, G_e = sp.symbols("P_dense P_expert d_dense d_expert", positive=True)
    g_d, g_e = shard_groups(sc.plan)
    opt, zero = sc.training.optimizer, sc.plan.sharding.zero_stage
    fsdp2 = zero == 3 and sc.plan.sharding.fsdp == "torch_fsdp2"
    mixed = sc.training.params_dtype != "fp32"
    pbytes = DTYPE_BYTES[sc.training.params_dtype]

    def n(stage: int) -> sp.Expr:
        return P_d / G_d + P_e / G_e if zero >= stage else P_d + P_e

    moment_bytes = sum(DTYPE_BYTES[d] for d in [opt.exp_avg_dtype, opt.exp_avg_sq_dtype][: opt.num_moments])
    master = DTYPE_BYTES[opt.main_params_dtype] if (mixed and not fsdp2) else 0
    w_bytes = (DTYPE_BYTES[opt.main_params_dtype] if mixed else pbytes) if fsdp2 else pbytes
    g_bytes = (DTYPE_BYTES[opt.main_params_dtype if fsdp2 else opt.main_grads_dtype]) if mixed else pbytes
    experts = rp.by_component.get("experts", 0)
    subs: dict[sp.Symbol, float] = {P_d: rp.params - experts, P_e: experts, G_d: g_d, G_e: g_e}
    off = sc.plan.offload
    # the share kept on the CPU (projection/memory/model_states.py): the optimizer's offload fraction; with FSDP2 CPU
    # offload the sharded params, grads and optimizer state
    f_cpu = 1.0 if off.fsdp_params else off.optimizer_fraction if off.optimizer else 0.0
    F = sp.Symbol("f_cpu", nonnegative=True)
    on_gpu: sp.Expr = 1 - F if f_cpu else sp.Integer(1)
    if f_cpu:
        subs[F] = f_cpu
    state_gpu: sp.Expr = on_gpu if off.fsdp_params else sp.Integer(1)
    return [
        ("weights (params)", n(3) * w_bytes * state_gpu, subs),
        ("gradients (main grads)", n(2) * g_bytes * state_gpu, subs),
        # FSDP2's fp32 master is the sharded parameter itself (the weights line); mixed precision elsewhere keeps a
        # master copy beside the moments; without mixed precision there is none
        ("optimizer (master + moments)" if master else "optimizer (moments)", n(1) * (master + moment_bytes)
         * on_gpu, subs),
    ]


# the categories whose addends are named sizes at the peak's moment (no formula), by the prefixes of their terms
_MOMENT_TERMS = {"activations": ("activations", "working"), "buffers": ("buffers",), "other": ("optimizer_step",)}
_MAIN_TERMS = {"weights": ("weights.params", "weights.sharded"), "gradients": ("gradients.main",),
               "optimizer": ("optimizer.master", "optimizer.moments")}


def explain(report: MemoryReport) -> str:
    sc = report.scenario
    lines = ["Formulas (bytes). P = parameters on the rank (dense / expert), d = shard group sizes, b micro batch, "
             "s local sequence, h hidden, e bytes per activation element.", ""]
    for r in report.ranks:
        lines.append(f"pp_rank {r.pp_rank}:")
        for (name, expr, subs), category in zip(state_formulas(sc, r.pp_rank), _MAIN_TERMS, strict=True):
            value = float(expr.subs(subs))
            lines.append(f"  {name:<30} {sp.sstr(expr):<44} = {_subs_text(subs)} -> {value:,.0f}")
            main = sum(r.terms.get(k, 0) for k in _MAIN_TERMS[category])
            fp8_params = sc.training.fp8 is not None and sc.training.fp8.param_gather and category == "weights"
            if fp8_params and round(value) != main:  # the fp8 linear weights, 1 B each (model_states.py)
                lines.append(f"    - {'fp8 linear weights (1 B, --fp8-param-gather)':<48} "
                             f"{round(value) - main:,.0f}")
            extra = {k: v for k, v in r.terms.items() if k.startswith(category + ".") and k not in
                     _MAIN_TERMS[category]}
            for k, v in extra.items():  # addends the formula does not hold (fp8 copies, FSDP units in flight, ...)
                lines.append(f"    + {k:<48} {v:,.0f}")
            if extra or (fp8_params and round(value) != main):
                lines.append(f"    = {category:<48} {r.bytes[category]:,.0f}")
        done: set[str] = set()
        layers = per_rank_params(sc.model, sc.plan)[r.pp_rank].layers
        f8 = sc.training.fp8
        for i in layers:
            kind = "MoE layer" if sc.model.is_moe_layer(i) else "dense layer"
            if f8 is not None and not f8.layer_in_fp8(i, sc.model.num_layers):
                kind += " in bf16"  # a first or last layer outside fp8 (Fp8Spec.layer_in_fp8)
            if kind in done:
                continue
            done.add(kind)
            expr, subs = layer_formula(sc, i)
            lines.append(f"  activations per {kind:<24} {sp.sstr(expr)}  with {_subs_text(subs)} -> "
                         f"{float(expr.subs(subs)):,.0f} per microbatch (before recompute)")
        lines.append(f"  in-flight microbatches at the peak, per virtual stage: {r.inflight}")
        lines += _inflight_lines(sc, r.inflight, r.microbatch_activation_bytes)
        # the addends of the other categories at the rank's peak, as counted (activations after recompute and times
        # the microbatches in flight, the working set of that moment; framework buffers; the optimizer step's own
        # transient buffers), each category closed by the total the table prints
        for category, prefixes in _MOMENT_TERMS.items():
            terms = {k: v for k, v in r.terms.items() if k.split(".")[0] in prefixes}
            if not terms and not r.bytes.get(category):
                continue
            for k, v in terms.items():
                lines.append(f"  {k:<50} {v:,.0f}")
            lines.append(f"    = {category:<48} {r.bytes[category]:,.0f}")
        lines.append("")
    return "\n".join(lines)


def _inflight_lines(sc: Scenario, inflight: Mapping[int, int], per_microbatch: Mapping[int, int]) -> list[str]:
    """What the in-flight sets hold: per virtual stage, the microbatches in flight times what one leaves saved there
    after recompute (its layers, and the embedding or loss where the stage has them), summing to the activations.*
    terms above the working set's (an audit found the per-layer size before recompute the only one printed)."""
    slots = {slot.stage: slot for slot in split_stages(sc.model, sc.plan)}
    memo: dict[tuple[object, ...], tuple[float, float]] = {}
    out = ["  saved at the peak, per virtual stage: in flight x one microbatch's saved bytes after recompute"]
    total = 0
    for stage, n in sorted(inflight.items()):
        slot, each = slots[stage], per_microbatch.get(stage, 0)
        parts = [f"{len(slot.layers)} layer{'s' if len(slot.layers) != 1 else ''}",
                 *(["embedding"] if slot.embedding else []), *(["loss"] if slot.loss else [])]
        # what one layer keeps, where the stage holds layers alone and all keep the same (not a mean over mixed
        # layers: a block recompute keeps some whole, others their inputs)
        kept = {int(resident) for _, resident, _ in layer_offload_splits(sc, slot, memo)}
        one = kept.pop() if len(kept) == 1 else 0
        a_layer = f", {one:,} a layer" if one and one * len(slot.layers) == each and not (
            slot.embedding or slot.loss or slot.mtp_layers) else ""
        out.append(f"    stage {stage} ({' + '.join(parts)}{a_layer}): {n} x {each:,} = {n * each:,}")
        total += n * each
    out.append(f"    = {'saved activations (the activations.* terms)':<48} {total:,}")
    return out


def _subs_text(subs: Mapping[sp.Symbol, float]) -> str:
    """The substituted values, whole numbers in full (a parameter count of 2,271,543,296 shown as 2.27154e+09 could
    not be checked against the bytes it gives)."""
    return ", ".join(f"{k}={int(v)}" if float(v).is_integer() else f"{k}={v:g}" for k, v in subs.items())
