"""TorchTitan loader: flavor FFN rounding, batch and DP defaults, PP stage split, precision, v0.1 layout, errors.

Expected numbers come from shared/reference/config-formats.md §3 (worked examples and rules), computed by hand here.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from projection.errors import ConfigError
from projection.formats.torchtitan import job_config_to_raw, load_torchtitan, stage_layer_counts
from projection.formats.torchtitan_flavors import (
    known_flavors,
    llama4_expert_hidden_dim,
    llama_ffn_hidden_dim,
    model_fields,
)
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Origin
from projection.workload.stages import split_stages


def _cfg(**sections: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {"model": {"name": "llama3", "flavor": "8B"}, "training": {"local_batch_size": 4}}
    for name, body in sections.items():
        base[name] = {**base.get(name, {}), **body}
    return base


def _raw(cfg: dict[str, Any]) -> Any:
    return job_config_to_raw(cfg, {}, source="job.toml")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ FFN rounding (§3.3)
@pytest.mark.parametrize(("dim", "multiple_of", "mult", "expected"), [
    (4096, 1024, 1.3, 14336),   # 8B: 16384 -> 10922 -> 14198 -> 14336
    (8192, 4096, 1.3, 28672),   # 70B: 32768 -> 21845 -> 28398 -> 28672
    (16384, 4096, 1.2, 53248),  # 405B: 65536 -> 43690 -> 52428 -> 53248 (rounding down would give 49152)
    (256, 256, None, 768),      # debugmodel: 1024 -> 682 -> 768
    (5120, 2048, 1.2, 16384),   # Llama-4 Maverick dense layers
])
def test_llama_ffn_truncates_twice_then_rounds_up(dim: int, multiple_of: int, mult: float | None,
                                                  expected: int) -> None:
    assert llama_ffn_hidden_dim(dim, multiple_of, mult) == expected


def test_llama4_expert_hidden_divides_by_topk_plus_shared_before_rounding() -> None:
    # Scout: 20480 -> 13653 -> 16383 -> /(1 + 1) = 8191 -> 8192
    assert llama4_expert_hidden_dim(5120, 2048, 1.2, top_k=1, num_shared_experts=1) == 8192
    # without auto-scaling the dense size comes back
    assert llama4_expert_hidden_dim(5120, 2048, 1.2, 1, 1, auto_scale=False) == 16384


def test_flavor_moe_layer_patterns() -> None:
    maverick = ModelSpec.model_validate(model_fields("llama4", "17bx128e"))
    assert [maverick.is_moe_layer(i) for i in range(4)] == [False, True, False, True]  # (i + 1) % 2 == 0
    ds = ModelSpec.model_validate(model_fields("deepseek_v3", "16B"))
    assert not ds.is_moe_layer(0) and ds.is_moe_layer(1) and ds.num_moe_layers == 26
    qwen = ModelSpec.model_validate(model_fields("qwen3", "235B-A22B"))
    assert qwen.num_moe_layers == 94 and qwen.moe is not None and qwen.moe.shared_expert_ffn_hidden_size == 0
    assert ModelSpec.model_validate(model_fields("qwen3", "0.6B")).tie_embeddings


def test_every_flavor_is_a_valid_model_spec() -> None:
    for model in ("llama3", "llama4", "deepseek_v3", "qwen3"):
        for flavor in known_flavors(model):
            ModelSpec.model_validate(model_fields(model, flavor))


# ------------------------------------------------------------------------------------------------ batch, DP, FSDP
def test_global_batch_minus_one_is_left_unset() -> None:
    raw = _raw(_cfg(training={"global_batch_size": -1}))
    assert raw.get("training.global_batch_size") is None
    assert raw.get("training.micro_batch_size") == 4 and raw.get("training.local_batch_size") == 4
    raw = _raw(_cfg(training={"global_batch_size": 512}))
    assert raw.get("training.global_batch_size") == 512


def test_dp_shard_minus_one_leaves_dp_to_the_world_size() -> None:
    raw = _raw(_cfg())
    assert raw.get("plan.dp") is None
    assert raw.get("plan.sharding.zero_stage") == 3 and raw.get("plan.sharding.fsdp") == "torch_fsdp2"
    raw = _raw(_cfg(parallelism={"data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 4}))
    assert raw.get("plan.dp") == 8 and raw.get("plan.sharding.dp_replicate") == 2
    # replicas with a shard degree of 1: FSDP is asked for and resolves to none (DDP) when the scenario is built
    # (specs/validate.torchtitan_without_fsdp; test_an_explicit_shard_degree_of_one_is_the_resolved_one)
    ddp = _raw(_cfg(parallelism={"data_parallel_replicate_degree": 8, "data_parallel_shard_degree": 1}))
    assert ddp.get("plan.dp") == 8 and ddp.get("plan.sharding.dp_replicate") == 8


def test_reshard_after_forward_default_depends_on_pp() -> None:
    assert _raw(_cfg()).get("plan.sharding.reshard_after_forward") is True
    piped = _raw(_cfg(parallelism={"pipeline_parallel_degree": 2}))
    assert piped.get("plan.sharding.reshard_after_forward") is False
    never = _raw(_cfg(parallelism={"fsdp_reshard_after_forward": "never"}))
    assert never.get("plan.sharding.reshard_after_forward") is False


def test_tp_implies_sp_and_pp_microbatch_size() -> None:
    raw = _raw(_cfg(parallelism={"tensor_parallel_degree": 4, "pipeline_parallel_degree": 2,
                                 "pipeline_parallel_microbatch_size": 2}))
    assert raw.get("plan.sp") is True and raw.get("plan.tp") == 4
    assert raw.get("training.micro_batch_size") == 2 and raw.get("training.local_batch_size") == 4


def test_expert_degrees() -> None:
    ds = {"name": "deepseek_v3", "flavor": "16B"}
    raw = _raw(_cfg(model=ds, parallelism={"expert_parallel_degree": 8, "expert_tensor_parallel_degree": 1}))
    assert raw.get("plan.ep") == 8 and raw.get("plan.etp") == 1
    assert _raw(_cfg(model=ds, parallelism={"expert_tensor_parallel_degree": 1,
                                            "tensor_parallel_degree": 2})).get("plan.etp") is None  # EP 1: etp = tp
    assert _raw(_cfg(parallelism={"expert_parallel_degree": 8})).get("plan.ep") is None  # dense model: no effect
    with pytest.raises(ConfigError, match="must be 1 or equal to tensor_parallel_degree 4"):
        _raw(_cfg(model=ds, parallelism={"expert_parallel_degree": 8, "expert_tensor_parallel_degree": 2,
                                         "tensor_parallel_degree": 4}))


# ------------------------------------------------------------------------------------------------ precision, AC
def test_precision_mapping() -> None:
    mixed = _raw(_cfg())
    assert mixed.get("training.params_dtype") == "bf16"
    assert mixed.get("training.optimizer.main_params_dtype") == "fp32"
    assert mixed.get("training.optimizer.name") == "adamw"
    pure = _raw(_cfg(training={"dtype": "bfloat16"}))
    assert pure.get("training.params_dtype") == "bf16"
    assert pure.get("training.optimizer.main_params_dtype") == "bf16"
    assert _raw(_cfg(training={"mixed_precision_param": "float32"})).get("training.params_dtype") == "fp32"


@pytest.mark.parametrize(("section", "expected"), [
    ({}, {"granularity": "selective", "modules": ("layer:2",)}),  # TorchTitan default: selective, option "2"
    ({"mode": "selective", "selective_ac_option": "op"}, {"granularity": "selective", "modules": ("op",)}),
    ({"mode": "selective", "selective_ac_option": "3"}, {"granularity": "selective", "modules": ("layer:3",)}),
    ({"mode": "full"}, {"granularity": "full", "method": "uniform", "num_layers": 1}),
    ({"mode": "none"}, {"granularity": "none"}),
])
def test_activation_checkpoint(section: dict[str, Any], expected: dict[str, Any]) -> None:
    assert _raw(_cfg(activation_checkpoint=section)).get("plan.recompute") == expected


def test_activation_checkpoint_rejects_what_it_cannot_project() -> None:
    with pytest.raises(ConfigError, match="memory_budget"):
        _raw(_cfg(activation_checkpoint={"mode": "memory_budget"}))
    with pytest.raises(ConfigError, match="neither 'op' nor an integer"):
        _raw(_cfg(activation_checkpoint={"mode": "selective", "selective_ac_option": "-1"}))
    # 0 checkpoints every block: TorchTitan's apply_ac wraps when `not ac_freq or count % ac_freq == 0`
    every = _raw(_cfg(activation_checkpoint={"mode": "selective", "selective_ac_option": "0"}))
    assert every.get("plan.recompute")["modules"] == ("layer:1",)


# ------------------------------------------------------------------------------------------------ PP stage split
@pytest.mark.parametrize(("pp", "schedule", "first", "last", "expected"), [
    (2, "1F1B", 1, 1, (16, 16)),                            # 34 units / 2 = 17 each
    (2, "1F1B", 3, 0, (15, 17)),                            # 35 units -> 18 - 3, 17 - 0
    (4, "1F1B", 1, 1, (8, 9, 8, 7)),                        # 34 / 4 = 8 r 2 -> 9, 9, 8, 8
    (4, "GPipe", 2, 1, (7, 9, 9, 7)),                       # 35 / 4 = 8 r 3 -> 9, 9, 9, 8
    (4, "1F1B", 0, 0, (8, 8, 8, 8)),
    (2, "Interleaved1F1B", 1, 1, (8, 9, 8, 7)),             # 2 stages per rank
    (4, "Interleaved1F1B", 1, 1, (4, 5, 4, 4, 4, 4, 4, 3)),  # 34 / 8 = 4 r 2
])
def test_stage_split(pp: int, schedule: str, first: int, last: int, expected: tuple[int, ...]) -> None:
    raw = _raw(_cfg(parallelism={"pipeline_parallel_degree": pp, "pipeline_parallel_schedule": schedule,
                                 "pipeline_parallel_first_stage_less_layers": first,
                                 "pipeline_parallel_last_stage_less_layers": last}))
    assert raw.get("plan.stage_layers") == expected
    assert raw.get("plan.vpp") == (2 if len(expected) > pp else None)
    model = ModelSpec.model_validate(raw.data["model"])
    slots = split_stages(model, ParallelPlan.model_validate(raw.data["plan"]))
    assert [len(s.layers) for s in slots] == list(expected) and slots[0].embedding and slots[-1].loss


def test_v_schedule_places_stages_in_a_v() -> None:
    raw = _raw(_cfg(parallelism={"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "ZBVZeroBubble"}))
    assert raw.get("plan.schedule") == "zbv" and raw.get("plan.vpp") == 2
    slots = split_stages(ModelSpec.model_validate(raw.data["model"]), ParallelPlan.model_validate(raw.data["plan"]))
    assert [s.pp_rank for s in slots] == [0, 1, 1, 0]


def test_layers_per_stage_and_explicit_parts() -> None:
    # ceil((32 + 1 + 1) / 6) = 6 stages = 3 per rank; 34 / 6 = 5 r 4 -> 6, 6, 6, 6, 5, 5
    raw = _raw(_cfg(parallelism={"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "Interleaved1F1B",
                                 "pipeline_parallel_layers_per_stage": 6}))
    assert raw.get("plan.stage_layers") == (5, 6, 6, 6, 5, 4) and raw.get("plan.vpp") == 3
    with pytest.raises(ConfigError, match="not a multiple of pipeline_parallel_degree"):
        _raw(_cfg(parallelism={"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "Interleaved1F1B",
                               "pipeline_parallel_layers_per_stage": 4}))  # ceil(34 / 4) = 9 stages
    parts = [["tok_embeddings", *(f"layers.{i}" for i in range(10))],
             [*(f"layers.{i}" for i in range(10, 32)), "norm", "output"]]
    raw = _raw(_cfg(parallelism={"pipeline_parallel_degree": 2, "module_fqns_per_model_part": parts}))
    assert raw.get("plan.stage_layers") == (10, 22)
    v01 = _raw(_cfg(parallelism={"pipeline_parallel_degree": 2, "pipeline_parallel_split_points": ["layers.12"]}))
    assert v01.get("plan.stage_layers") == (12, 20)


def test_stage_split_rules() -> None:
    assert stage_layer_counts(32, 1) == [32]
    assert stage_layer_counts(2, 4, 1, 1) == [0, 1, 1, 0]  # 1 unit each: stages 0 and 3 hold only emb / output
    with pytest.raises(ValueError, match="cannot fill"):
        stage_layer_counts(2, 5, 1, 1)  # 4 units for 5 stages
    with pytest.raises(ValueError, match="cannot fill"):
        stage_layer_counts(4, 7, 2, 1)  # 1 unit per stage, but the embedding weighs 2
    assert sum(stage_layer_counts(126, 16)) == 126


def test_single_stage_schedule_refuses_two_stages_per_rank_and_qwen3_refuses_pp() -> None:
    with pytest.raises(ConfigError, match=r"needs exactly 1 stage\(s\) per rank"):
        _raw(_cfg(parallelism={"pipeline_parallel_degree": 2, "pipeline_parallel_layers_per_stage": 9}))
    with pytest.raises(ConfigError, match="no pipeline parallelism for qwen3"):
        _raw(_cfg(model={"name": "qwen3", "flavor": "32B"}, parallelism={"pipeline_parallel_degree": 2}))
    with pytest.raises(ConfigError, match="unsupported pipeline schedule"):
        _raw(_cfg(parallelism={"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "Zigzag"}))


# ------------------------------------------------------------------------------------------------ FP8, v0.1 layout
V01 = """\
    [model]
    name = "llama3"
    flavor = "8B"
    tokenizer_path = "./assets/tokenizer/original/tokenizer.model"
    converters = ["float8"]

    [training]
    local_batch_size = 1
    seq_len = 8192
    compile = true

    [parallelism]
    data_parallel_shard_degree = -1
    tensor_parallel_degree = 2
    enable_async_tensor_parallel = true

    [checkpoint]
    enable_checkpoint = false

    [float8]
    enable_fsdp_float8_all_gather = true
    precompute_float8_dynamic_scale_for_fsdp = true
    filter_fqns = ["output"]
"""


def test_v01_layout(tmp_path: Path) -> None:
    raw = load_torchtitan(_write(tmp_path, V01))
    # the legacy converter name "float8" with a tensorwise recipe: v0.1's models take the float8 TP plan
    assert raw.get("training.fp8") == {"format": "hybrid", "recipe": "tensorwise", "param_gather": True,
                                         "library": "torchao", "grouped_experts": False, "output_layer": False,
                                         "tp_float8": True}
    assert raw.get("plan.overlap.tp_comm") is True  # async TP with training.compile (v0.1)
    assert raw.get("model.ffn_hidden_size") == 14336 and raw.framework == "torchtitan"


def test_fp8_only_through_converters() -> None:
    section = {"quantize": {"linear": {"float8": {"enable_fsdp_float8_all_gather": True}}}}
    assert _raw({**_cfg(), **section}).get("training.fp8") is None  # the table alone does nothing
    on = _raw({**_cfg(model={"converters": ["quantize.linear.float8"]}), **section})
    base = {"library": "torchao", "grouped_experts": False, "output_layer": True, "tp_float8": False}
    assert on.get("training.fp8") == {"format": "hybrid", "recipe": "tensorwise", "param_gather": True, **base}
    # a named recipe with fp8 all-gather: TorchTitan's float8 converter asserts the pair away
    rowwise = {"quantize": {"linear": {"float8": {"recipe_name": "rowwise", "enable_fsdp_float8_all_gather": True}}}}
    with pytest.raises(ConfigError, match="TorchTitan refuses the pair"):
        _raw({**_cfg(model={"converters": ["float8"]}), **rowwise})
    rowwise = {"quantize": {"linear": {"float8": {"recipe_name": "rowwise", "filter_fqns": ["output"]}}}}
    assert _raw({**_cfg(model={"converters": ["float8"]}), **rowwise}).get("training.fp8") == {
        "format": "e4m3", "recipe": "rowwise", "param_gather": False, **base, "output_layer": False}
    mx = _raw(_cfg(model={"converters": ["quantize.linear.mx"]}))  # MX's default filter_fqns names the output layer
    mx_base = {k: v for k, v in base.items() if k != "tp_float8"}  # MX takes no float8 TP plan
    assert mx.get("training.fp8") == {"format": "e4m3", "recipe": "mxfp8", "param_gather": False, **mx_base,
                                      "output_layer": False}
    both = {"converters": ["float8", "quantize.grouped_mm.float8"]}
    assert _raw(_cfg(model=both)).get("training.fp8")["grouped_experts"] is False  # fqns [] converts nothing
    named = {"quantize": {"grouped_mm": {"float8": {"fqns": ["experts"]}}}}
    assert _raw({**_cfg(model=both), **named}).get("training.fp8")["grouped_experts"] is True
    # the float8 TP plan: the legacy name and a tensorwise recipe (on a MoE model its attention and dense blocks:
    # workload/ops.py); DeepSeek-V3's MLA refuses it under TP (TorchTitan raises NotImplementedError)
    legacy = _raw(_cfg(model={"converters": ["float8"]})).get("training.fp8")
    assert legacy["tp_float8"] is True
    moe = _raw(_cfg(model={"converters": ["float8"], "name": "llama4", "flavor": "debugmodel"}))
    assert moe.get("model.moe") and moe.get("training.fp8")["tp_float8"] is True
    mla = {"model": {"converters": ["float8"], "name": "deepseek_v3", "flavor": "debugmodel"}}
    with pytest.raises(ConfigError, match="float8 tensorwise TP on an MLA model"):
        _raw({**_cfg(**mla), "parallelism": {"tensor_parallel_degree": 2}})
    assert _raw(_cfg(**mla)).get("training.fp8")["tp_float8"] is True  # tp 1: no TP plan at all
    with pytest.raises(ConfigError, match="unknown model converter 'int4'"):
        _raw(_cfg(model={"converters": ["int4"]}))


# ------------------------------------------------------------------------------------------------ errors, overrides
def test_unknown_key_names_file_line_key_and_fix(tmp_path: Path) -> None:
    path = _write(tmp_path, """\
        [model]
        name = "llama3"
        flavor = "8B"

        [parallelism]
        tensor_paralel_degree = 8

        [job]
        anything_goes = 1

        [trainig]
        steps = 3
    """)
    # unknown keys leave the job whole: the loader hands them on, and the scenario reports them with the layout's
    # problems (here none: tp 1 on 8 GPUs)
    first, second = load_torchtitan(path).deferred
    from projection import api

    with pytest.raises(ConfigError) as err:
        api.load(path, nodes=1, hardware="h100-sxm")
    assert err.value.problems == [first, second]
    assert (first.file, first.line, first.key) == (str(path), 6, "parallelism.tensor_paralel_degree")
    assert "did you mean 'tensor_parallel_degree'" in first.message and first.fix
    assert (second.line, second.key) == (11, "trainig") and "unknown section" in second.message


def test_unknown_flavor_and_model_list_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        _raw(_cfg(model={"flavor": "7B"}))
    problem = err.value.problems[0]
    assert problem.key == "model.flavor" and problem.fix is not None and "405B" in problem.fix
    with pytest.raises(ConfigError, match="unknown TorchTitan model name 'gpt5'") as err:
        _raw(_cfg(model={"name": "gpt5"}))
    assert "deepseek_v3" in (err.value.problems[0].fix or "")


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        _raw(_cfg(training={"seq_len": "long", "local_batch_size": 0}, optimizer={"name": "Lion"}))
    assert len(err.value.problems) == 3


def test_overrides_use_cli_spelling_and_origin(tmp_path: Path) -> None:
    path = _write(tmp_path, '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\n')
    raw = load_torchtitan(path, {"training.local_batch_size": 3, "--parallelism.tensor_parallel_degree": "2"})
    assert raw.get("training.local_batch_size") == 3 and raw.get("plan.tp") == 2
    assert raw.origins["training.local_batch_size"] == Origin("--set", None, "training.local_batch_size")
    assert raw.origins["model.num_layers"] == Origin(str(path), 3, "model.flavor")


def test_yaml_nulls_mean_defaults() -> None:
    # Primus renders JobConfig as YAML, with null for Optional fields.
    cfg = _cfg(parallelism={"pipeline_parallel_layers_per_stage": None, "module_fqns_per_model_part": None,
                            "data_parallel_shard_degree": -1}, training={"global_batch_size": None})
    raw = job_config_to_raw(cfg, {"model.flavor": Origin("exp.yaml", 7, "model.flavor")}, source="exp.yaml",
                            framework="primus")
    assert raw.framework == "primus" and raw.get("training.global_batch_size") is None
    assert raw.origins["model.hidden_size"].line == 7


def test_looped_bfs_is_gpipe_looped_and_interleaved_zero_bubble_is_refused() -> None:
    """LoopedBFS is gpipe with several stages per rank (tests/oracle/test_schedules_vs_torch.py checks the order
    against torch's ScheduleLoopedBFS); InterleavedZeroBubble over two or more stages per rank has no model here."""
    raw = _raw(_cfg(parallelism={"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "LoopedBFS"}))
    assert raw.get("plan.schedule") == "gpipe" and raw.get("plan.vpp") == 2
    with pytest.raises(ConfigError, match="InterleavedZeroBubble .* is not modelled") as err:
        _raw(_cfg(parallelism={"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "InterleavedZeroBubble"}))
    assert err.value.problems[0].key == "parallelism.pipeline_parallel_schedule"


# ------------------------------------------------------------------------------------ no FSDP at dp_shard 1 (§3.4)
def _llama8b_job(tmp_path: Path, training_extra: str = "", parallelism: str = "tensor_parallel_degree = 8") -> Path:
    """Llama-3-8B, local batch 1 of 1024 tokens; by default tp 8 with dp_shard left to the world size (-1)."""
    return _write(tmp_path, f"""
        [model]
        name = "llama3"
        flavor = "8B"
        [training]
        local_batch_size = 1
        seq_len = 1024
        {training_extra}
        [parallelism]
        {parallelism}
        """)



@pytest.mark.parametrize(("nodes", "zero", "dtype"), [(1, 0, "fp32"), (2, 3, "bf16")])
def test_tp_job_without_a_shard_group_runs_no_fsdp_and_no_mixed_precision(tmp_path: Path, nodes: int, zero: int,
                                                                         dtype: str) -> None:
    """tp 8 with dp_shard -1: on 8 GPUs the shard degree resolves to 1, so TorchTitan applies no fully_shard, and
    maybe_enable_amp refuses mixed precision under TP without FSDP: the job runs in training.dtype (float32). On 16
    GPUs dp_shard is 2: FSDP2 with bf16 compute and fp32 master weights."""
    from projection import api
    from projection.perf import project

    sc = api.load(_llama8b_job(tmp_path), nodes=nodes, hardware="h100-sxm")
    assert (sc.plan.sharding.zero_stage, sc.training.params_dtype) == (zero, dtype)
    assert (sc.plan.sharding.fsdp == "torch_fsdp2") == (zero == 3)
    said = [n for n in project(sc).notes if "TorchTitan applies no FSDP" in n]  # the projection says why
    assert len(said) == (zero == 0) and all("priced in fp32" in n for n in said)


def test_an_explicit_shard_degree_of_one_is_the_resolved_one(tmp_path: Path) -> None:
    """data_parallel_shard_degree = 1 written out is what -1 resolving to 1 is (ParallelDims.fsdp_enabled reads the
    degree, not how it was given): no FSDP and fp32 under TP. It used to keep the bf16 of FSDP's mixed precision,
    3.7x too fast in `projection plan --zero 0`."""
    from projection import api
    from projection.perf import project

    for sub in ("x", "ddp", "pure"):
        (tmp_path / sub).mkdir()
    implicit = api.load(_llama8b_job(tmp_path), nodes=1, hardware="h100-sxm")
    explicit = api.load(_llama8b_job(tmp_path / "x", parallelism="tensor_parallel_degree = 8\n"
                                     "        data_parallel_shard_degree = 1"), nodes=1, hardware="h100-sxm")
    assert (explicit.plan.sharding, explicit.training.params_dtype) == (implicit.plan.sharding, "fp32")
    assert project(explicit).step_time_s == pytest.approx(project(implicit).step_time_s, rel=1e-12)
    # replicas with no shard group beside TP are DDP, which TorchTitan refuses
    with pytest.raises(ConfigError, match="DDP has not supported > 1D parallelism"):
        api.load(_llama8b_job(tmp_path / "ddp", parallelism="tensor_parallel_degree = 4\n"
                              "        data_parallel_shard_degree = 1\n        data_parallel_replicate_degree = 2"),
                 nodes=1, hardware="h100-sxm")
    # without TP or PP they are plain DDP over 8 ranks, autocast in bf16
    pure = api.load(_llama8b_job(tmp_path / "pure", parallelism="data_parallel_shard_degree = 1\n"
                                 "        data_parallel_replicate_degree = 8"), nodes=1, hardware="h100-sxm")
    assert (pure.plan.sharding.zero_stage, pure.plan.dp_(), pure.training.params_dtype) == (0, 8, "bf16")


@pytest.mark.parametrize(("parallelism", "nodes", "gathers"), [
    ("tensor_parallel_degree = 8", 1, False),  # -1 resolves to 1: no shard group, no fp8 gather
    ("tensor_parallel_degree = 8\ndata_parallel_shard_degree = 1", 1, False),
    ("tensor_parallel_degree = 4\ncontext_parallel_degree = 2\ndata_parallel_shard_degree = 1", 1,
     False),  # FSDP over cp, but the shard degree is 1
    ("tensor_parallel_degree = 8", 2, True)])
def test_fp8_all_gather_needs_a_shard_degree_above_one(tmp_path: Path, parallelism: str, nodes: int,
                                                       gathers: bool) -> None:
    """torchao's Float8Converter gathers weights in fp8 only where the data-parallel shard degree exceeds 1
    (`enable_fsdp_float8_all_gather and parallel_dims.dp_shard_enabled`), however the degree was written."""
    from projection import api

    path = tmp_path / "fp8.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["quantize.linear.float8"]\n'
                    '[training]\nlocal_batch_size = 1\nseq_len = 1024\n'
                    f'[parallelism]\n{parallelism}\n'
                    '[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n', encoding="utf-8")
    sc = api.load(path, nodes=nodes, hardware="h100-sxm")
    assert sc.training.fp8 is not None and sc.training.fp8.param_gather is gathers


def test_target_nodes_reapplies_the_fsdp_rule(tmp_path: Path) -> None:
    """Extrapolating a TorchTitan job to another node count gives the job that node count would run: FSDP2 in bf16 once
    dp_shard exceeds 1, no FSDP and fp32 under TP when it falls back to 1, whichever size the file was loaded at."""
    from projection import api
    from projection.perf.scaling import extrapolate

    path = _llama8b_job(tmp_path, "global_batch_size = 8")
    from projection.perf import project

    one, two = (api.load(path, nodes=n, hardware="h100-sxm") for n in (1, 2))
    for base, nodes, want in ((one, 2, two), (two, 1, one)):
        moved = extrapolate(base, nodes)
        assert (moved.plan, moved.training) == (want.plan, want.training)
        said = any("TorchTitan applies no FSDP" in n for n in project(moved).notes)
        assert said == (moved.plan.sharding.zero_stage == 0)  # the note follows the plan, not the file


def test_replicas_without_a_shard_group_are_ddp(tmp_path: Path) -> None:
    """data_parallel_replicate_degree 8 with dp_shard 1: TorchTitan's apply_ddp, one gradient all-reduce over all 8
    replicas (not an HSDP replica all-reduce of a 1-rank shard); beside TP it is refused, as TorchTitan refuses it."""
    from projection import api
    from projection.errors import PlanError
    from projection.perf import project

    ddp = _llama8b_job(tmp_path,
                       parallelism="data_parallel_replicate_degree = 8\n        data_parallel_shard_degree = 1")
    sc = api.load(ddp, nodes=1, hardware="h100-sxm")
    assert (sc.plan.sharding.zero_stage, sc.plan.sharding.dp_replicate, sc.plan.dp_()) == (0, 1, 8)
    assert project(sc).comm_total_s["dp"] > 0
    with pytest.raises((ConfigError, PlanError), match="DDP has not supported") as err:
        api.load(ddp, nodes=2, hardware="h100-sxm", overrides={"parallelism.tensor_parallel_degree": 2})
    assert err.value.problems[0].key == "parallelism.data_parallel_replicate_degree"


def test_global_batch_and_schedule_rules_per_accumulation_step(tmp_path: Path) -> None:
    """TorchTitan asserts global batch % (local batch x dp) == 0; under PP each accumulation step is one schedule of
    local batch / microbatch microbatches, which is what torch's Schedule1F1B checks against pp."""
    from projection import api
    from projection.errors import PlanError

    path = _llama8b_job(tmp_path)
    pp = {"parallelism.tensor_parallel_degree": 1, "parallelism.pipeline_parallel_degree": 4}
    with pytest.raises(PlanError, match="not a multiple of local batch") as err:
        api.load(path, nodes=2, hardware="h100-sxm",
                 overrides={**pp, "training.local_batch_size": 4, "training.global_batch_size": 24})
    assert err.value.problems[0].key == "training.global_batch_size"
    with pytest.raises(PlanError) as err:  # without PP microbatch = local batch: one rule, said once
        api.load(path, nodes=2, hardware="h100-sxm",
                 overrides={"parallelism.tensor_parallel_degree": 1, "training.local_batch_size": 4,
                            "training.global_batch_size": 24})
    assert [p.key for p in err.value.problems] == ["training.global_batch_size"]
    assert "TorchTitan asserts it" in err.value.problems[0].message
    with pytest.raises(PlanError, match="needs at least pp = 4 microbatches") as err:  # 2 per schedule, 8 in all
        api.load(path, nodes=2, hardware="h100-sxm",
                 overrides={**pp, "training.local_batch_size": 2, "training.global_batch_size": 32})
    assert err.value.problems[0].key == "parallelism.pipeline_parallel_schedule"


def test_extrapolating_hsdp_to_one_shard_beside_tp_is_refused(tmp_path: Path) -> None:
    """4 replicas x dp_shard -1 at tp 2: HSDP on 16 GPUs (shard 2); on 8 GPUs the shard group is one rank, so the
    job is DDP beside TP, which TorchTitan refuses; --target-nodes must refuse it too."""
    from projection import api
    from projection.errors import PlanError
    from projection.perf.scaling import extrapolate

    path = _llama8b_job(tmp_path, "global_batch_size = 8",
                        "tensor_parallel_degree = 2\n        data_parallel_replicate_degree = 4")
    hsdp = api.load(path, nodes=2, hardware="h100-sxm")
    assert (hsdp.plan.sharding.zero_stage, hsdp.plan.sharding.dp_replicate) == (3, 4)
    with pytest.raises(PlanError, match="DDP has not supported"):
        api.load(path, nodes=1, hardware="h100-sxm")
    with pytest.raises(PlanError, match="DDP has not supported"):
        extrapolate(hsdp, 1)


def test_defaults_are_labelled_as_torchtitans_not_the_files(tmp_path: Path) -> None:
    """A key the TOML does not hold takes TorchTitan's JobConfig default, and says so (as Megatron's argparse
    defaults do); a problem about such a key is still located at the file, by the key to add."""
    from projection import api
    from projection.errors import PlanError

    path = tmp_path / "job.toml"
    path.write_text('[job]\nname = "x"\n[model]\nname = "llama3"\nflavor = "8B"\n')
    sc = api.load(path, nodes=1, hardware="h100-sxm")
    for key in ("training.seq_length", "training.local_batch_size", "plan.cp"):
        assert sc.origins[key].startswith("default (TorchTitan JobConfig)"), (key, sc.origins[key])
    assert sc.origins["model.hidden_size"].startswith(f"{path}:5")
    with pytest.raises(PlanError) as err:  # the default seq_len 2048 is not divisible by 2 * cp = 6
        api.load(path, nodes=1, hardware="h100-sxm", overrides={"parallelism.context_parallel_degree": 3,
                                                                 "parallelism.data_parallel_shard_degree": 2})
    (seq,) = [p for p in err.value.problems if "seq_length 2048" in p.message]
    assert (seq.file, seq.key) == (str(path), "training.seq_len")


def test_only_defaults_the_file_could_set_are_located_at_the_file() -> None:
    """Megatron's and TorchTitan's defaults are keys the file may hold; an HF config.json's training defaults are not
    (their origin says to --set them), so a problem about one keeps that origin."""
    from projection.formats.megatron_model import DEFAULT_FILE
    from projection.formats.torchtitan_schema import JOB_CONFIG_DEFAULT
    from projection.specs.scenario import FILE_KEY_DEFAULTS, Origin, RawScenario, origin_problem

    assert {DEFAULT_FILE, JOB_CONFIG_DEFAULT} == set(FILE_KEY_DEFAULTS)
    raw = RawScenario(source="config.json", framework="hf")
    raw.set("training.seq_length", 4096, Origin("default (config.json has no training settings; --set "
                                                "training.seq_length=N to change)"))
    p = origin_problem(raw, "training.seq_length", "bad")
    assert p.file.startswith("default (config.json has no training settings")
