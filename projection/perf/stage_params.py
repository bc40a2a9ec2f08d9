"""Parameters of one virtual pipeline stage on one rank (after TP/EP/ETP sharding), split into dense and expert
parameters (they are reduced over different data-parallel groups), and the per-component split FSDP gathers by.

Counts follow projection.workload.params (Megatron-core sharding); a stage holds its decoder layers, the word
embedding on the first stage (and on an MTP stage that is not the first), the output layer on the loss stage (unless
tied to an embedding on the same stage) with the final norm, and its MTP depths.
"""

from __future__ import annotations

from dataclasses import dataclass

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import DTYPE_BYTES, TrainingSpec
from projection.workload.params import Sharding, embedding_params, layer_params, mtp_params, output_params
from projection.workload.stages import StageSlot


@dataclass(frozen=True)
class StageParams:
    """Parameters (elements) of one virtual stage on one rank. `components` lists (name, dense, expert) in forward
    order: 'embedding', 'layer<i>', 'mtp<d>', 'output' (the FSDP units); `tensors` counts parameter tensors.
    `hooked` lists per component (name, tensors, elements) of the parameters whose gradient no GEMM writes: norms,
    biases and the embedding tables (their gradients are added into the main-gradient buffer by a hook, one kernel
    per tensor per microbatch; norm and bias vectors counted as hidden_size elements each, tables exactly).
    `expert_tensors`: how many of `tensors` are expert parameters (they live in the expert gradient buffer)."""

    dense: int
    expert: int
    components: tuple[tuple[str, int, int], ...]
    tensors: int
    hooked: tuple[tuple[str, int, int], ...] = ()
    expert_tensors: int = 0

    @property
    def total(self) -> int:
        return self.dense + self.expert


def _norm_tensors(model: ModelSpec) -> int:
    return 2 if model.norm == "layernorm" else 1


def _layer_tensors(model: ModelSpec, moe_layer: bool, local_experts: int) -> int:
    """Parameter tensors of one decoder layer: norms, attention linears (+ biases), MLP or router + experts."""
    bias = 1 if model.add_bias_linear else 0
    n = 2 * _norm_tensors(model)
    if model.mla is not None:
        n += 5 + (1 if model.mla.q_lora_rank else 0) + (2 if model.qk_norm else 0)
    else:
        biases = 2 if model.add_bias_linear else (1 if model.add_qkv_bias else 0)  # QKV and output projection
        n += 2 + biases + (2 if model.qk_norm else 0)
    moe = model.moe
    if moe_layer and moe is not None:
        n += 1 + 2 * local_experts * (1 + bias)  # router; fc1/fc2 per local expert (TE grouped: one per expert)
        n += 2 * (1 + bias) if moe.shared_expert_ffn_hidden_size else 0
    else:
        n += 2 * (1 + bias)
    return n


def _expert_tensors(model: ModelSpec, moe_layer: bool, local_experts: int) -> int:
    """The routed-expert tensors of one decoder layer (fc1 and fc2 per local expert, with their biases)."""
    bias = 1 if model.add_bias_linear else 0
    return 2 * local_experts * (1 + bias) if moe_layer and model.moe is not None else 0


def _vector_tensors(model: ModelSpec, moe_layer: bool, local_experts: int) -> int:
    """The norm and bias tensors of one decoder layer (the rest of _layer_tensors are GEMM weight matrices)."""
    bias = 1 if model.add_bias_linear else 0
    n = 2 * _norm_tensors(model) + (2 if model.qk_norm else 0)
    if model.mla is None:
        n += 2 if model.add_bias_linear else (1 if model.add_qkv_bias else 0)
    moe = model.moe
    if moe_layer and moe is not None:
        n += 2 * local_experts * bias + (2 * bias if moe.shared_expert_ffn_hidden_size else 0)
    else:
        n += 2 * bias
    return n


def stage_params(model: ModelSpec, plan: ParallelPlan, slot: StageSlot) -> StageParams:
    """Dense and expert parameters of virtual stage `slot` on one of its ranks."""
    sh = Sharding(plan.tp, plan.ep, plan.etp_)
    local_experts = model.moe.num_experts // plan.ep if model.moe is not None else 0
    comps: list[tuple[str, int, int]] = []
    hooked: list[tuple[str, int, int]] = []
    tensors = 0
    expert_tensors = 0
    h = model.hidden_size
    if slot.embedding or slot.mtp_layers:
        comps.append(("embedding", embedding_params(model, plan.tp), 0))
        tables = 1 + (1 if model.position_embedding == "learned" else 0)
        tensors += tables
        hooked.append(("embedding", tables, comps[-1][1]))
    for i in slot.layers:
        p = layer_params(model, i, sh)
        comps.append((f"layer{i}", sum(p.values()) - p["experts"], p["experts"]))
        tensors += _layer_tensors(model, model.is_moe_layer(i), local_experts)
        expert_tensors += _expert_tensors(model, model.is_moe_layer(i), local_experts)
        vectors = _vector_tensors(model, model.is_moe_layer(i), local_experts)
        hooked.append((f"layer{i}", vectors, vectors * h))
    last = model.num_layers - 1
    for depth in range(slot.mtp_layers):
        experts = layer_params(model, last, sh)["experts"]
        comps.append((f"mtp{depth}", mtp_params(model, sh) - experts, experts))
        tensors += _layer_tensors(model, model.is_moe_layer(last), local_experts) + 3 * _norm_tensors(model) + 1
        expert_tensors += _expert_tensors(model, model.is_moe_layer(last), local_experts)
        vectors = _vector_tensors(model, model.is_moe_layer(last), local_experts) + 3 * _norm_tensors(model)
        hooked.append((f"mtp{depth}", vectors, vectors * h))
    if slot.loss:
        norm = model.hidden_size * (2 if model.norm == "layernorm" else 1)
        out = 0 if (model.tie_embeddings and slot.embedding) else output_params(model, plan.tp)
        comps.append(("output", norm + out, 0))
        tensors += _norm_tensors(model) + (1 if out else 0)
        hooked.append(("output", _norm_tensors(model), norm))
    dense = sum(c[1] for c in comps)
    expert = sum(c[2] for c in comps)
    return StageParams(dense, expert, tuple(comps), tensors, tuple(hooked), expert_tensors)


def gather_bytes(training: TrainingSpec, num_layers: int, component: str, dense: float, expert: float
                 ) -> tuple[float, float]:
    """Bytes a parameter all-gather moves for one component's (dense, expert) elements: the params dtype, or 1 B per
    GEMM weight the FP8 library converts when parameters are gathered in fp8 (Megatron --fp8-param-gather, torchao
    enable_fsdp_float8_all_gather: the unsharded weight is the fp8 tensor). A decoder layer's norms and biases are a
    negligible share and go at 1 B with its weights; embeddings, the output layer unless it is an FP8 GEMM, and the
    decoder layers kept in bf16 (Fp8Spec.layer_in_fp8 of `num_layers`: their weights are bf16 parameters) keep the
    params dtype."""
    pb = DTYPE_BYTES[training.params_dtype]
    f = training.fp8
    if component.startswith("layer") and f is not None and not f.layer_in_fp8(int(component[5:]), num_layers):
        f = None
    if f is None or not f.param_gather:
        return dense * pb, expert * pb
    gemm = f.gathers_in_fp8("attention") if component.startswith(("layer", "mtp")) else f.gathers_in_fp8(component)
    return dense * (1 if gemm else pb), expert * (1 if f.gathers_in_fp8("experts") else pb)
