"""Primus experiments from AMD-AGI/Primus @fd1eeab (vendored under shared/fixtures/primus) against the resolved
examples A, B and C of config-formats.md §2.4 and the torchtitan example of §3.6.

Three levels: the built-in Primus defaults (primus_defaults) against the real preset files, value by value and line by
line; the merged trainer config of every example (`resolve_experiment`, dict level); and the Scenario each example
builds into on MI300X nodes of 8 GPUs (one node, or as many as tp * pp * cp needs: llama3.1_405B has tp 8 x pp 8,
so it is built on 8 nodes = 64 GPUs).

llama3.1_405B as written does not build: 126 layers do not split over pp 8, which stock Megatron rejects too
(num_layers % pp). Primus's `allow_padding_num_layers: true` (zero_bubble.yaml) pads only under the zero-bubble patch,
which is off. The test checks that error and then builds it with the embedding and the loss counted as pipeline
layers ((126 + 2) / 8 = 16 per stage), set through `--set` overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from projection.errors import PlanError
from projection.formats.common import load_yaml
from projection.formats.primus import from_layers, load_primus, load_primus_yaml, resolve_experiment
from projection.formats.primus_defaults import MODEL_BASE, MODULE_CONFIGS, TORCHTITAN_MODEL_PRESETS, Layer
from projection.specs.hardware import load_device
from projection.specs.scenario import Origin, Scenario, build_scenario
from projection.workload.stages import layer_counts

PRIMUS = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "primus"
if not PRIMUS.is_dir():
    pytest.skip(f"shared Primus fixtures not present at {PRIMUS}", allow_module_level=True)

MEGATRON = PRIMUS / "examples" / "megatron"
MI300X = MEGATRON / "configs" / "MI300X"
TITAN = PRIMUS / "examples" / "torchtitan" / "configs" / "MI300X"
EXAMPLES = sorted(PRIMUS.glob("examples/**/*.yaml"))
GPUS_PER_NODE = 8
# --set overrides an example needs to build (see the module docstring)
TO_BUILD: dict[str, dict[str, Any]] = {"llama3.1_405B-BF16-pretrain.yaml": {
    "account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}}


def leaves(data: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[tuple[str, ...], Any] = {}
    for k, v in data.items():
        out.update(leaves(v, (*prefix, str(k))))
    return out


def resolve(path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    return resolve_experiment(path, primus_root=PRIMUS, env=env or {}).params


def scenario(path: Path, **kw: Any) -> Scenario:
    """Load with the Primus checkout (unless told otherwise) and build on as many 8-GPU nodes as tp*pp*cp needs."""
    kw.setdefault("primus_root", PRIMUS)
    kw.setdefault("overrides", TO_BUILD.get(path.name))
    raw = load_primus(path, env=kw.pop("env", {}), **kw)
    plan = raw.data.get("plan", {})
    model_parallel = plan.get("tp", 1) * plan.get("pp", 1) * plan.get("cp", 1)
    raw.set("cluster.nodes", max(1, model_parallel // GPUS_PER_NODE), Origin("test"))
    return build_scenario(raw, load_device("mi300x"))


# ---- built-in defaults == the Primus files ----

ALL_LAYERS: dict[str, Layer] = {layer[0]: layer for layers in (*MODULE_CONFIGS.values(), *MODEL_BASE.values())
                                for layer in layers}
ALL_LAYERS.update({layer[0]: layer for layer in TORCHTITAN_MODEL_PRESETS.values()})


@pytest.mark.parametrize("file", sorted(ALL_LAYERS))
def test_builtin_values_and_lines_match_primus_files(file: str) -> None:
    data, lines = load_yaml(PRIMUS / "primus" / "configs" / file)
    for dotted, (value, line) in ALL_LAYERS[file][1].items():
        path = tuple(dotted.split("."))
        node = data
        for part in path:
            node = node[part]
        assert (node, type(node), lines[path]) == (value, type(value), line), f"{file}: {dotted}"


@pytest.mark.parametrize(("framework", "config"), sorted(MODULE_CONFIGS))
def test_builtin_module_configs_resolve_like_primus(framework: str, config: str) -> None:
    real = load_primus_yaml(PRIMUS / "primus" / "configs" / "modules" / framework / config, {})
    built = from_layers(MODULE_CONFIGS[(framework, config)])
    real_leaves = leaves(real.data)
    for path, value in leaves(built.data).items():
        assert real_leaves[path] == value, path
        assert real.origins[path].line == built.origins[path].line, path
        assert real.origins[path].file.endswith(built.origins[path].file.split(":", 1)[1]), path


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_builtin_path_agrees_with_the_checkout(path: Path) -> None:
    """Without --primus-root (built-in module defaults, Primus's own presets as models_dir) every key we keep has the
    value the full Primus merge gives it."""
    full = leaves(resolve(path))
    light = resolve_experiment(path, env={}, models_dir=PRIMUS / "primus" / "configs" / "models").params
    for key, value in leaves(light).items():
        assert full[key] == value, key


# ---- dict level: the resolved examples of config-formats.md §2.4 ----

def test_example_a_llama2_7b() -> None:
    p = resolve(MI300X / "llama2_7B-BF16-pretrain.yaml")
    assert [p[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads")] == [
        32, 4096, 11008, 32]
    assert (p["group_query_attention"], p["num_query_groups"], p["kv_channels"]) == (False, None, None)
    assert (p["seq_length"], p["max_position_embeddings"]) == (4096, 4096)   # overrides beat pre_trainer's 1024
    assert (p["tokenizer_type"], p["tokenizer_model"]) == ("Llama2Tokenizer", "meta-llama/Llama-2-7b-hf")
    assert (p["untie_embeddings_and_output_weights"], p["swiglu"], p["normalization"], p["rotary_base"]) == (
        True, True, "RMSNorm", 10000)
    assert (p["add_bias_linear"], p["qk_layernorm"]) == (False, False)
    assert (p["micro_batch_size"], p["global_batch_size"]) == (4, 256)
    assert [p[f"{k}_parallel_size"] for k in ("tensor_model", "pipeline_model", "context", "expert_model")] == [
        1, 1, 1, 1]
    assert p["sequence_parallel"] is True and p["use_distributed_optimizer"] is True
    assert (p["overlap_grad_reduce"], p["overlap_param_gather"]) == (True, True)
    assert p["recompute_granularity"] is None and p["bf16"] is True and p["fp8"] is None
    assert p["norm_epsilon"] == 1e-6


def test_example_b_deepseek_v3() -> None:
    path = MI300X / "deepseek_v3-BF16-pretrain.yaml"
    e = resolve_experiment(path, primus_root=PRIMUS, env={})
    p = e.params
    assert [p[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads")] == [
        61, 7168, 18432, 128]
    assert p["kv_channels"] == 128
    assert p["multi_latent_attention"] is False and p["mtp_num_layers"] is None      # turned off by overrides
    assert [p[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")] == [
        1536, 512, 128, 64, 128]
    assert [p[k] for k in ("num_experts", "moe_router_topk", "moe_ffn_hidden_size",
                           "moe_shared_expert_intermediate_size")] == [256, 8, 2048, 2048]
    assert p["moe_layer_freq"] == "([0]*3+[1]*58)"
    assert (p["moe_router_score_function"], p["moe_router_enable_expert_bias"], p["moe_router_num_groups"],
            p["moe_router_group_topk"], p["moe_router_topk_scaling_factor"], p["moe_router_dtype"],
            p["moe_router_load_balancing_type"]) == ("sigmoid", True, 8, 4, 2.5, "fp32", "seq_aux_loss")
    assert (p["moe_token_dispatcher_type"], p["moe_grouped_gemm"]) == ("alltoall", True)
    assert (p["qk_layernorm"], p["normalization"], p["position_embedding_type"], p["rotary_base"]) == (
        True, "RMSNorm", "rope", 10000)
    assert (p["rotary_scaling_factor"], p["original_max_position_embeddings"]) == (40.0, 4096)
    for key, value in (("seq_length", 4096), ("max_position_embeddings", 4096), ("tensor_model_parallel_size", 1),
                       ("pipeline_model_parallel_size", 1), ("expert_model_parallel_size", 8)):
        assert p[key] == value and type(p[key]) is int, key                         # ints after substitution
    assert (p["micro_batch_size"], p["global_batch_size"]) == (4, 256)
    assert p["train_data_path"] is None and p["mock_data"] is True                 # ${...:null} -> "null" -> None
    assert (p["use_distributed_optimizer"], p["overlap_grad_reduce"], p["overlap_param_gather"]) == (True,) * 3
    assert e.origins["seq_length"] == Origin(str(path), 28, "modules.pre_trainer.overrides.seq_length")
    assert e.origins["num_experts"].file.endswith("models/megatron/deepseek_v3.yaml")


def test_example_c_llama31_70b() -> None:
    p = resolve(MI300X / "llama3.1_70B-BF16-pretrain.yaml")
    assert [p[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads")] == [
        80, 8192, 28672, 64]
    assert (p["group_query_attention"], p["num_query_groups"]) == (True, 8)
    assert (p["max_position_embeddings"], p["seq_length"], p["rotary_base"]) == (8192, 8192, 500000)
    assert (p["tokenizer_type"], p["tokenizer_model"]) == ("Llama3Tokenizer", "meta-llama/Llama-3.1-70B")
    assert (p["micro_batch_size"], p["global_batch_size"]) == (3, 24)
    assert (p["use_torch_fsdp2"], p["use_distributed_optimizer"], p["overlap_param_gather"]) == (True, False, False)
    assert p["sequence_parallel"] == 1 and type(p["sequence_parallel"]) is int     # an int, not a bool
    assert (p["recompute_granularity"], p["recompute_method"], p["recompute_num_layers"]) == ("full", "block", 80)
    assert p["bf16"] is True


def test_llama31_405b_and_env_selected_model() -> None:
    p = resolve(MI300X / "llama3.1_405B-BF16-pretrain.yaml")
    assert [p[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                           "num_query_groups")] == [126, 16384, 53248, 128, 8]
    assert (p["tensor_model_parallel_size"], p["pipeline_model_parallel_size"]) == (8, 8)
    assert resolve(MEGATRON / "exp_pretrain.yaml")["model"] == "llama2_7B.yaml"
    p = resolve(MEGATRON / "exp_pretrain.yaml", {"PRIMUS_MODEL": "llama3.1_8B"})
    assert (p["model"], p["num_layers"], p["num_query_groups"], p["ffn_hidden_size"]) == (
        "llama3.1_8B.yaml", 32, 8, 14336)


def test_torchtitan_examples_resolve() -> None:
    p = resolve(TITAN / "llama3.1_8B-BF16-pretrain.yaml")
    assert p["model"] == {"name": "llama3", "flavor": "8B", "hf_assets_path": "meta-llama/Llama-3.1-8B",
                          "converters": ["primus_turbo"]}
    t = p["training"]
    assert (t["local_batch_size"], t["seq_len"], t["global_batch_size"], t["steps"]) == (4, 8192, -1, 50)
    assert (t["mixed_precision_param"], t["mixed_precision_reduce"]) == ("bfloat16", "float32")
    par = p["parallelism"]
    assert par["data_parallel_shard_degree"] == -1
    assert all(par[f"{k}_degree"] == 1 for k in ("tensor_parallel", "pipeline_parallel", "context_parallel",
                                                  "data_parallel_replicate", "expert_parallel"))
    assert (p["activation_checkpoint"]["mode"], p["activation_checkpoint"]["selective_ac_option"]) == ("none", "op")
    assert p["compile"]["enable"] is True
    fp8 = resolve(TITAN / "llama3.1_8B-FP8-pretrain.yaml")
    assert fp8["model"]["converters"] == ["primus_turbo", "quantize.linear.float8"]
    f8 = fp8["quantize"]["linear"]["float8"]
    assert (f8["enable_fsdp_float8_all_gather"], f8["precompute_float8_dynamic_scale_for_fsdp"], f8["filter_fqns"],
            fp8["training"]["local_batch_size"]) == (True, True, ["output"], 5)
    big = resolve(TITAN / "deepseek_v3_671b-pretrain.yaml")
    assert (big["model"]["flavor"], big["training"]["local_batch_size"], big["training"]["seq_len"]) == (
        "671B", 16, 4096)
    par = big["parallelism"]
    assert (par["expert_parallel_degree"], par["expert_tensor_parallel_degree"], par["pipeline_parallel_schedule"]) == (
        8, 1, "Interleaved1F1B")
    assert (big["activation_checkpoint"]["mode"], big["compile"]["enable"], big["debug"]["moe_force_load_balance"]) == (
        "full", True, True)


# ---- Scenario level (needs the Megatron and TorchTitan converters) ----

@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_builds(path: Path) -> None:
    s = scenario(path)
    assert s.framework == ("primus-torchtitan" if "torchtitan" in path.parts else "primus-megatron")
    assert s.world_size == max(GPUS_PER_NODE, s.plan.tp * s.plan.pp * s.plan.cp)


@pytest.mark.parametrize("path", sorted(MI300X.glob("*.yaml")) + [MEGATRON / "exp_pretrain.yaml"],
                         ids=lambda p: p.name)
def test_megatron_examples_build_from_our_presets(path: Path) -> None:
    """No Primus checkout: built-in module defaults + the bundled models/ presets."""
    with_root, without = scenario(path), scenario(path, primus_root=None)
    assert without.model.num_layers == with_root.model.num_layers
    assert without.model.hidden_size == with_root.model.hidden_size
    assert without.training == with_root.training
    assert without.plan == with_root.plan


def test_example_a_scenario() -> None:
    s = scenario(MI300X / "llama2_7B-BF16-pretrain.yaml")
    m, t, p = s.model, s.training, s.plan
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.kv_heads, m.head_dim_) == (32, 4096, 11008, 32, 128)
    assert (m.vocab_size, m.padded_vocab(p.tp), m.tie_embeddings, m.norm) == (32000, 32000, False, "rmsnorm")
    assert (t.seq_length, t.micro_batch_size, t.global_batch_size, t.params_dtype, t.fp8) == (4096, 4, 256, "bf16",
                                                                                               None)
    assert (p.tp, p.pp, p.dp, p.sp_, p.sharding.zero_stage) == (1, 1, 8, False, 1)
    assert (p.overlap.grad_reduce, p.overlap.param_gather, p.recompute.granularity) == (True, True, "none")
    assert t.num_microbatches(8) == 8


def test_example_b_scenario() -> None:
    s = scenario(MI300X / "deepseek_v3-BF16-pretrain.yaml")
    m, p = s.model, s.plan
    assert m.mla is None and m.mtp_num_layers == 0                                  # MLA off, MTP off
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.head_dim_, m.kv_heads) == (61, 7168, 128, 128, 128)
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size) == (256, 8, 2048)
    assert m.moe.shared_expert_ffn_hidden_size == 2048
    assert [m.is_moe_layer(i) for i in range(4)] == [False, False, False, True] and m.num_moe_layers == 58
    assert (s.training.seq_length, p.ep, p.dp, p.edp(), p.sharding.zero_stage) == (4096, 8, 8, 1, 1)


def test_turbo_deepep_runs_the_flex_dispatcher() -> None:
    """Primus-Turbo's DeepEP (enable_primus_turbo + use_turbo_deepep): Primus sets Megatron's flex dispatcher before
    the model is built (primus/backends/megatron/patches/turbo/moe_dispatcher_patches.py), which the projection says
    it prices as the NCCL all-to-all; without Turbo the file's own dispatcher stays."""
    path = MI300X / "deepseek_v2_lite-BF16-pretrain.yaml"
    s = scenario(path)
    assert s.training.kernels.moe_token_dispatcher == "flex"
    assert s.origins["training.kernels.moe_token_dispatcher"].endswith("use_turbo_deepep)")
    off = scenario(path, overrides={"enable_primus_turbo": False})
    assert off.training.kernels.moe_token_dispatcher == "alltoall"
    # Primus's _is_turbo_deepep_enabled also needs tensor_model_parallel_size == 1
    tp2 = scenario(path, overrides={"tensor_model_parallel_size": 2, "sequence_parallel": True,
                                    "expert_tensor_parallel_size": 1})
    assert tp2.training.kernels.moe_token_dispatcher == "alltoall"


def test_example_c_scenario() -> None:
    s = scenario(MI300X / "llama3.1_70B-BF16-pretrain.yaml")
    m, t, p = s.model, s.training, s.plan
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.kv_heads) == (
        80, 8192, 28672, 64, 8)
    assert (m.vocab_size, m.rope_theta) == (128256, 500000)
    assert (t.seq_length, t.micro_batch_size, t.global_batch_size) == (8192, 3, 24)
    assert (p.sharding.zero_stage, p.sharding.fsdp, p.dp) == (3, "torch_fsdp2", 8)
    assert (p.recompute.granularity, p.recompute.method, p.recompute.num_layers) == ("full", "block", 80)
    assert t.num_microbatches(8) == 1


def test_llama31_405b_and_exp_pretrain_scenarios() -> None:
    path = MI300X / "llama3.1_405B-BF16-pretrain.yaml"
    with pytest.raises(PlanError) as err:
        scenario(path, overrides=None)
    p = err.value.problems[0]
    assert (p.file, p.line) == (str(path), 40) and "126 layers" in p.message
    s = scenario(path)                                                             # tp 8 x pp 8: 8 nodes
    m = s.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.kv_heads, m.vocab_size) == (
        126, 16384, 53248, 128, 8, 128256)
    assert (s.world_size, s.plan.tp, s.plan.pp, s.plan.dp) == (64, 8, 8, 1)
    assert layer_counts(s.model, s.plan) == [15] + [16] * 6 + [15]
    s = scenario(MEGATRON / "exp_pretrain.yaml", env={"PRIMUS_MODEL": "llama3.1_8B"})
    assert (s.model.num_layers, s.model.kv_heads, s.model.ffn_hidden_size, s.model.vocab_size) == (32, 8, 14336,
                                                                                                   128256)


def test_torchtitan_scenarios() -> None:
    s = scenario(TITAN / "llama3.1_8B-BF16-pretrain.yaml")
    assert (s.model.num_layers, s.model.kv_heads, s.model.ffn_hidden_size, s.model.vocab_size) == (32, 8, 14336,
                                                                                                   128256)
    assert (s.training.seq_length, s.training.local_batch_size, s.plan.dp, s.plan.sharding.zero_stage) == (
        8192, 4, 8, 3)
    assert s.plan.recompute.granularity == "none"
    s = scenario(TITAN / "llama3.1_8B-FP8-pretrain.yaml")
    # Primus-Turbo's float8 linear (primus_turbo.use_turbo_float8_linear, on by default) replaces torchao's: fp8
    # inputs and weights saved, and the file's enable_fsdp_float8_all_gather has no effect on it
    f8 = s.training.fp8
    assert f8 is not None and f8.library == "primus_turbo" and not f8.param_gather and not f8.output_layer
    assert s.training.local_batch_size == 5
    s = scenario(TITAN / "deepseek_v3_671b-pretrain.yaml")
    assert s.model.moe is not None and (s.model.moe.num_experts, s.model.moe.top_k) == (256, 8)
    assert (s.model.num_layers, s.training.seq_length, s.training.local_batch_size) == (61, 4096, 16)
    assert (s.plan.ep, s.plan.dp, s.plan.recompute.granularity) == (8, 8, "full")
