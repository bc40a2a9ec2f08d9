"""Sequence-parallel TP as Megatron runs it and as TorchTitan's DTensor plan runs it (ParallelPlan.tp_style).

Megatron's column-parallel linear saves its sequence-sharded input and all-gathers it again for the weight gradient
(Korthikanti et al. 2022 §4.2.2). TorchTitan gathers the block input in PrepareModuleInput (Shard(1) -> Replicate)
before ColwiseParallel, so the gathered tensor is what the linear saves, and backward needs no second gather. Under
torchao float8 TorchTitan v0.2.2 still gathers and saves bf16 (its models take Float8ColwiseParallel only for the legacy
converter name "float8", which v0.2.2 does not register)."""

from __future__ import annotations

from projection.memory.activations import layer_tensors
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import Fp8Spec, TrainingSpec
from projection.workload.ops import embedding_ops, layer_ops, output_ops

MODEL = ModelSpec(num_layers=2, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000)
TP, TOKENS = 4, 2 * 2048


def _plan(style: str) -> ParallelPlan:
    return ParallelPlan(tp=TP, sp=True, dp=1, tp_style=style)  # type: ignore[arg-type]


def _training(fp8: Fp8Spec | None = None) -> TrainingSpec:
    return TrainingSpec(seq_length=2048, micro_batch_size=2, global_batch_size=2, fp8=fp8)


def test_dtensor_tp_saves_the_gathered_input() -> None:
    mega = layer_tensors(MODEL, _training(), _plan("megatron"), 0)
    titan = layer_tensors(MODEL, _training(), _plan("dtensor"), 0)
    for name in ("attn.linear_in", "mlp.linear_in"):
        assert mega[name] == 2 * TOKENS * 1024 / TP and titan[name] == 2 * TOKENS * 1024, name
    assert mega["attn.norm_in"] == titan["attn.norm_in"] == 2 * TOKENS * 1024 / TP  # SequenceParallel norms
    fp8 = layer_tensors(MODEL, _training(Fp8Spec(recipe="tensorwise", library="torchao")), _plan("dtensor"), 0)
    assert fp8["attn.linear_in"] == titan["attn.linear_in"] and fp8["mlp.fc2_in"] == titan["mlp.fc2_in"]


def _gathers(style: str, fp8: Fp8Spec | None = None) -> list[tuple[str, float]]:
    ops = layer_ops(MODEL, _training(fp8), _plan(style), 0)
    return [(op.phase, op.coll_bytes) for op in ops if op.kind == "collective" and op.coll == "all_gather"]


def test_dtensor_tp_does_not_gather_again_for_the_weight_gradient() -> None:
    size = TOKENS * 1024 * 2
    assert sorted(_gathers("megatron")) == sorted([("F", size)] * 2 + [("W", size)] * 2 + [("I", size)] * 2)
    assert sorted(_gathers("dtensor")) == sorted([("F", size)] * 2 + [("I", size)] * 2)
    fp8 = _gathers("dtensor", Fp8Spec(recipe="tensorwise", library="torchao"))
    assert sorted(fp8) == sorted([("F", size)] * 2 + [("I", size)] * 2)  # bf16 gathers in TorchTitan v0.2.2


def test_dtensor_mla_gathers_the_hidden_state_not_the_latents() -> None:
    """TorchTitan's DeepSeek plan gathers the attention input once (PrepareModuleInput), runs the down projections
    (NoParallel) on every token, and gathers no latent; Megatron gathers the KV latent and runs the downs on its
    shard."""
    mla = ModelSpec(num_layers=2, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000,
                    mla={"q_lora_rank": 512, "kv_lora_rank": 256, "qk_head_dim": 64, "qk_rope_head_dim": 32,
                         "v_head_dim": 64})
    ops = {style: layer_ops(mla, _training(), _plan(style), 0) for style in ("megatron", "dtensor")}
    titan = [(o.name, o.phase, o.coll_bytes) for o in ops["dtensor"] if o.kind == "collective" and o.tag == "attn"]
    assert ("attn.in.ag", "F", TOKENS * 1024 * 2) in titan and not [n for n, *_ in titan if "latent" in n]
    assert any("kv_latent" in o.name for o in ops["megatron"] if o.kind == "collective")
    downs = {o.name: o.n for o in ops["dtensor"] if o.name in ("attn.q_down", "attn.kv_down")}
    assert downs == {"attn.q_down": TOKENS, "attn.kv_down": TOKENS}  # every token, not the rank's shard


def test_transformer_engine_fp8_gathers_in_fp8() -> None:
    """Transformer Engine casts before it gathers: the norm writes the column-parallel input in fp8 and
    `gather_along_first_dim` moves those bytes (layernorm_linear.py), backward re-gathers the same fp8 tensor for the
    weight gradient, and the row-parallel backward casts dy before gathering it (`grad_output_preprocess`). The
    reduce-scatters carry bf16 outputs and gradients, and Megatron's output layer (never an fp8 GEMM) gathers bf16."""
    size = TOKENS * 1024
    te = Fp8Spec(library="transformer_engine")
    assert sorted(_gathers("megatron", te)) == sorted([("F", size)] * 2 + [("W", size)] * 2 + [("I", size)] * 2)
    ops = layer_ops(MODEL, _training(te), _plan("megatron"), 0)
    assert {o.coll_bytes for o in ops if o.coll == "reduce_scatter"} == {2 * size}
    out = [o.coll_bytes for o in output_ops(MODEL, _training(te), _plan("megatron")) if o.coll == "all_gather"]
    assert out and set(out) == {2 * size}
    # the blockwise recipe gathers only forward inputs in fp8: its backward gathers run in high precision
    block = Fp8Spec(library="transformer_engine", recipe="blockwise")
    assert sorted(_gathers("megatron", block)) == sorted([("F", size)] * 2 + [("W", 2 * size)] * 2 +
                                                         [("I", 2 * size)] * 2)


def test_learned_positions_all_reduce_the_embedding() -> None:
    """Megatron LanguageModelEmbedding turns reduce_scatter_embeddings off with a learned position table: the word
    embeddings are all-reduced over TP, the positions added, and the sum split over the sequence (a split whose
    backward all-gathers the gradient). Rotary models reduce-scatter instead."""
    learned = MODEL.model_copy(update={"position_embedding": "learned"})
    for model, forward in ((learned, "all_reduce"), (MODEL, "reduce_scatter")):
        colls = [(o.phase, o.coll, o.coll_bytes) for o in embedding_ops(model, _training(), _plan("megatron"))
                 if o.kind == "collective"]
        assert colls == [("F", forward, TOKENS * 1024 * 2), ("I", "all_gather", TOKENS * 1024 * 2)], model


def test_mla_latents_are_saved_on_the_sequence_shard_under_megatron_sp() -> None:
    """Megatron's MLASelfAttention under SP runs its down projections on the rank's sequence shard (q_compressed and
    kv_compressed are [s/TP, b, .]) and the column-parallel up projections save that sharded input; TorchTitan's
    plan gathers the hidden state first, so its latents cover every token. The rope key part is gathered either way."""
    mla = ModelSpec(num_layers=2, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000,
                    mla={"q_lora_rank": 512, "kv_lora_rank": 256, "qk_head_dim": 64, "qk_rope_head_dim": 32,
                         "v_head_dim": 64})
    mega = layer_tensors(mla, _training(), _plan("megatron"), 0)
    titan = layer_tensors(mla, _training(), _plan("dtensor"), 0)
    assert mega["attn.q_latent"] == 2 * 2 * TOKENS * 512 / TP and titan["attn.q_latent"] == 2 * 2 * TOKENS * 512
    assert mega["attn.kv_latent"] == 2 * (2 * TOKENS * 256 / TP + TOKENS * 32)
    assert titan["attn.kv_latent"] == 2 * (2 * TOKENS * 256 + TOKENS * 32)


def test_the_float8_tp_plan_covers_attention_and_dense_blocks_only() -> None:
    """TorchTitan's apply_non_moe_tp takes the Float8 styles for every block's attention and the dense feed-forward
    blocks; a MoE block's TP plan is apply_moe_ep_tp's (plain), and the output layer is a plain ColwiseParallel whose
    torchao Float8Linear saves the bf16 input it receives. So on a MoE model at tp 4: attention gathers at 1 B, the
    MoE block's and the output's at the activation's 2 B; saved linear inputs likewise."""
    moe_model = ModelSpec.model_validate({**MODEL.model_dump(), "moe": {
        "num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 1024, "first_k_dense": 1}})
    fp8 = Fp8Spec(format="hybrid", recipe="tensorwise", library="torchao", tp_float8=True, output_layer=True)
    training = TrainingSpec(seq_length=2048, micro_batch_size=2, params_dtype="bf16", fp8=fp8,
                            kernels={"transformer_impl": "torchtitan"})
    plan = ParallelPlan(tp=TP, sp=True, tp_style="dtensor")
    assert not moe_model.is_moe_layer(0) and moe_model.is_moe_layer(1)

    def gathers(ops: tuple) -> set[str]:
        return {f"{o.name}:{o.coll_bytes // (TOKENS * MODEL.hidden_size)}" for o in ops
                if o.kind == "collective" and o.coll == "all_gather" and o.phase == "F"}

    dense, moe = layer_ops(moe_model, training, plan, 0), layer_ops(moe_model, training, plan, 1)
    assert gathers(dense) == {"attn.qkv.ag:1", "mlp.fc1.ag:1"}
    assert "attn.qkv.ag:1" in gathers(moe)
    plain = TrainingSpec(seq_length=2048, micro_batch_size=2, params_dtype="bf16", kernels={"transformer_impl":
                         "torchtitan"}, fp8=fp8.model_copy(update={"tp_float8": False}))
    # the MoE block's own gathers (tokens to the expert-TP group) are those of the plain plan
    assert {g for g in gathers(moe) if g.startswith("moe")} == {
        g for g in gathers(layer_ops(moe_model, plain, plan, 1)) if g.startswith("moe")}
    assert gathers(output_ops(moe_model, training, plan)) == {"output.ag:2"}
    t0, t1 = layer_tensors(moe_model, training, plan, 0), layer_tensors(moe_model, training, plan, 1)
    per_token_h = TOKENS * MODEL.hidden_size
    assert t0["attn.linear_in"] == per_token_h and t0["mlp.linear_in"] == per_token_h  # fp8: 1 B
    assert t1["moe.linear_in"] == 2 * per_token_h  # the MoE block's input, gathered and saved in bf16
