"""Every Megatron-LM functional-test `model_config.yaml` under shared/fixtures/megatron loads and builds, with the
dimensions published for it (fixtures/README.md descriptions, the YAML itself, config-formats.md §1.11, and the
HF config.json of the model a case is a proxy of). World sizes: CASES.md (gpt3 cases: 1 node x 8 GPUs); the two
release cases have no published world size, so the smallest world their EP x ETP grid allows is used."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from projection.formats.megatron_files import load_megatron
from projection.specs.hardware import load_device
from projection.specs.scenario import Origin, Scenario, build_scenario

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
MEGATRON = FIXTURES / "megatron"
CASES = sorted(p.parent.name for p in MEGATRON.glob("*/model_config.yaml")) if MEGATRON.is_dir() else []
# release cases: tp2 * dp must be a multiple of ep * etp (Megatron expert grid, §1.3) -> dp 8 (DeepSeek), 4 (Mixtral)
NODES = {"deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release": 8, "mixtral_8x7b_tp1pp4ep8vpp8_release": 4}


@pytest.fixture(autouse=True)
def _need_fixtures() -> None:
    if not MEGATRON.is_dir():
        pytest.skip("shared fixtures absent (user clone)")


def build(case: str) -> Scenario:
    raw = load_megatron(MEGATRON / case / "model_config.yaml")
    raw.set("cluster.nodes", NODES.get(case, 1), Origin("CASES.md"))
    raw.set("cluster.gpus_per_node", 8, Origin("CASES.md"))
    return build_scenario(raw, load_device("mi300x"))


def hf(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "hf" / f"{name}.config.json").read_text(encoding="utf-8"))
    return data


def test_fixtures_found() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES)
def test_every_case_loads_and_builds(case: str) -> None:
    sc = build(case)
    assert sc.world_size == 8 * NODES.get(case, 1)
    assert sc.plan.dp is not None and sc.plan.dp * sc.plan.tp * sc.plan.pp * sc.plan.cp == sc.world_size
    if case.startswith("gpt3_mcore"):
        # the 12-layer functional-test GPT: 12 x 512, 8 heads, Megatron's GPT defaults, GPT-2 BPE files
        m = sc.model
        assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads) == (12, 512, 8, 8)
        assert (m.ffn_hidden_size, m.activation, m.norm, m.position_embedding) == (2048, "gelu", "layernorm",
                                                                                   "learned")
        assert m.vocab_size == 50257 and m.max_position_embeddings == 1024 and m.tie_embeddings
        assert m.add_bias_linear is ("disable-bias-linear" not in
                                     (MEGATRON / case / "model_config.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", ["gpt3_7b_tp1_pp4_memory_speed", "gpt3_7b_tp4_pp1_memory_speed"])
def test_gpt3_7b(case: str) -> None:
    sc = build(case)
    m, p, t = sc.model, sc.plan, sc.training
    # README: 32 layers, hidden 4096, 32 heads, 8 query groups, vocab 131073 (NullTokenizer, exact at d98e8a6)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads) == (32, 4096, 32, 8)
    assert m.vocab_size == 131073 and not m.tie_embeddings
    assert m.ffn_hidden_size == 4 * 4096  # no --ffn-hidden-size and no --swiglu: Megatron's 4h default
    assert (t.seq_length, t.params_dtype, p.sharding.zero_stage, p.dp) == (8192, "bf16", 1, 2)
    if "pp4" in case:
        assert (p.pp, p.vpp, p.schedule) == (4, 32 // 4, "interleaved_1f1b")  # 1 layer per virtual stage
        assert (t.micro_batch_size, t.global_batch_size) == (1, 8)
    else:
        assert (p.tp, p.pp, p.vpp) == (4, 1, None)
        assert (t.micro_batch_size, t.global_batch_size) == (2, 8)


def test_deepseek_v3_proxy() -> None:
    sc = build("deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release")
    m, p = sc.model, sc.plan
    ds = hf("DeepSeek-V3")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (14, ds["hidden_size"], ds["num_attention_heads"])
    assert m.ffn_hidden_size == ds["intermediate_size"] and m.mtp_num_layers == ds["num_nextn_predict_layers"] == 1
    assert m.mla is not None
    assert (m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_head_dim, m.mla.qk_rope_head_dim, m.mla.v_head_dim) == (
        ds["q_lora_rank"], ds["kv_lora_rank"], ds["qk_nope_head_dim"], ds["qk_rope_head_dim"], ds["v_head_dim"])
    assert m.moe is not None
    assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size) == (64, ds["num_experts_per_tok"],
                                                                               ds["moe_intermediate_size"])
    assert m.moe.shared_expert_ffn_hidden_size == ds["n_shared_experts"] * ds["moe_intermediate_size"]
    dense = ds["first_k_dense_replace"]
    assert [m.is_moe_layer(i) for i in range(14)] == [False] * dense + [True] * (14 - dense)
    assert (m.norm, m.qk_norm, m.tie_embeddings, m.add_bias_linear) == ("rmsnorm", True, False, False)
    # layout Et*2|(tt|)*5t|tmL: 8 virtual stages over pp 4 -> vpp 2
    assert (p.tp, p.pp, p.vpp, p.ep, p.etp, p.schedule) == (2, 4, 2, 16, 1, "interleaved_1f1b")
    assert m.vocab_size == 256000  # Nemotron 256k SentencePiece model (§1.11)
    assert m.padded_vocab(p.tp) == math.ceil(256000 / (3232 * 2)) * 3232 * 2


def test_mixtral_release_matches_hf_mixtral() -> None:
    sc = build("mixtral_8x7b_tp1pp4ep8vpp8_release")
    m, p = sc.model, sc.plan
    mx = hf("Mixtral-8x7B-v0.1")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads) == (
        mx["num_hidden_layers"], mx["hidden_size"], mx["num_attention_heads"], mx["num_key_value_heads"])
    assert m.moe is not None and m.ffn_hidden_size == mx["intermediate_size"] == 14336
    assert (m.moe.num_experts, m.moe.top_k) == (mx["num_local_experts"], mx["num_experts_per_tok"]) == (8, 2)
    assert m.moe.expert_ffn_hidden_size == 14336  # no --moe-ffn-hidden-size: falls back to ffn (§1.3)
    assert m.vocab_size == mx["vocab_size"] == 32000  # Llama2Tokenizer (SentencePiece, 32000 pieces)
    assert (m.norm, m.activation, m.gated_mlp, m.tie_embeddings) == ("rmsnorm", "silu", True, False)
    assert (p.tp, p.pp, p.vpp, p.ep, p.etp, p.sp) == (2, 4, 8, 8, 1, True)


def test_fine_grained_offloading_case() -> None:
    sc = build("gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading")
    m, p = sc.model, sc.plan
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads) == (15, 1024, 4096, 32)
    assert m.moe is not None and m.num_moe_layers == 12 and m.mla is not None and m.mtp_num_layers == 1
    assert (p.pp, p.vpp) == (2, 4)  # layout Et*3|(tt|)*6mL: 8 stages
    assert p.recompute.granularity == "selective"
    assert p.recompute.modules == ("layernorm", "mla_up_proj", "mlp", "moe_act")
    assert p.offload.activation_modules == ("expert_fc1", "moe_act", "attn_norm", "mlp_norm", "qkv_linear",
                                            "core_attn", "attn_proj")
    assert p.overlap.ep_comm and sc.training.attention_backend == "unfused"


def test_origins_point_at_yaml_lines() -> None:
    path = MEGATRON / "gpt3_7b_tp1_pp4_memory_speed" / "model_config.yaml"
    raw = load_megatron(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    o = raw.origins["model.num_kv_heads"]
    assert o.key == "--num-query-groups" and o.line is not None and lines[o.line - 1].strip().startswith(o.key)
