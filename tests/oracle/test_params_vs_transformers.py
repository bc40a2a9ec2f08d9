"""Oracle: parameter counts equal what PyTorch counts on the same model built by HuggingFace `transformers` on the
meta device; per-rank counts equal a sharding done here by parameter name (tests/oracle/hf_models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from projection.formats.hf import load_hf
from projection.formats.native import preset_model_fields
from projection.paths import MODELS_DIR
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import RawScenario
from projection.workload.params import model_params, per_rank_params
from tests.oracle.hf_models import count, hf_config_for, meta_model, sharded_count_by_layer, transformers

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
HF_FILES = sorted((FIXTURES / "hf").glob("*.json")) if (FIXTURES / "hf").is_dir() else []
PRESETS = sorted(MODELS_DIR.glob("*.yaml"))


def _model_from_raw(raw: RawScenario) -> ModelSpec:
    return ModelSpec.model_validate(raw.data["model"])


def _hf_fixture_model(path: Path) -> tuple[ModelSpec, object]:
    cfg = json.loads(path.read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("auto_map", "quantization_config", "architectures")}
    hf_cfg = transformers.CONFIG_MAPPING[cfg["model_type"]](**cfg)
    return _model_from_raw(load_hf(path)), hf_cfg


@pytest.mark.skipif(not HF_FILES, reason="shared fixtures absent (user clone)")
@pytest.mark.parametrize("path", HF_FILES, ids=lambda p: p.stem)
def test_total_params_equal_transformers_meta_count(path: Path) -> None:
    model, hf_cfg = _hf_fixture_model(path)
    ours = model_params(model)
    # transformers builds no MTP module (DeepSeek-V3's num_nextn_predict_layers is ignored there).
    assert sum(ours.values()) - ours["mtp"] == count(meta_model(hf_cfg))


def test_published_totals_and_mtp_depth() -> None:
    """DeepSeek-V3 model card: 671B total, 37B activated (main model). One MTP depth = one MoE decoder layer (as
    transformers builds layer 60) + eh_proj 2h x h + enorm, hnorm and final norm (DeepSeek-V3 report §2.2)."""
    if not HF_FILES:
        pytest.skip("shared fixtures absent (user clone)")
    from projection.workload.params import activated_params

    model, hf_cfg = _hf_fixture_model(FIXTURES / "hf" / "DeepSeek-V3.config.json")
    total = model_params(model)
    assert round((sum(total.values()) - total["mtp"]) / 1e9) == 671
    assert 36.5e9 < activated_params(model.model_copy(update={"mtp_num_layers": 0})) < 38.5e9
    per_layer, _, _, _ = sharded_count_by_layer(meta_model(hf_cfg), 1, 1, 1)
    h = model.hidden_size
    assert total["mtp"] == per_layer[60] + 2 * h * h + 3 * h


def _independent_per_rank(hf_model: object, model: ModelSpec, tp: int, pp: int, ep: int, etp: int) -> list[int]:
    """Even contiguous split of layers over pp ranks; embedding first, final norm + head last."""
    per_layer, emb, norm, head = sharded_count_by_layer(hf_model, tp, ep, etp)
    n = model.num_layers // pp
    ranks = [sum(per_layer[i] for i in range(r * n, (r + 1) * n)) for r in range(pp)]
    ranks[0] += emb
    ranks[-1] += norm
    if not model.tie_embeddings or pp > 1:
        ranks[-1] += head  # tied with pp > 1: the last stage keeps its own copy of the embedding
    return ranks


CASES = [
    ("Meta-Llama-3.1-8B", 8, 4, 1, 1),
    ("Llama-2-7b-hf", 4, 2, 1, 1),
    ("Qwen2.5-7B-Instruct", 4, 4, 1, 1),
    ("Mixtral-8x7B-v0.1", 2, 4, 8, 1),
    ("Qwen3-30B-A3B", 4, 2, 8, 2),
    ("DeepSeek-V3.config", 8, 1, 32, 1),
]


@pytest.mark.skipif(not HF_FILES, reason="shared fixtures absent (user clone)")
@pytest.mark.parametrize(("stem", "tp", "pp", "ep", "etp"), CASES, ids=[c[0] for c in CASES])
def test_per_rank_params_equal_independent_sharding(stem: str, tp: int, pp: int, ep: int, etp: int) -> None:
    path = next(p for p in HF_FILES if p.stem.startswith(stem.replace(".config", "")))
    model, hf_cfg = _hf_fixture_model(path)
    model = model.model_copy(update={"mtp_num_layers": 0})
    plan = ParallelPlan(tp=tp, pp=pp, ep=ep, etp=etp, dp=ep)
    ours = [r.params for r in per_rank_params(model, plan)]
    assert ours == _independent_per_rank(meta_model(hf_cfg), model, tp, pp, ep, etp)


@pytest.mark.skipif(not PRESETS, reason="no presets in models/")
@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_total_equals_transformers_meta_count(path: Path) -> None:
    """Every bundled preset, rebuilt as the equivalent transformers model (same padded vocab), counts the same."""
    raw = RawScenario(source=str(path), framework="preset")
    for key, value, origin in preset_model_fields(path)[0]:
        raw.set(key, value, origin)
    model = _model_from_raw(raw)
    ours = model_params(model)
    hf_cfg = hf_config_for(model, vocab=model.padded_vocab(1))
    assert sum(ours.values()) - ours["mtp"] == count(meta_model(hf_cfg))


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 2), (4, 4)])
def test_per_rank_gpt_style_tied(tp: int, pp: int) -> None:
    """Megatron defaults (LayerNorm, biases, learned positions, plain GELU MLP, tied embeddings) = GPT-2's layout:
    row-parallel biases and position table replicated; tied with pp > 1 keeps an embedding copy on the last stage."""
    model = ModelSpec(num_layers=8, hidden_size=256, num_attention_heads=8, ffn_hidden_size=1024, gated_mlp=False,
                      activation="gelu", vocab_size=50257, vocab_divisible_by=128, vocab_pad_with_tp=True,
                      tie_embeddings=True, norm="layernorm", add_bias_linear=True, position_embedding="learned",
                      max_position_embeddings=1024)
    hf = meta_model(hf_config_for(model, vocab=model.padded_vocab(tp)))
    assert sum(model_params(model, vocab_tp=tp).values()) == count(hf)
    ours = [r.params for r in per_rank_params(model, ParallelPlan(tp=tp, pp=pp, dp=1))]
    assert ours == _independent_per_rank(hf, model, tp, pp, 1, 1)


VECTOR_CASES = [("Meta-Llama-3.1-8B", 0), ("Qwen2.5-7B-Instruct", 2), ("Mixtral-8x7B-v0.1", 0),
                ("Qwen3-30B-A3B", 0), ("DeepSeek-V3.config", 0)]


@pytest.mark.skipif(not HF_FILES, reason="shared fixtures absent (user clone)")
@pytest.mark.parametrize(("stem", "fused"), VECTOR_CASES, ids=[c[0] for c in VECTOR_CASES])
def test_hooked_vector_tensors_equal_the_one_dimensional_parameters(stem: str, fused: int) -> None:
    """The norm and bias tensors of each decoder layer (whose gradients Megatron's DDP hook adds into the main
    buffer, perf/stage_params.py `hooked`) = the 1-D parameters transformers builds per layer, less the q/k/v bias
    tensors Megatron fuses into linear_qkv's one bias (`fused`: 2 for Qwen2's separate q, k, v biases)."""
    import re

    from projection.perf.stage_params import stage_params
    from projection.workload.stages import split_stages

    path = next(p for p in HF_FILES if p.stem.startswith(stem.replace(".config", "")))
    model, hf_cfg = _hf_fixture_model(path)
    model = model.model_copy(update={"mtp_num_layers": 0})
    hf: dict[int, int] = {}
    for name, p in meta_model(hf_cfg).named_parameters():
        m = re.match(r"model\.layers\.(\d+)\.", name)
        if m and p.dim() == 1:
            hf[int(m[1])] = hf.get(int(m[1]), 0) + 1
    plan = ParallelPlan(tp=1, pp=1, ep=1, dp=1)
    (slot,) = split_stages(model, plan)
    ours = {int(name[5:]): k for name, k, _ in stage_params(model, plan, slot).hooked if name.startswith("layer")}
    assert ours == {i: n - fused for i, n in hf.items()}


def test_hooked_vector_tensors_of_a_gpt_layer() -> None:
    """Megatron's GPT defaults (LayerNorm, biases) against GPT-2 as transformers builds it: 8 one-dimensional
    parameters per block (two LayerNorms' weight and bias, the biases of c_attn, c_proj, c_fc and the MLP c_proj)."""
    import re

    from projection.perf.stage_params import stage_params
    from projection.workload.stages import split_stages

    model = ModelSpec(num_layers=2, hidden_size=256, num_attention_heads=8, ffn_hidden_size=1024, gated_mlp=False,
                      activation="gelu", vocab_size=50257, vocab_divisible_by=128, tie_embeddings=True,
                      norm="layernorm", add_bias_linear=True, position_embedding="learned",
                      max_position_embeddings=1024)
    hf: dict[int, int] = {}
    for name, p in meta_model(hf_config_for(model, vocab=model.padded_vocab(1))).named_parameters():
        m = re.match(r"transformer\.h\.(\d+)\.", name)
        if m and p.dim() == 1:
            hf[int(m[1])] = hf.get(int(m[1]), 0) + 1
    plan = ParallelPlan(tp=1, pp=1, dp=1)
    (slot,) = split_stages(model, plan)
    hooked = stage_params(model, plan, slot).hooked
    assert {int(n[5:]): k for n, k, _ in hooked if n.startswith("layer")} == hf == {0: 8, 1: 8}
    assert dict((n, k) for n, k, _ in hooked if not n.startswith("layer")) == {"embedding": 2, "output": 2}


def _hf_component(name: str) -> str:
    """The component of `projection inspect` a transformers parameter belongs to, by its name; norms inside the
    attention module (Qwen3's q/k norms, MLA's q_a / kv_a layernorms) are attention's, as Megatron-Core holds them
    in its attention module."""
    import re

    if "embed_tokens" in name:
        return "embedding"
    if name.startswith("lm_head"):
        return "output"
    if "shared_expert" in name:
        return "shared_experts"
    if ".experts." in name:
        return "experts"
    if re.search(r"\.(mlp|block_sparse_moe)\.gate\.", name) or "e_score_correction_bias" in name:
        return "router"
    if ".self_attn." in name:
        return "attention"
    if "layernorm" in name or name == "model.norm.weight":
        return "norms"
    if ".mlp." in name:
        return "dense_mlp"
    raise AssertionError(f"no component for {name}")


@pytest.mark.skipif(not HF_FILES, reason="shared fixtures absent (user clone)")
@pytest.mark.parametrize("path", HF_FILES, ids=lambda p: p.stem)
def test_params_by_component_equal_transformers_by_name(path: Path) -> None:
    """`projection inspect`'s by-component counts (embedding, attention, dense MLP, router, experts, shared experts,
    norms, output) equal the transformers model's parameters grouped by name (the totals alone could hide a
    parameter counted under the wrong component)."""
    model, hf_cfg = _hf_fixture_model(path)
    hf: dict[str, int] = {}
    for name, p in meta_model(hf_cfg).named_parameters():
        hf[_hf_component(name)] = hf.get(_hf_component(name), 0) + p.numel()
    ours = {k: v for k, v in model_params(model).items() if v and k != "mtp"}  # transformers builds no MTP
    assert ours == hf
