"""Every TorchTitan TOML fixture (pytorch/torchtitan @v0.2.2, shared/fixtures/torchtitan/) loads and builds into a
Scenario, and the models carry the published dimensions.

Expected values are taken from published sources, not from the loader: the HF `config.json` files vendored in
shared/fixtures/hf/ (Meta-Llama-3.1-8B, DeepSeek-V3, Qwen3-30B-A3B) and the HF model cards / reference tables of
shared/reference/config-formats.md §3.3 (Llama-3.1-70B/405B, Llama-4 Scout, Qwen3-32B, DeepSeek-V2-Lite-like 16B).

World sizes: the file's own preset where it names one (llama3 8B/70B and llama4 Scout: 64 GPUs = 8 nodes x 8; llama3
405B: 128 = 16 x 8; qwen3 32B: 8 = 1 x 8), otherwise 64 = 8 x 8 (deepseek_v3 16B, EP 8; deepseek_v3 671B).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from projection.errors import ConfigError
from projection.formats.torchtitan import job_config_to_raw, load_torchtitan
from projection.specs.hardware import DeviceSpec, load_device
from projection.specs.scenario import Origin, Scenario, build_scenario

SHARED = Path(__file__).resolve().parents[3] / "shared"  # shared/ sits next to the repository checkout
FIXTURES = SHARED / "fixtures" / "torchtitan"
HF = SHARED / "fixtures" / "hf"
NODES = {"llama3_8b": 8, "llama3_70b": 8, "llama3_405b": 16, "llama4_17bx16e": 8, "qwen3_32b": 1,
         "deepseek_v3_16b": 8, "deepseek_v3_671b": 8}

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared/fixtures/torchtitan not available")


def _device() -> DeviceSpec:
    try:
        return load_device("h100")
    except ConfigError:  # bundled device files not present: a minimal stand-in (only gpus_per_node matters here)
        return DeviceSpec.model_validate({
            "name": "stub", "vendor": "nvidia", "marketing_name": "stub", "peak_flop_per_s": {"bf16": 1e15},
            "hbm_bytes": 80e9, "hbm_bandwidth_bytes_per_s": 3e12, "gpus_per_node": 8,
            "intra_node": {"kind": "nvlink", "topology": "switch", "links_per_gpu": 18,
                           "bandwidth_per_direction_bytes_per_s": 4.5e11, "latency_s": 2e-6},
            "nic": {"count_per_node": 8, "bandwidth_bytes_per_s": 5e10, "latency_s": 5e-6},
            "sources": {k: "A: test stand-in" for k in (
                "peak_flop_per_s.bf16", "hbm_bytes", "hbm_bandwidth_bytes_per_s", "gpus_per_node",
                "intra_node.links_per_gpu", "intra_node.bandwidth_per_direction_bytes_per_s", "intra_node.latency_s",
                "nic.count_per_node", "nic.bandwidth_bytes_per_s", "nic.latency_s")}})


def _build(stem: str) -> Scenario:
    raw = load_torchtitan(FIXTURES / f"{stem}.toml")
    raw.set("cluster.nodes", NODES[stem], Origin("test", None, "nodes"))
    raw.set("cluster.gpus_per_node", 8, Origin("test", None, "gpus_per_node"))
    return build_scenario(raw, _device())


def _hf(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HF / f"{name}.config.json").read_text(encoding="utf-8"))
    return data


def test_every_fixture_is_covered() -> None:
    assert {p.stem for p in FIXTURES.glob("*.toml")} == set(NODES)


@pytest.mark.parametrize("stem", sorted(NODES))
def test_fixture_loads_and_builds(stem: str) -> None:
    sc = _build(stem)
    assert sc.framework == "torchtitan" and sc.world_size == NODES[stem] * 8
    # every preset is FSDP with data_parallel_shard_degree = -1: dp fills the ranks left by TP (PP = CP = 1)
    assert sc.plan.sharding.zero_stage == 3 and sc.plan.dp == sc.world_size // sc.plan.tp
    assert sc.training.resolved_global_batch(sc.plan.dp) == sc.training.local_batch_size * sc.plan.dp


def test_llama3_8b_matches_hf_config() -> None:
    m, hf = _build("llama3_8b").model, _hf("Meta-Llama-3.1-8B")
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size) == (32, 4096, 14336)
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.kv_heads, m.vocab_size) == (
        hf["num_hidden_layers"], hf["hidden_size"], hf["intermediate_size"], hf["num_attention_heads"],
        hf["num_key_value_heads"], hf["vocab_size"])
    assert m.tie_embeddings is hf["tie_word_embeddings"] is False


def test_llama3_8b_plan() -> None:
    sc = _build("llama3_8b")
    assert (sc.plan.tp, sc.plan.dp, sc.training.seq_length, sc.training.micro_batch_size) == (1, 64, 8192, 1)
    assert sc.plan.recompute.granularity == "selective" and sc.plan.recompute.modules == ("op",)
    assert sc.training.fp8 is None  # converters commented out


def test_llama3_70b_published_dims() -> None:
    sc = _build("llama3_70b")
    m = sc.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.kv_heads) == (
        80, 8192, 28672, 64, 8)
    assert (sc.plan.tp, sc.plan.sp, sc.plan.dp) == (8, True, 8) and sc.plan.recompute.granularity == "full"


def test_llama31_405b_published_dims() -> None:
    sc = _build("llama3_405b")
    m = sc.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.kv_heads, m.vocab_size) == (
        126, 16384, 53248, 128, 8, 128256)
    assert sc.training.fp8 is not None and sc.training.fp8.param_gather  # float8 converter + FP8 all-gather
    assert sc.plan.overlap.tp_comm  # async TP with compile
    assert (sc.plan.tp, sc.plan.dp, sc.training.micro_batch_size) == (8, 16, 2)


def test_deepseek_v3_671b_matches_hf_config() -> None:
    m, hf = _build("deepseek_v3_671b").model, _hf("DeepSeek-V3")
    assert m.moe is not None and m.mla is not None
    assert (m.num_layers, m.moe.first_k_dense, m.moe.num_experts, m.moe.top_k) == (61, 3, 256, 8)
    assert (m.moe.expert_ffn_hidden_size, m.moe.num_shared_experts, m.mla.q_lora_rank, m.mla.kv_lora_rank) == (
        2048, 1, 1536, 512)
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.vocab_size) == (
        hf["num_hidden_layers"], hf["hidden_size"], hf["intermediate_size"], hf["num_attention_heads"],
        hf["vocab_size"])
    assert (m.moe.num_experts, m.moe.top_k, m.moe.first_k_dense, m.moe.expert_ffn_hidden_size) == (
        hf["n_routed_experts"], hf["num_experts_per_tok"], hf["first_k_dense_replace"], hf["moe_intermediate_size"])
    assert m.moe.shared_expert_ffn_hidden_size == hf["n_shared_experts"] * hf["moe_intermediate_size"]
    assert (m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_head_dim, m.mla.qk_rope_head_dim, m.mla.v_head_dim) == (
        hf["q_lora_rank"], hf["kv_lora_rank"], hf["qk_nope_head_dim"], hf["qk_rope_head_dim"], hf["v_head_dim"])
    assert m.num_moe_layers == 58 and m.mtp_num_layers == 0  # TorchTitan implements no MTP (HF has 1 nextn layer)


def test_deepseek_v3_16b_published_dims_and_ep() -> None:
    sc = _build("deepseek_v3_16b")
    m = sc.model
    assert m.moe is not None and m.mla is not None
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.vocab_size) == (
        27, 2048, 10944, 16, 102400)
    assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size, m.moe.num_shared_experts) == (64, 6, 1408, 2)
    assert m.mla.q_lora_rank == 0 and m.moe.first_k_dense == 1
    assert (sc.plan.ep, sc.plan.etp_, sc.plan.edp()) == (8, 1, 8)


def test_llama4_scout_published_dims() -> None:
    sc = _build("llama4_17bx16e")
    m = sc.model
    assert m.moe is not None
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads, m.vocab_size) == (48, 5120, 40, 8, 202048)
    assert (m.moe.num_experts, m.moe.num_shared_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size) == (16, 1, 1, 8192)
    assert m.num_moe_layers == 48  # interleave_moe_layer_step 1: every layer is MoE
    assert (sc.plan.tp, sc.plan.ep, sc.plan.etp_) == (8, 1, 8)


def test_qwen3_32b_published_dims() -> None:
    m = _build("qwen3_32b").model
    assert (m.num_layers, m.hidden_size, m.head_dim_, m.ffn_hidden_size) == (64, 5120, 128, 25600)
    assert (m.num_attention_heads, m.kv_heads, m.vocab_size, m.qk_norm, m.tie_embeddings) == (
        64, 8, 151936, True, False)
    assert m.num_attention_heads * m.head_dim_ != m.hidden_size  # trap §8.2 #4: head_dim is explicit


def test_qwen3_30b_a3b_flavor_matches_hf_config() -> None:
    cfg = {"model": {"name": "qwen3", "flavor": "30B-A3B"}}
    raw = job_config_to_raw(cfg, {}, source="inline")
    m, hf = raw.data["model"], _hf("Qwen3-30B-A3B")
    assert (m["num_layers"], m["hidden_size"], m["num_attention_heads"], m["num_kv_heads"], m["head_dim"]) == (
        hf["num_hidden_layers"], hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"],
        hf["head_dim"])
    assert (m["moe"]["num_experts"], m["moe"]["top_k"], m["moe"]["expert_ffn_hidden_size"], m["vocab_size"]) == (
        hf["num_experts"], hf["num_experts_per_tok"], hf["moe_intermediate_size"], hf["vocab_size"])


@pytest.mark.parametrize(("local_batch", "ok"), [(6, True), (8, True), (9, False)])
def test_interleaved_pipeline_follows_torchs_rule(local_batch: int, ok: bool) -> None:
    """TorchTitan runs torch's ScheduleInterleaved1F1B: m microbatches in rounds of max(1, m // pp), so at pp 4 it
    takes 6 (one round; Megatron's rule, 6 % 4 = 2 < pp, would refuse it) and refuses 9 (two rounds do not divide 9)."""
    from projection import api

    sets = ["parallelism.pipeline_parallel_degree=4", "parallelism.pipeline_parallel_schedule=Interleaved1F1B",
            f"training.local_batch_size={local_batch}", "parallelism.pipeline_parallel_microbatch_size=1"]
    if ok:
        sc = api.load(FIXTURES / "llama3_8b.toml", nodes=2, overrides=sets)
        assert (sc.plan.schedule, sc.plan.schedule_style, sc.plan.vpp) == ("interleaved_1f1b", "torch", 2)
        return
    from projection.errors import PlanError

    with pytest.raises(PlanError, match=r"interleaved_1f1b \(torch\): n_microbatches = 9"):
        api.load(FIXTURES / "llama3_8b.toml", nodes=2, overrides=sets)


def test_torchtitan_checks_it_would_fail_at_start_up() -> None:
    """Schedule1F1B with fewer microbatches than stages, and TP without loss parallelism (not modelled), are refused."""
    from projection import api
    from projection.errors import PlanError

    with pytest.raises(PlanError, match=r"needs at least pp = 2 microbatches"):
        api.load(FIXTURES / "llama3_8b.toml", overrides=["parallelism.pipeline_parallel_degree=2"])
    with pytest.raises(ConfigError, match="without loss parallelism"):
        api.load(FIXTURES / "llama3_70b.toml", nodes=8, overrides=["parallelism.disable_loss_parallel=true"])
