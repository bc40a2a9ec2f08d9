"""Parameter counts: whole model by component, and per rank after pipeline split and TP/EP/ETP sharding.

Sharding follows Megatron-core (megatron/core/transformer/*, tensor_parallel/layers.py):
- column-parallel (output dim split over TP, bias split too): QKV, MLA q_proj / q_up / kv_up, fc1, eh_proj (MTP);
- row-parallel (input dim split, bias replicated): attention output proj, fc2;
- replicated on every TP rank: norms, router, MLA down projections (TELinear parallel_mode="duplicated") and their
  norms, qk norms, learned position embeddings, shared-expert gate;
- vocab-parallel: word embedding and output layer rows (padded vocab / TP);
- experts: ep ranks hold num_experts / ep experts each, each expert's fc1/fc2 split over etp like fc1/fc2 over TP.
With tied embeddings and pp > 1 the last stage holds its own copy of the word embedding for the output layer
(Megatron LanguageModule.setup_embeddings_and_output_layer); it counts per rank, not in the model total.
"""

from __future__ import annotations

from dataclasses import dataclass

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.workload.stages import split_stages

COMPONENTS = ("embedding", "attention", "dense_mlp", "router", "experts", "shared_experts", "norms", "output", "mtp")


@dataclass(frozen=True)
class Sharding:
    tp: int = 1
    ep: int = 1
    etp: int = 1


def _norm(model: ModelSpec, width: int) -> int:
    """LayerNorm has weight and bias, RMSNorm a weight only."""
    return width * (2 if model.norm == "layernorm" else 1)


def attention_params(model: ModelSpec, sh: Sharding = Sharding()) -> int:
    """One self-attention block (without its input norm)."""
    h, tp = model.hidden_size, sh.tp
    bias_o = h if model.add_bias_linear else 0  # row-parallel bias: replicated
    if model.mla is not None:
        m, heads = model.mla, model.num_attention_heads
        q_head = m.qk_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank * heads * q_head // tp
            q_norm = m.q_lora_rank if model.qk_norm else 0
        else:
            q, q_norm = h * heads * q_head // tp, 0
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * heads * (m.qk_head_dim + m.v_head_dim) // tp
        kv_norm = m.kv_lora_rank if model.qk_norm else 0
        out = heads * m.v_head_dim * h // tp
        return q + q_norm + kv + kv_norm + out + bias_o
    d, heads, kv_heads = model.head_dim_, model.num_attention_heads, model.kv_heads
    qkv_out = (heads + 2 * kv_heads) * d
    qkv = h * qkv_out // tp
    qkv_bias = qkv_out // tp if (model.add_bias_linear or model.add_qkv_bias) else 0
    out = heads * d * h // tp
    qk_norm = 2 * _norm(model, d) if model.qk_norm else 0  # per-head Q and K norms, shared across heads
    return qkv + qkv_bias + out + bias_o + qk_norm


def mlp_params(model: ModelSpec, ffn: int, shard: int = 1, bias: bool | None = None) -> int:
    """A (gated) MLP h -> ffn -> h with fc1/fc2 split over `shard` ranks."""
    h = model.hidden_size
    bias = model.add_bias_linear if bias is None else bias
    branches = 2 if model.gated_mlp else 1
    fc1 = h * branches * ffn // shard + (branches * ffn // shard if bias else 0)
    fc2 = ffn * h // shard + (h if bias else 0)
    return fc1 + fc2


def layer_params(model: ModelSpec, i: int, sh: Sharding = Sharding()) -> dict[str, int]:
    """Decoder layer i on one rank, by component."""
    out = dict.fromkeys(COMPONENTS, 0)
    out["attention"] = attention_params(model, sh)
    out["norms"] = 2 * _norm(model, model.hidden_size)  # input norm + pre-MLP norm
    moe = model.moe
    if moe is not None and model.is_moe_layer(i):
        e = moe.num_experts
        out["router"] = e * model.hidden_size + (e if moe.router_bias else 0)
        out["experts"] = (e // sh.ep) * mlp_params(model, moe.expert_ffn_hidden_size, sh.etp)
        if moe.shared_expert_ffn_hidden_size:
            out["shared_experts"] = mlp_params(model, moe.shared_expert_ffn_hidden_size, sh.tp)
            out["shared_experts"] += model.hidden_size if moe.shared_expert_gate else 0
    else:
        out["dense_mlp"] = mlp_params(model, model.ffn_hidden_size, sh.tp)
    return out


def embedding_params(model: ModelSpec, tp: int = 1, vocab_tp: int | None = None) -> int:
    """Word embedding rows (padded vocab) split over TP, plus a learned position table (replicated)."""
    v = model.padded_vocab(vocab_tp or tp)
    pos = (model.max_position_embeddings or 0) * model.hidden_size if model.position_embedding == "learned" else 0
    return v * model.hidden_size // tp + pos


def output_params(model: ModelSpec, tp: int = 1, vocab_tp: int | None = None) -> int:
    return model.padded_vocab(vocab_tp or tp) * model.hidden_size // tp


def mtp_params(model: ModelSpec, sh: Sharding = Sharding()) -> int:
    """One MTP depth (Megatron MultiTokenPredictionLayer): enorm, hnorm, eh_proj 2h -> h (column-parallel, no
    bias), one transformer layer built like the last decoder layer, and a final norm."""
    h = model.hidden_size
    layer = sum(layer_params(model, model.num_layers - 1, sh).values())
    return 3 * _norm(model, h) + 2 * h * h // sh.tp + layer


def model_params(model: ModelSpec, vocab_tp: int = 1) -> dict[str, int]:
    """Whole-model parameters by component (unsharded; vocab padded as it would be at TP = vocab_tp)."""
    out = dict.fromkeys(COMPONENTS, 0)
    for i in range(model.num_layers):
        for k, v in layer_params(model, i).items():
            out[k] += v
    out["embedding"] = embedding_params(model, 1, vocab_tp)
    out["norms"] += _norm(model, model.hidden_size)  # final norm
    out["output"] = 0 if model.tie_embeddings else output_params(model, 1, vocab_tp)
    out["mtp"] = model.mtp_num_layers * mtp_params(model)
    return out


def activated_params(model: ModelSpec, vocab_tp: int = 1) -> int:
    """Parameters one token passes through: routed experts count top_k of num_experts (DeepSeek-V3: 37B of 671B).
    Embedding rows are looked up, not multiplied, but are counted as published totals do (HF/DeepSeek convention)."""
    total = model_params(model, vocab_tp)
    moe = model.moe
    if moe is None:
        return sum(total.values())
    experts_all = total["experts"] + (model.mtp_num_layers * layer_params(model, model.num_layers - 1)["experts"]
                                      if model.is_moe_layer(model.num_layers - 1) else 0)
    return sum(total.values()) - experts_all + experts_all * moe.top_k // moe.num_experts


@dataclass(frozen=True)
class RankParams:
    """Parameters held by one rank of pipeline stage `pp_rank` (every TP/EP rank of a stage holds the same count).
    `by_component["experts"]` holds every routed expert the rank holds, an MTP depth's among them (sharded over the
    expert grid like the decoder's, Megatron builds the depth's layer like the last decoder layer); "mtp" the rest of
    the depths."""

    pp_rank: int
    params: int
    by_component: dict[str, int]
    layers: tuple[int, ...]
    chunks: int


def per_rank_params(model: ModelSpec, plan: ParallelPlan) -> list[RankParams]:
    """Parameters per pipeline rank after the stage split and TP/EP/ETP sharding."""
    sh = Sharding(plan.tp, plan.ep, plan.etp_)
    acc: dict[int, dict[str, int]] = {r: dict.fromkeys(COMPONENTS, 0) for r in range(plan.pp)}
    layers: dict[int, list[int]] = {r: [] for r in range(plan.pp)}
    stages = split_stages(model, plan)
    per_kind: dict[bool, dict[str, int]] = {}
    for slot in stages:
        c = acc[slot.pp_rank]
        layers[slot.pp_rank] += slot.layers
        for i in slot.layers:
            kind = model.is_moe_layer(i)  # every dense (every MoE) layer has the same parameters
            if kind not in per_kind:
                per_kind[kind] = layer_params(model, i, sh)
            for k, v in per_kind[kind].items():
                c[k] += v
        if slot.embedding:
            c["embedding"] += embedding_params(model, plan.tp)
        if slot.loss:
            c["norms"] += _norm(model, model.hidden_size)
            # Tied embeddings: the output layer reuses the embedding on the same stage, else a copy is kept.
            if not model.tie_embeddings or not slot.embedding:
                c["output"] += output_params(model, plan.tp)
        if slot.mtp_layers:
            mtp_experts = layer_params(model, model.num_layers - 1, sh)["experts"]
            c["mtp"] += slot.mtp_layers * (mtp_params(model, sh) - mtp_experts)
            c["experts"] += slot.mtp_layers * mtp_experts
        if slot.mtp_layers and not slot.embedding:
            # MTP depths embed their shifted inputs: Megatron GPTModel builds `embedding` when mtp_process.
            c["embedding"] += embedding_params(model, plan.tp)
    return [RankParams(r, sum(acc[r].values()), acc[r], tuple(layers[r]), plan.vpp_) for r in range(plan.pp)]
