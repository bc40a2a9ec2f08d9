"""The per-layer op list against PyTorch's FlopCounterMode on real forward + backward passes of small models written
here in plain PyTorch: a Llama-style model (GQA, gated MLP, RMSNorm), a GPT-style model (MHA, plain MLP with biases,
LayerNorm, learned positions, tied embeddings) and an MoE model (top-k routed experts dispatched by index, a shared
expert, one dense layer first). GEMM FLOPs are compared per phase (forward; input gradient, measured as the backward
of the embedding output with frozen weights; weight gradient = full backward - input gradient) and attention FLOPs
against F.scaled_dot_product_attention (math kernel: FlopCounterMode counts it as two bmm forward, four backward, over
the full s x s matrix, so the causal ops are doubled for the comparison). Plus sharding invariants and the model-FLOPs
formula (F72 of validation-public.md §0.2)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from projection.specs.model import MLASpec, ModelSpec, MoESpec
from projection.specs.plan import ParallelPlan, RecomputeSpec
from projection.specs.training import TrainingSpec
from projection.workload.model_flops import layer_macs_per_token, model_flops_per_step
from projection.workload.ops import Op, embedding_ops, layer_ops, mtp_ops, output_ops

B, S = 2, 32


class Attention(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.a, self.g, self.d = m.num_attention_heads, m.kv_heads, m.head_dim_
        bias = m.add_bias_linear or m.add_qkv_bias
        self.qkv = nn.Linear(m.hidden_size, (self.a + 2 * self.g) * self.d, bias=bias)
        self.proj = nn.Linear(self.a * self.d, m.hidden_size, bias=m.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.a * self.d, self.g * self.d, self.g * self.d], -1)
        q, k, v = (t.view(b, s, -1, self.d).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.g != self.a)
        return self.proj(o.transpose(1, 2).reshape(b, s, -1))


class Mlp(nn.Module):
    def __init__(self, m: ModelSpec, ffn: int) -> None:
        super().__init__()
        self.gated = m.gated_mlp
        self.fc1 = nn.Linear(m.hidden_size, ffn * (2 if self.gated else 1), bias=m.add_bias_linear)
        self.fc2 = nn.Linear(ffn, m.hidden_size, bias=m.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.fc1(x).chunk(2, -1)
            return self.fc2(F.silu(gate) * up)
        return self.fc2(F.gelu(self.fc1(x)))


class MoE(nn.Module):
    """Router, top-k, and each expert run on the rows routed to it (index_select / index_add), plus a shared expert."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        assert m.moe is not None
        self.k = m.moe.top_k
        self.router = nn.Linear(m.hidden_size, m.moe.num_experts, bias=False)
        self.experts = nn.ModuleList(Mlp(m, m.moe.expert_ffn_hidden_size) for _ in range(m.moe.num_experts))
        self.shared = Mlp(m, m.moe.shared_expert_ffn_hidden_size) if m.moe.shared_expert_ffn_hidden_size else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, idx = F.softmax(self.router(flat), -1).topk(self.k, -1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(idx == e)
            if len(rows):
                out = out.index_add(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, m: ModelSpec, i: int) -> None:
        super().__init__()
        norm = nn.RMSNorm if m.norm == "rmsnorm" else nn.LayerNorm
        self.n1, self.n2 = norm(m.hidden_size), norm(m.hidden_size)
        self.attn = Attention(m)
        self.mlp = MoE(m) if m.is_moe_layer(i) else Mlp(m, m.ffn_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class LM(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.m = m
        self.emb = nn.Embedding(m.vocab_size, m.hidden_size)
        self.pos = nn.Embedding(S, m.hidden_size) if m.position_embedding == "learned" else None
        self.blocks = nn.ModuleList(Block(m, i) for i in range(m.num_layers))
        self.norm = (nn.RMSNorm if m.norm == "rmsnorm" else nn.LayerNorm)(m.hidden_size)
        self.head = None if m.tie_embeddings else nn.Linear(m.hidden_size, m.vocab_size, bias=False)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        return x + self.pos.weight[: tokens.shape[1]] if self.pos is not None else x

    def body(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        logits = F.linear(x, self.emb.weight) if self.head is None else self.head(x)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _count(fcm: FlopCounterMode) -> tuple[int, int]:
    """(GEMM FLOPs: mm + addmm, attention FLOPs: bmm) of a FlopCounterMode run."""
    counts = {str(k): v for k, v in fcm.get_flop_counts()["Global"].items()}
    assert set(counts) <= {"aten.mm", "aten.addmm", "aten.bmm"}, counts
    return counts.get("aten.mm", 0) + counts.get("aten.addmm", 0), counts.get("aten.bmm", 0)


def measure(m: ModelSpec) -> dict[str, tuple[int, int]]:
    """FLOPs PyTorch counts per phase: F, I (input gradients only) and W (full backward minus I)."""
    torch.manual_seed(0)
    lm = LM(m)
    tokens, targets = torch.randint(0, m.vocab_size, (B, S)), torch.randint(0, m.vocab_size, (B, S))
    out = {}
    with sdpa_kernel(SDPBackend.MATH):
        x0 = lm.embed(tokens).detach().requires_grad_(True)
        with FlopCounterMode(display=False) as fwd:
            loss = lm.body(x0, targets)
        with FlopCounterMode(display=False) as bwd:
            loss.backward()
        for p in lm.parameters():
            p.requires_grad_(False)
        x0 = lm.embed(tokens).detach().requires_grad_(True)
        loss = lm.body(x0, targets)
        with FlopCounterMode(display=False) as dgrad:
            torch.autograd.grad(loss, x0)
    out["F"], out["I"] = _count(fwd), _count(dgrad)
    full = _count(bwd)
    out["W"] = (full[0] - out["I"][0], full[1] - out["I"][1])
    return out


def step_ops(m: ModelSpec, plan: ParallelPlan | None = None, training: TrainingSpec | None = None) -> list[Op]:
    plan = plan or ParallelPlan(dp=1)
    training = training or TrainingSpec(seq_length=S, micro_batch_size=B, params_dtype="fp32")
    ops = [*embedding_ops(m, training, plan), *output_ops(m, training, plan)]
    for i in range(m.num_layers):
        ops += layer_ops(m, training, plan, i)
    return ops


def predicted(ops: Iterable[Op], phase: str) -> tuple[float, float]:
    """(GEMM FLOPs, attention FLOPs over the full s x s matrix) of one phase, recompute excluded."""
    ops = [o for o in ops if o.phase == phase and not o.recompute]
    gemm = sum(o.total_flop for o in ops if o.kind in ("gemm", "grouped_gemm"))
    attn = sum(o.total_flop * (2 if o.causal else 1) for o in ops if o.kind == "attention")
    return gemm, attn


LLAMA = ModelSpec(name="llama-tiny", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                  ffn_hidden_size=96, vocab_size=101)
GPT = ModelSpec(name="gpt-tiny", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                gated_mlp=False, activation="gelu", norm="layernorm", add_bias_linear=True, vocab_size=101,
                position_embedding="learned", max_position_embeddings=S, tie_embeddings=True)
MOE = ModelSpec(name="moe-tiny", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                ffn_hidden_size=96, vocab_size=101,
                moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, shared_expert_ffn_hidden_size=48,
                            first_k_dense=1))


@pytest.mark.parametrize("m", [LLAMA, GPT, MOE], ids=lambda m: m.name)
def test_flops_equal_flop_counter_per_phase(m: ModelSpec) -> None:
    measured = measure(m)
    ops = step_ops(m)
    for phase in ("F", "I", "W"):
        gemm, attn = predicted(ops, phase)
        assert gemm == measured[phase][0], (phase, "gemm", gemm, measured[phase][0])
        assert attn == measured[phase][1], (phase, "attention", attn, measured[phase][1])
    assert measured["F"][1] > 0 and measured["W"][0] > 0


def test_attention_flops_equal_sdpa_count_for_gqa_shapes() -> None:
    training = TrainingSpec(seq_length=S, micro_batch_size=B, params_dtype="fp32")
    core = [o for o in layer_ops(LLAMA, training, ParallelPlan(dp=1), 0) if o.kind == "attention"]
    fwd, bwd = core
    q = torch.randn(B, fwd.heads, fwd.m, fwd.k, requires_grad=True)
    k = torch.randn(B, fwd.kv_heads, fwd.n, fwd.k, requires_grad=True)
    v = torch.randn(B, fwd.kv_heads, fwd.n, fwd.head_dim_v, requires_grad=True)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as f:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as b:
        out.sum().backward()
    assert fwd.causal and 2 * fwd.flop == f.get_total_flops()  # causal op = half of the full count
    assert 2 * bwd.flop == b.get_total_flops() and bwd.flop == 2 * fwd.flop


def test_recompute_adds_forward_ops_only() -> None:
    training = TrainingSpec(seq_length=S, micro_batch_size=B)
    base = layer_ops(LLAMA, training, ParallelPlan(dp=1), 0)
    full = layer_ops(LLAMA, training, ParallelPlan(dp=1, recompute=RecomputeSpec(granularity="full")), 0)
    sel = layer_ops(LLAMA, training, ParallelPlan(dp=1, recompute=RecomputeSpec(granularity="selective",
                                                                               modules=("core_attn",))), 0)
    fwd = [o for o in base if o.phase == "F"]
    assert [o for o in full if not o.recompute] == list(base)
    assert [o.name for o in full if o.recompute] == [o.name for o in fwd]
    assert [o.kind for o in sel if o.recompute] == ["attention"]


@pytest.mark.parametrize("plan", [ParallelPlan(tp=2, sp=True, dp=1), ParallelPlan(tp=2, dp=1),
                                  ParallelPlan(cp=2, dp=1), ParallelPlan(tp=2, sp=True, cp=2, dp=1)],
                         ids=["tp2sp", "tp2", "cp2", "tp2cp2"])
def test_tp_and_cp_split_dense_work_evenly(plan: ParallelPlan) -> None:
    training = TrainingSpec(seq_length=64, micro_batch_size=2)
    one = layer_ops(LLAMA, training, ParallelPlan(dp=1), 0)
    shard = layer_ops(LLAMA, training, plan, 0)
    ways = plan.tp * plan.cp
    for phase in ("F", "I", "W"):
        assert [ways * x for x in predicted(shard, phase)] == list(predicted(one, phase))
    colls = {(o.coll, o.group, o.phase) for o in shard if o.kind == "collective"}
    if plan.tp > 1 and plan.sp:
        assert {("all_gather", "tp", "F"), ("reduce_scatter", "tp", "F"), ("reduce_scatter", "tp", "I")} <= colls
    if plan.tp > 1 and not plan.sp:
        assert {("all_reduce", "tp", "F"), ("all_reduce", "tp", "I")} <= colls
    if plan.cp > 1:
        assert ("send_recv", "cp", "F") in colls


def test_expert_parallel_splits_routed_experts_and_adds_all_to_all() -> None:
    training = TrainingSpec(seq_length=64, micro_batch_size=2)
    experts = [o for o in layer_ops(MOE, training, ParallelPlan(dp=2), 1) if o.kind == "grouped_gemm"]
    ep = layer_ops(MOE, training, ParallelPlan(dp=2, ep=2), 1)
    ep_experts = [o for o in ep if o.kind == "grouped_gemm"]
    assert sum(o.flop for o in experts) == sum(o.flop for o in ep_experts)  # balanced: same rows, half the experts
    assert {o.batch for o in experts} == {4} and {o.batch for o in ep_experts} == {2}
    a2a = [o for o in ep if o.coll == "all_to_all" and ".probs" not in o.name]
    assert len(a2a) == 4 and {o.group for o in a2a} == {"ep"}  # dispatch + combine, forward and backward
    assert a2a[0].coll_bytes == 2 * 64 * 2 * 64 * 2  # top_k * tokens * hidden * bf16
    # Megatron's all-to-all dispatcher also sends the routing probabilities with the tokens (forward and backward)
    # and all-gathers each rank's tokens per expert over the etp x ep group (token_dispatcher.py)
    probs = [o for o in ep if o.name.startswith("moe.dispatch.probs")]
    assert [(o.coll, o.phase, o.coll_bytes) for o in probs] == [("all_to_all", "F", 2 * 64 * 2 * 2),
                                                               ("all_to_all", "I", 2 * 64 * 2 * 2)]
    counts = [o for o in ep if o.name == "moe.dispatch.counts"]
    assert [(o.coll, o.group, o.phase, o.coll_bytes) for o in counts] == [("all_gather", "etp_ep", "F",
                                                                           2 * MOE.moe.num_experts * 8)]
    assert not any(".probs" in o.name or ".counts" in o.name for o in layer_ops(MOE, training, ParallelPlan(dp=2), 1))
    for kernels in ({"transformer_impl": "torchtitan"}, {"moe_token_dispatcher": "flex"}):  # their own exchanges
        other = training.model_copy(update={"kernels": training.kernels.model_copy(update=kernels)})
        assert not any(".probs" in o.name or ".counts" in o.name for o in layer_ops(MOE, other, ParallelPlan(dp=2,
                                                                                                         ep=2), 1))


def test_model_flops_reduce_to_f72_for_gpt() -> None:
    h, layers, v, heads, s, gbs = 1024, 4, 51200, 16, 2048, 8
    gpt = ModelSpec(num_layers=layers, hidden_size=h, num_attention_heads=heads, ffn_hidden_size=4 * h,
                    gated_mlp=False, vocab_size=v)
    training = TrainingSpec(seq_length=s, micro_batch_size=1, global_batch_size=gbs)
    f72 = 72 * gbs * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    assert model_flops_per_step(gpt, training, ParallelPlan(dp=8)) == pytest.approx(f72, rel=1e-12)
    # Megatron-LM's num_floating_point_operations since 2025 halves the scores and the weighted values ("causal
    # mask (only half of the mask is non-zero)"): per layer and token 12 h^2 + s h multiply-accumulates, not 2 s h
    causal = 72 * gbs * s * layers * h**2 * (1 + s / (12 * h) + v / (12 * layers * h))
    assert model_flops_per_step(gpt, training, ParallelPlan(dp=8), causal=True) == pytest.approx(causal, rel=1e-12)


def _megatron_2024_flops(b: int, s: int, layers: int, h: int, heads: int, groups: int, kv_channels: int, ffn: int,
                         routed: int, gated: bool, padded_vocab: int) -> float:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py, 2024: GQA, SwiGLU, MoE routed
    experts, full-matrix attention), typed in from its source."""
    ratio = kv_channels * heads / h
    glu = 3 / 2 if gated else 1
    return 12 * b * s * layers * h * h * ((1 + groups / heads + s / h) * ratio + ffn / h * routed * glu
                                          + padded_vocab / (2 * layers * h))


MEGATRON_PADDING: dict[str, object] = {"vocab_divisible_by": 128, "vocab_pad_with_tp": True}  # Megatron's default


def test_model_flops_equal_megatrons_formula_with_gqa_swiglu_and_moe() -> None:
    """Llama-3.1-70B (HF config: 80 x 8192, 64 heads over 8 KV groups, SwiGLU 28672, vocab 128256, padded at tp 8 to
    a multiple of 128 x 8 = 129024) and Mixtral-8x7B (32 x 4096, 32 / 8 heads, 8 experts of 14336, top 2, vocab 32000,
    a multiple of 128 x 2 already) against Megatron's own count."""
    training = TrainingSpec(seq_length=8192, micro_batch_size=1, global_batch_size=128)
    llama = ModelSpec(num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=8,
                      ffn_hidden_size=28672, vocab_size=128256, **MEGATRON_PADDING)
    expected = _megatron_2024_flops(128, 8192, 80, 8192, 64, 8, 128, 28672, 1, True, 129024)
    assert model_flops_per_step(llama, training, ParallelPlan(tp=8, dp=4)) == pytest.approx(expected, rel=1e-12)
    mixtral = ModelSpec(num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                        ffn_hidden_size=14336, vocab_size=32000, **MEGATRON_PADDING,
                        moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336))
    training = TrainingSpec(seq_length=4096, micro_batch_size=1, global_batch_size=64)
    expected = _megatron_2024_flops(64, 4096, 32, 4096, 32, 8, 128, 14336, 2, True, 32000)
    assert model_flops_per_step(mixtral, training, ParallelPlan(tp=2, dp=4)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("m", [LLAMA, MOE, ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=4,
                                                     ffn_hidden_size=96, vocab_size=101, qk_norm=True,
                                                     mla=MLASpec(q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8,
                                                                 qk_rope_head_dim=4, v_head_dim=8))],
                         ids=["llama", "moe", "mla"])
def test_op_list_agrees_with_model_flops_formula(m: ModelSpec) -> None:
    """Forward GEMM + full-matrix attention FLOPs of each layer = 2 * tokens * the formula's MACs (router excluded)."""
    training = TrainingSpec(seq_length=S, micro_batch_size=B)
    for i in range(m.num_layers):
        ops = [o for o in layer_ops(m, training, ParallelPlan(dp=1), i) if "router" not in o.name]
        assert sum(predicted(ops, "F")) == pytest.approx(2 * B * S * layer_macs_per_token(m, i, S), rel=1e-12)


def test_mtp_depth_is_a_layer_plus_projection_and_head() -> None:
    m = LLAMA.model_copy(update={"mtp_num_layers": 1})
    training = TrainingSpec(seq_length=S, micro_batch_size=B)
    plan = ParallelPlan(dp=1)
    mtp = predicted(mtp_ops(m, training, plan), "F")[0]
    layer = predicted(layer_ops(m, training, plan, 1), "F")[0]
    head = predicted(output_ops(m, training, plan), "F")[0]
    assert mtp == layer + head + 2 * B * S * 2 * m.hidden_size * m.hidden_size


def test_unfused_attention_is_batched_gemms_over_the_full_matrix() -> None:
    flash = layer_ops(LLAMA, TrainingSpec(seq_length=S, micro_batch_size=B), ParallelPlan(dp=1), 0)
    unfused = layer_ops(LLAMA, TrainingSpec(seq_length=S, micro_batch_size=B, attention_backend="unfused"),
                        ParallelPlan(dp=1), 0)
    assert not [o for o in unfused if o.kind == "attention"]
    for phase in ("F", "I"):
        bmm = sum(o.flop for o in unfused if o.phase == phase and o.kind == "gemm" and o.batch > 1)
        assert bmm == predicted(flash, phase)[1]  # = the full-matrix count of the flash op
    assert {o.batch for o in unfused if o.name.startswith("attn.core")} >= {B * LLAMA.num_attention_heads}


def test_fp8_runs_layer_gemms_in_fp8_and_keeps_the_logits_in_bf16() -> None:
    from projection.specs.training import Fp8Spec

    training = TrainingSpec(seq_length=S, micro_batch_size=B, fp8=Fp8Spec())
    layer = layer_ops(LLAMA, training, ParallelPlan(dp=1), 0)
    assert {o.dtype for o in layer if o.kind == "gemm"} == {"fp8"}
    assert any(o.name.endswith(".cast") for o in layer)
    assert {o.dtype for o in output_ops(LLAMA, training, ParallelPlan(dp=1)) if o.kind == "gemm"} == {"bf16"}


def test_mla_under_sequence_parallel_gathers_the_latents() -> None:
    mla = ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96, vocab_size=101,
                    mla=MLASpec(q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8, qk_rope_head_dim=4, v_head_dim=8))
    ops = layer_ops(mla, TrainingSpec(seq_length=S, micro_batch_size=B), ParallelPlan(tp=2, sp=True, dp=1), 0)
    gathers = {o.name: o.coll_bytes for o in ops if o.coll == "all_gather" and o.phase == "F"}
    # Megatron-Core MLASelfAttention.get_query_key_value_tensors: the rope key part is gathered on its own, the kv
    # latent inside the column-parallel linear_kv_up_proj, which re-gathers it for its weight gradient like q_up
    assert gathers["attn.kv_latent.ag"] == B * S * 4 * 2 and gathers["attn.kv_up.ag"] == B * S * 16 * 2
    assert gathers["attn.q_up.ag"] == B * S * 24 * 2
    regathers = {o.name: o.coll_bytes for o in ops if o.coll == "all_gather" and o.phase == "W"}
    assert regathers["attn.q_up.ag"] == B * S * 24 * 2 and regathers["attn.kv_up.ag"] == B * S * 16 * 2
    assert "attn.kv_latent.ag" not in regathers
    down = next(o for o in ops if o.name == "attn.q_down")
    assert (down.m, down.n, down.k) == (24, B * S // 2, 64)  # replicated weights on the sequence shard


@pytest.mark.parametrize(("factor", "pad"), [(None, False), (1.0, False), (0.5, False), (0.75, True), (1.5, True)])
def test_capacity_factor_expert_rows_equal_a_capacity_routed_moe(factor: float | None, pad: bool) -> None:
    """Megatron token dropping on a real forward: force-balanced routing (token t to experts (t k + j) mod E), each
    expert keeps at most C = ceil(k T / E x factor) of its copies (moe_utils.get_capacity) and, padded, runs on
    exactly C rows. FlopCounterMode's count of the expert MLPs = the grouped-GEMM op FLOPs of the layer."""
    moe = MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, capacity_factor=factor, pad_to_capacity=pad)
    m = MOE.model_copy(update={"moe": moe, "num_layers": 1})  # first_k_dense 0: the layer is MoE
    experts = [Mlp(m, moe.expert_ffn_hidden_size) for _ in range(moe.num_experts)]
    tokens = B * S
    x = torch.randn(tokens, m.hidden_size)
    assigned: list[list[int]] = [[] for _ in range(moe.num_experts)]
    for t in range(tokens):
        for j in range(moe.top_k):
            assigned[(t * moe.top_k + j) % moe.num_experts].append(t)
    cap = None if factor is None else -(-tokens * moe.top_k * factor // moe.num_experts)
    with FlopCounterMode(display=False) as counter:
        for e, rows in enumerate(assigned):
            kept = rows if cap is None else rows[: int(cap)]
            inp = x[kept]
            if pad and cap is not None:
                inp = torch.cat([inp, inp.new_zeros(int(cap) - len(kept), m.hidden_size)])
            experts[e](inp)
    ops = layer_ops(m, TrainingSpec(seq_length=S, micro_batch_size=B), ParallelPlan(dp=1), 0)
    grouped = sum(o.flop * o.count for o in ops if o.phase == "F" and o.kind == "grouped_gemm")
    assert grouped == counter.get_total_flops()


def test_capacity_scales_every_routed_tensor_alike() -> None:
    """The op list and the saved-activation inventory take the routed copies from the same rule: padded to a
    capacity factor of 2 doubles every op after the top-k selection and every saved expert tensor; the router and
    the shared expert do not move."""
    from projection.memory.activations import layer_tensors

    training, plan = TrainingSpec(seq_length=S, micro_batch_size=B), ParallelPlan(dp=1)
    base = MOE.model_copy(update={"num_layers": 1, "moe": MOE.moe.model_copy(update={"first_k_dense": 0})})
    moe = base.moe
    assert moe is not None
    padded = base.model_copy(update={"moe": moe.model_copy(update={"capacity_factor": 2.0, "pad_to_capacity": True})})
    routed = ("moe.permute", "moe.fc1", "moe.act", "moe.fc2", "moe.unpermute")
    for a, b in zip(layer_ops(base, training, plan, 0), layer_ops(padded, training, plan, 0), strict=True):
        scale = 2.0 if a.name.startswith(routed) and not a.name.startswith("moe.permute.bwd") else None
        if a.name.startswith(("moe.router", "moe.shared", "attn", "mlp.norm", "mlp.residual")):
            assert (a.flop, a.bytes_written) == (b.flop, b.bytes_written), a.name
        elif scale and a.kind == "grouped_gemm":
            assert b.flop == pytest.approx(scale * a.flop), a.name
    saved_a, saved_b = layer_tensors(base, training, plan, 0), layer_tensors(padded, training, plan, 0)
    for key in ("moe.dispatched", "moe.experts.fc2_in"):
        assert saved_b[key] == pytest.approx(2.0 * saved_a[key])
    assert saved_b["moe.router_probs"] == saved_a["moe.router_probs"]


def test_allgather_dispatcher_gathers_the_tensor_and_expert_group() -> None:
    """Megatron's allgather dispatcher (its default): the hidden states of the etp x ep ranks are all-gathered (and
    the routing map, 1 byte per token and expert, and the probabilities), then reduce-scattered back; the expert GEMMs
    are those of the all-to-all dispatcher, and no all-to-all or expert-TP collective runs."""
    from projection.specs.training import KernelSpec

    m = MOE.model_copy(update={"num_layers": 1, "moe": MOE.moe.model_copy(update={"first_k_dense": 0})})
    plan = ParallelPlan(tp=2, sp=True, ep=2, dp=2)
    a2a = TrainingSpec(seq_length=S, micro_batch_size=B, kernels=KernelSpec(moe_token_dispatcher="alltoall"))
    ag = a2a.model_copy(update={"kernels": KernelSpec(moe_token_dispatcher="allgather")})
    ops_a2a, ops_ag = layer_ops(m, a2a, plan, 0), layer_ops(m, ag, plan, 0)
    group = B * S // 2 * 2 * 2  # tokens of the tensor-and-expert group: b s / tp (SP shard) x etp (= tp) x ep
    colls = {o.name: (o.coll, o.group, o.coll_bytes) for o in ops_ag if o.kind == "collective" and "moe" in o.name}
    assert colls["moe.dispatch.tokens"] == ("all_gather", "etp_ep", group * m.hidden_size * 2)
    assert colls["moe.dispatch.map"] == ("all_gather", "etp_ep", group * 4)  # 4 experts, 1 byte each
    assert colls["moe.combine.tokens"] == ("reduce_scatter", "etp_ep", group * m.hidden_size * 2)
    assert not [o for o in ops_ag if o.coll == "all_to_all" or o.group == "etp"]
    assert [o for o in ops_a2a if o.coll == "all_to_all"]
    gemms = [(o.name, o.flop, o.m, o.n, o.k) for o in ops_ag if o.kind == "grouped_gemm"]
    assert gemms == [(o.name, o.flop, o.m, o.n, o.k) for o in ops_a2a if o.kind == "grouped_gemm"]


def test_sequential_experts_launch_one_gemm_per_expert_linear() -> None:
    """Megatron without --moe-grouped-gemm (SequentialMLP) loops over the local experts: the forward of the reference
    MoE above (an nn.Module per expert, as SequentialMLP has) dispatches one addmm per expert linear; the op list
    then holds that many expert GEMM launches with the grouped list's FLOPs, and no grouped GEMM."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from projection.specs.training import KernelSpec

    class Calls(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.gemms = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.gemms += func.__name__.split(".")[0] in ("mm", "addmm")
            return func(*args, **(kwargs or {}))

    moe = MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32)
    m = MOE.model_copy(update={"moe": moe, "num_layers": 1})
    layer = MoE(m)
    layer.router.requires_grad_(False)
    x = torch.randn(B, S, m.hidden_size)
    with Calls() as calls:
        layer(x)
    router_calls = 1
    seq = TrainingSpec(seq_length=S, micro_batch_size=B, kernels=KernelSpec(moe_grouped_gemm=False))
    grouped = seq.model_copy(update={"kernels": KernelSpec(moe_grouped_gemm=True)})
    ops_seq = [o for o in layer_ops(m, seq, ParallelPlan(dp=1), 0) if o.name.startswith(("moe.fc1", "moe.fc2"))]
    ops_grp = [o for o in layer_ops(m, grouped, ParallelPlan(dp=1), 0) if o.name.startswith(("moe.fc1", "moe.fc2"))]
    fwd = [o for o in ops_seq if o.phase == "F"]
    assert {o.kind for o in ops_seq} == {"gemm"} and {o.kind for o in ops_grp} == {"grouped_gemm"}
    assert sum(o.count for o in fwd) == calls.gemms - router_calls == 2 * moe.num_experts
    for a, b in zip(ops_seq, ops_grp, strict=True):
        assert a.flop * a.count == pytest.approx(b.flop * b.count) and (a.m, a.n, a.k) == (b.m, b.n, b.k)
