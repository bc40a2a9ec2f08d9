"""Options a Megatron-family job sets that projection reads but prices as their defaults are said in the
performance notes (formats/megatron_kernels.unmodelled_options, KernelSpec.unmodelled), not silently ignored: the
fused kernels Megatron-LM turns on by default, turned off, and MoE overlaps that are not priced."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.perf import project

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT.parent / "shared" / "fixtures"
MEGATRON = FIXTURES / "megatron"
BRIDGE = ROOT / "benchmarks" / "bridge_runs" / "perf_qwen3_235b_a22b_256xh100_fp8cs.yaml"
needs_fixtures = pytest.mark.skipif(not MEGATRON.exists(), reason="../shared/fixtures is absent (a user's clone)")


def _unmodelled(path: Path, overrides: tuple[str, ...] = (), **kw: object) -> tuple[str, ...]:
    sc = api.load(path, hardware="h100-sxm", gpus_per_node=8, overrides=list(overrides), **kw)  # type: ignore[arg-type]
    return sc.training.kernels.unmodelled


def _flags(options: tuple[str, ...]) -> list[str]:
    return [o.split(" (")[0] for o in options]


@needs_fixtures
def test_the_functional_tests_flags() -> None:
    # --no-bias-gelu-fusion is priced (Megatron-Core's unfused chain, KernelSpec.bias_activation_fusion), so not noted
    case = MEGATRON / "gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4" / "model_config.yaml"
    assert _unmodelled(case) == ()
    assert api.load(case, hardware="h100-sxm", gpus_per_node=8).training.kernels.bias_activation_fusion is False
    # --no-rope-fusion is priced (Megatron-Core's unfused chain, KernelSpec.rope_fusion), so not noted
    rope = MEGATRON / "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading" / "model_config.yaml"
    assert _unmodelled(rope) == ()
    assert api.load(rope, hardware="h100-sxm", gpus_per_node=8).training.kernels.rope_fusion is False
    dense = MEGATRON / "gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer" / "model_config.yaml"
    assert _unmodelled(dense) == ()
    # the note the projection prints
    sc = api.load(dense, hardware="h100-sxm", gpus_per_node=8, overrides=["bias_dropout_fusion=false"])
    assert any(n.startswith("not modelled, priced as without them: bias_dropout_fusion") for n in project(sc).notes)


@needs_fixtures
def test_each_option_where_it_applies() -> None:
    moe = MEGATRON / "gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4" / "model_config.yaml"
    dense = MEGATRON / "gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer" / "model_config.yaml"
    local = MEGATRON / "gpt3_mcore_tp4_pp1_resume_torch_dist" / "model_config.yaml"  # Megatron's own layers
    assert "moe_shared_expert_overlap" in _flags(_unmodelled(moe, ("moe_shared_expert_overlap=true",)))
    assert _unmodelled(dense, ("moe_shared_expert_overlap=true",)) == ()  # no experts to overlap
    assert _flags(_unmodelled(dense, ("delay_wgrad_compute=true",))) == ["delay_wgrad_compute"]
    assert _flags(_unmodelled(dense, ("bias_dropout_fusion=false",))) == ["bias_dropout_fusion"]
    # the masked softmax runs only in the unfused attention of Megatron's local layers
    assert _flags(_unmodelled(local, ("masked_softmax_fusion=false",))) == ["masked_softmax_fusion"]
    assert _unmodelled(dense, ("masked_softmax_fusion=false",)) == ()
    # RoPE fusion only matters with rotary positions; where it does, it is priced, not noted
    def rope_fusion(*over: str) -> bool:
        return api.load(dense, hardware="h100-sxm", gpus_per_node=8, overrides=list(over)).training.kernels.rope_fusion

    assert rope_fusion("apply_rope_fusion=false") and rope_fusion("position_embedding_type=rope")
    assert not rope_fusion("apply_rope_fusion=false", "position_embedding_type=rope")
    assert _unmodelled(dense, ("apply_rope_fusion=false", "position_embedding_type=rope")) == ()
    # the first option listed gives the note its origin (it was always the RoPE flag's)
    sc = api.load(dense, hardware="h100-sxm", gpus_per_node=8, overrides=["bias_dropout_fusion=false"])
    assert "bias_dropout_fusion" in str(sc.origins["training.kernels.unmodelled"])


def test_bridge_fields() -> None:
    kw = {"nodes": 32}
    assert _flags(_unmodelled(BRIDGE, **kw)) == ["comm_overlap.delay_wgrad_compute"]
    unfused = api.load(BRIDGE, hardware="h100-sxm", gpus_per_node=8, overrides=["model.bias_activation_fusion=false"],
                       **kw)  # type: ignore[arg-type]
    assert unfused.training.kernels.bias_activation_fusion is False
    assert _flags(unfused.training.kernels.unmodelled) == ["comm_overlap.delay_wgrad_compute"]
    assert _flags(_unmodelled(BRIDGE, ("model.bias_dropout_fusion=false",), **kw)) == [
        "model.bias_dropout_fusion", "comm_overlap.delay_wgrad_compute"]
