"""The same model described by different frameworks resolves to the same architecture and parameter count
(config-formats.md §8.1 cross-checks): Llama-3-8B and DeepSeek-V3 through Primus/Megatron, TorchTitan, HF and our
preset. Also the published sizes of the real fixtures (model cards)."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.specs.scenario import Scenario
from projection.workload.params import model_params

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared fixtures absent (user clone)")

ARCH = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_heads", "vocab_size",
        "tie_embeddings", "norm", "gated_mlp", "add_bias_linear", "add_qkv_bias", "position_embedding")


def arch(sc: Scenario) -> dict[str, object]:
    m = sc.model
    out = {k: getattr(m, k) for k in ARCH}
    out["head_dim"] = m.head_dim_ if m.mla is None else m.mla.model_dump()
    out["moe"] = None if m.moe is None else (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size,
                                             m.moe.shared_expert_ffn_hidden_size, m.num_moe_layers)
    return out


def total_without_mtp(sc: Scenario) -> int:
    p = model_params(sc.model, vocab_tp=sc.plan.tp)
    return sum(p.values()) - p["mtp"]


def test_llama3_8b_agrees_across_formats() -> None:
    primus = FIXTURES / "primus"
    scs = {
        "primus": api.load(primus / "examples/megatron/configs/MI300X/llama3_8B-BF16-pretrain.yaml",
                           primus_root=primus),
        "primus-builtin": api.load(primus / "examples/megatron/configs/MI300X/llama3_8B-BF16-pretrain.yaml"),
        "torchtitan": api.load(FIXTURES / "torchtitan/llama3_8b.toml"),
        "hf": api.load(FIXTURES / "hf/Meta-Llama-3.1-8B.config.json"),
        "preset": api.load(REPO / "models/llama3_8B.yaml", overrides=["seq_length=8192"]),
    }
    ref = arch(scs["hf"])
    # Published: 32 x 4096, FFN 14336, 32 heads / 8 KV heads, head dim 128, vocab 128256, untied; 8.03B parameters.
    assert (ref["num_layers"], ref["hidden_size"], ref["ffn_hidden_size"], ref["kv_heads"], ref["vocab_size"]) == \
        (32, 4096, 14336, 8, 128256)
    for name, sc in scs.items():
        assert arch(sc) == ref, name
        assert total_without_mtp(sc) == 8_030_261_248, name


def test_deepseek_v3_agrees_across_formats() -> None:
    scs = {
        "torchtitan": api.load(FIXTURES / "torchtitan/deepseek_v3_671b.toml"),
        "hf": api.load(FIXTURES / "hf/DeepSeek-V3.config.json"),
        # bf16: Megatron trains in fp32 unless told, and refuses grouped-GEMM experts in fp32 (validate_args)
        "preset": api.load(REPO / "models/deepseek_v3.yaml", overrides=["seq_length=4096", "bf16=true"]),
    }
    ref = arch(scs["hf"])
    assert ref["moe"] == (256, 8, 2048, 2048, 58)
    totals = {name: total_without_mtp(sc) for name, sc in scs.items()}
    for name, sc in scs.items():
        a = arch(sc)
        a["kv_heads"] = ref["kv_heads"]  # meaningless under MLA
        assert a == ref, name
    assert len(set(totals.values())) == 1, totals
    assert round(totals["hf"] / 1e9) == 671
    assert scs["hf"].model.mtp_num_layers == scs["preset"].model.mtp_num_layers == 1  # TorchTitan has no MTP
    assert scs["torchtitan"].model.mtp_num_layers == 0


@pytest.mark.parametrize(("config", "billions"), [
    ("torchtitan/llama3_405b.toml", 405.9),        # Llama-3.1-405B model card: 405B (405.85B counted)
    ("torchtitan/llama3_70b.toml", 70.6),           # Llama-3.1-70B: 70.6B
    ("hf/Mixtral-8x7B-v0.1.config.json", 46.7),     # Mixtral: 46.7B total
    ("hf/Qwen3-30B-A3B.config.json", 30.5),         # Qwen3-30B-A3B: 30.5B total
    ("hf/Qwen2.5-7B-Instruct.config.json", 7.6),    # Qwen2.5-7B: 7.61B
    ("hf/Llama-2-7b-hf.config.json", 6.7),          # Llama-2-7B: 6.74B
])
def test_published_sizes(config: str, billions: float) -> None:
    sc = api.load(FIXTURES / config, nodes=16)
    assert round(total_without_mtp(sc) / 1e9, 1) == billions


def test_llama31_405b_dimensions() -> None:
    sc = api.load(FIXTURES / "torchtitan/llama3_405b.toml", nodes=16)
    m = sc.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.kv_heads, m.vocab_size) == \
        (126, 16384, 53248, 128, 8, 128256)


@pytest.mark.parametrize("config", ["hf/Mixtral-8x7B-v0.1.config.json", "hf/Qwen3-30B-A3B.config.json",
                                    "hf/DeepSeek-V3.config.json"])
def test_activated_equals_meta_model_count(config: str) -> None:
    """Activated per token = all parameters of the transformers meta model except (1 - top_k / E) of the routed
    expert tensors (found by name). Mixtral's card says 12.9B active."""
    import json

    from tests.oracle.hf_models import meta_model, transformers

    cfg = {k: v for k, v in json.loads((FIXTURES / config).read_text()).items()
           if k not in ("auto_map", "quantization_config", "architectures")}
    hf = meta_model(transformers.CONFIG_MAPPING[cfg["model_type"]](**cfg))
    experts = sum(p.numel() for n, p in hf.named_parameters() if ".experts." in n)
    total = sum(p.numel() for p in hf.parameters())
    sc = api.load(FIXTURES / config)
    sc = sc.model_copy(update={"model": sc.model.model_copy(update={"mtp_num_layers": 0})})
    moe = sc.model.moe
    assert moe is not None
    assert api.inspect(sc).params_activated == total - experts + experts * moe.top_k // moe.num_experts
    if "Mixtral" in config:
        assert round(api.inspect(sc).params_activated / 1e9, 1) == 12.9
