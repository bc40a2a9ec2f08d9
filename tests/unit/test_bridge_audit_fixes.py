"""Megatron-Bridge loader: the cases an audit of it found (each failed, or was refused, before the fix). Bridge's
rules are cited where each is applied (formats/bridge*.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.errors import ProjectionError
from projection.workload.params import model_params
from tests.unit.test_bridge_loader import CLUSTER, RUN, SMALL, write


def problems(path: Path, **kw: object) -> str:
    with pytest.raises(ProjectionError) as e:
        api.load(path, **CLUSTER, **kw)  # type: ignore[arg-type]
    return "\n".join(p.render() for p in e.value.problems)


def test_a_field_set_over_a_recipe_keeps_the_recipe(tmp_path: Path) -> None:
    """--set mixed_precision.grad_reduce_in_fp32=false on `mixed_precision: bf16_mixed` (what Bridge's performance
    scripts do): bf16 parameters, bf16 main grads; a recipe can be switched by name."""
    sc = api.load(write(tmp_path, SMALL), overrides={"mixed_precision.grad_reduce_in_fp32": "false"}, **CLUSTER)
    assert (sc.training.params_dtype, sc.training.optimizer.main_grads_dtype) == ("bf16", "bf16")
    sc = api.load(write(tmp_path, SMALL), overrides={"mixed_precision": "bf16_with_fp8_current_scaling_mixed"},
                  **CLUSTER)
    assert sc.training.fp8 is not None and sc.training.fp8.recipe == "tensorwise"


def test_an_explicit_null_keeps_the_dataclass_none(tmp_path: Path) -> None:
    """`q_lora_rank: null` is MLA without query compression (DeepSeek-V2-Lite), not MLATransformerConfig's 512:
    the parameters equal the same model's as Megatron-LM flags, where no --q-lora-rank means none."""
    mla = ("  multi_latent_attention: true\n  q_lora_rank: null\n  kv_lora_rank: 512\n  qk_head_dim: 128\n"
           "  qk_pos_emb_head_dim: 64\n  v_head_dim: 128\n")
    text = SMALL.replace("  num_query_groups: 8\n", "")
    text = text.replace("  vocab_size: 128256\n", "  vocab_size: 128256\n" + mla)
    sc = api.load(write(tmp_path, text), **CLUSTER)
    assert sc.model.mla is not None and sc.model.mla.q_lora_rank == 0
    flags = tmp_path / "mla.args"
    flags.write_text("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --swiglu "
                     "--normalization RMSNorm --disable-bias-linear --position-embedding-type rope "
                     "--untie-embeddings-and-output-weights --vocab-size 128256 --make-vocab-size-divisible-by 1 "
                     "--multi-latent-attention --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 "
                     "--v-head-dim 128 --seq-length 8192 --micro-batch-size 1 --global-batch-size 64 --bf16 "
                     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel\n")
    mlm = api.load(flags, fmt="megatron", **CLUSTER)
    assert sum(model_params(sc.model).values()) == sum(model_params(mlm.model).values())
    absent = api.load(write(tmp_path, text.replace("  q_lora_rank: null\n", ""), "absent.yaml"), **CLUSTER)
    assert absent.model.mla is not None and absent.model.mla.q_lora_rank == 512  # the dataclass default


def test_fp8_parameter_gather_follows_the_recipe_over_the_dumps_model_field(tmp_path: Path) -> None:
    """MixedPrecisionConfig.setup writes model.fp8_param too: a dump's `fp8_param: false` does not stand."""
    text = SMALL.replace("mixed_precision: bf16_mixed", "mixed_precision: bf16_with_fp8_current_scaling_mixed")
    text = text.replace("  vocab_size: 128256\n", "  vocab_size: 128256\n  fp8_param: false\n")
    sc = api.load(write(tmp_path, text), **CLUSTER)
    assert sc.training.fp8 is not None and sc.training.fp8.param_gather is True


def test_either_dataset_spelling_is_set_and_two_disagreeing_are_refused(tmp_path: Path) -> None:
    sc = api.load(write(tmp_path, SMALL), overrides={"dataset.seq_length": "4096"}, **CLUSTER)
    assert sc.training.seq_length == 4096  # the file says dataset.sequence_length
    both = SMALL.replace("  sequence_length: 8192\n", "  sequence_length: 8192\n  seq_length: 4096\n")
    assert "disagree" in problems(write(tmp_path, both, "both.yaml"))
    msg = problems(write(tmp_path, SMALL.replace("dataset:\n  sequence_length: 8192\n", ""), "none.yaml"))
    assert "key 'dataset.seq_length'" in msg and "no sequence length" in msg


@pytest.mark.parametrize(("old", "new", "meant"), [
    ("  ffn_hidden_size: 14336", "  ffn_hiden_size: 14336", "model.ffn_hidden_size"),
    ("  global_batch_size: 64", "  global_batchsize: 64", "train.global_batch_size"),
    ("  num_layers: 32", "  num_layers: 32\n  recompute_granularit: full", "model.recompute_granularity"),
])
def test_near_misses_of_read_fields_are_refused(tmp_path: Path, old: str, new: str, meant: str) -> None:
    msg = problems(write(tmp_path, SMALL.replace(old, new)))
    assert f"did you mean {meant}?" in msg


def test_layer_offloading_needs_cpu_offloading_and_fine_grained_offloading_is_read(tmp_path: Path) -> None:
    one = SMALL.replace("  pipeline_model_parallel_size: 2\n", "  pipeline_model_parallel_size: 1\n")
    flagless = one.replace("  num_layers: 32\n", "  num_layers: 32\n  cpu_offloading_num_layers: 4\n")
    off = api.load(write(tmp_path, flagless), **CLUSTER)
    assert off.plan.offload.activation_layers == 0
    on = one.replace("  num_layers: 32\n", "  num_layers: 32\n  cpu_offloading: true\n  cpu_offloading_num_layers: 4\n")
    assert api.load(write(tmp_path, on, "on.yaml"), **CLUSTER).plan.offload.activation_layers == 4
    fine = one.replace("  num_layers: 32\n", "  num_layers: 32\n  fine_grained_activation_offloading: true\n"
                       "  offload_modules: [core_attn]\n")
    assert api.load(write(tmp_path, fine, "fine.yaml"), **CLUSTER).plan.offload.activation_modules == ("core_attn",)


def test_grad_nan_checks_are_ddps_and_off_by_default(tmp_path: Path) -> None:
    assert api.load(write(tmp_path, SMALL), **CLUSTER).training.check_for_nan_in_loss_and_grad is False
    on = SMALL.replace("ddp:\n", "ddp:\n  check_for_nan_in_grad: true\n")
    assert api.load(write(tmp_path, on, "on.yaml"), **CLUSTER).training.check_for_nan_in_loss_and_grad is True


def test_a_version_0_3_run_config_loads(tmp_path: Path) -> None:
    """Every run_config.yaml from Bridge 0.3.0 on carries optimizer_config_override_provider."""
    text = RUN.read_text(encoding="utf-8") + ("optimizer_config_override_provider:\n  _target_: megatron.bridge."
                                              "training.config.OptimizerConfigOverrideProvider\n")
    assert api.load(write(tmp_path, text), **CLUSTER).model.num_layers == 16


def test_layouts_as_bridge_writes_them(tmp_path: Path) -> None:
    """A layout with the virtual pipeline size it implies (TransformerConfig accepts both when they agree); a layout
    as a list of stages (Bridge 0.6's dump)."""
    layout = '  pipeline_model_parallel_layout: "Et*8|t*8|t*8|t*8L"\n  virtual_pipeline_model_parallel_size: 2\n'
    # interleaving at pp 2 needs overlapped p2p (specs/validate_schedule.py)
    overlap = "  overlap_p2p_comm: true\n"
    text = SMALL.replace("  num_layers: 32\n", "  num_layers: 32\n" + layout + overlap)
    sc = api.load(write(tmp_path, text), **CLUSTER)
    assert (sc.plan.pp, sc.plan.vpp_) == (2, 2)
    assert "disagrees with the layout's 4 stages" in problems(
        write(tmp_path, text.replace("size: 2\n  sequence", "size: 3\n  sequence").replace(
            "virtual_pipeline_model_parallel_size: 2", "virtual_pipeline_model_parallel_size: 4"), "bad.yaml"))
    stages = [["embedding"] + ["decoder"] * 8, ["decoder"] * 8, ["decoder"] * 8, ["decoder"] * 8 + ["loss"]]
    listed = "  pipeline_model_parallel_layout:\n" + "".join(
        "  - [" + ", ".join(st) + "]\n" for st in stages)
    sc = api.load(write(tmp_path, SMALL.replace("  num_layers: 32\n", "  num_layers: 32\n" + listed + overlap),
                        "list.yaml"), **CLUSTER)
    assert (sc.plan.pp, sc.plan.vpp_, sc.plan.pipeline_layout) == (2, 2, "E" + "|".join(["t" * 8] * 4) + "L")


def test_learned_positions_take_the_models_sequence(tmp_path: Path) -> None:
    """GPTModelProvider.provide builds the position table with max_sequence_length = model.seq_length (1024 by
    default); Bridge has no max_position_embeddings."""
    text = SMALL.replace("position_embedding_type: rope", "position_embedding_type: learned_absolute")
    msg = problems(write(tmp_path, text))
    assert "key 'model.seq_length'" in msg and "set model.seq_length: 8192" in msg
    longer = text.replace("  num_layers: 32\n", "  num_layers: 32\n  seq_length: 8192\n")
    sc = api.load(write(tmp_path, longer, "b.yaml"), **CLUSTER)
    assert sc.model.max_position_embeddings == 8192


def test_selective_recompute_ignores_a_method(tmp_path: Path) -> None:
    text = SMALL.replace("  num_layers: 32\n", "  num_layers: 32\n  recompute_granularity: selective\n"
                         "  recompute_method: uniform\n")
    assert api.load(write(tmp_path, text), **CLUSTER).plan.recompute.granularity == "selective"
    msg = problems(write(tmp_path, text.replace("uniform\n", "uniform\n  recompute_num_layers: 1\n"), "n.yaml"))
    assert "key 'model.recompute_num_layers'" in msg


def test_nemotron_recipes_and_a_recipe_target(tmp_path: Path) -> None:
    for recipe, expect in (("nemotron_h_bf16_with_fp8_current_scaling_mixed", "tensorwise"),
                           ("nanov2_bf16_with_fp8_current_scaling_mixed", "blockwise")):
        sc = api.load(write(tmp_path, SMALL.replace("bf16_mixed", recipe)), **CLUSTER)
        assert sc.training.fp8 is not None and sc.training.fp8.recipe == expect
    target = SMALL.replace("mixed_precision: bf16_mixed", "mixed_precision:\n  _target_: megatron.bridge.training."
                           "mixed_precision.bf16_mixed")
    assert api.load(write(tmp_path, target, "t.yaml"), **CLUSTER).training.params_dtype == "bf16"


def test_another_tools_yaml_gets_one_message(tmp_path: Path) -> None:
    text = ("model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\ntokenizer:\n  path: t.model\n"
            "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\nseed: null\nshuffle: true\nbatch_size: 4\n"
            "optimizer:\n  _component_: torch.optim.AdamW\nloss:\n  _component_: torch.nn.CrossEntropyLoss\n"
            "epochs: 1\nmax_steps_per_epoch: null\n")
    msg = problems(write(tmp_path, text))
    assert "most of its sections are not Bridge's" in msg and msg.count("\n") < 4


def test_required_fields_and_section_types_name_bridges_keys(tmp_path: Path) -> None:
    msg = problems(write(tmp_path, SMALL.replace("  num_layers: 32", "  num_layers: null")))
    assert "key 'model.num_layers'" in msg and "--set model.num_layers" in msg
    msg = problems(write(tmp_path, SMALL.replace("ddp:\n  use_distributed_optimizer: true\n  grad_reduce_in_fp32: "
                                                 "true\n", "ddp: 5\n"), "s.yaml"))
    assert "section ddp must be a table" in msg
    sc = api.load(write(tmp_path, SMALL.replace("use_distributed_optimizer: true", "use_distributed_optimizer: "
                                                "'false'"), "f.yaml"), **CLUSTER)
    assert sc.plan.sharding.zero_stage == 0


def test_what_bridge_refuses_at_start_up(tmp_path: Path) -> None:
    both = SMALL + "dist:\n  use_torch_fsdp2: true\n  use_megatron_fsdp: true\n"
    assert "both on" in problems(write(tmp_path, both))
    tp1 = SMALL.replace("tensor_model_parallel_size: 2", "tensor_model_parallel_size: 1")
    assert "key 'model.sequence_parallel'" in problems(write(tmp_path, tp1, "tp1.yaml"))
    small = SMALL + "tokenizer:\n  vocab_size: 200000\n"
    assert "below the tokenizer's 200000" in problems(write(tmp_path, small, "v.yaml"))


def test_the_name_comes_from_the_file_or_a_checkpoints_provider(tmp_path: Path) -> None:
    sc = api.load(RUN, **CLUSTER)
    assert sc.model.name == RUN.stem and "the file name" in sc.origins["model.name"]
    run_config = write(tmp_path, RUN.read_text(encoding="utf-8"), "run_config.yaml")
    assert api.load(run_config, **CLUSTER).model.name == "Llama31Model"


def test_plan_reloads_a_bridge_file_with_bridges_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`projection plan` loads each candidate with Bridge's own fields, so Bridge's start-up rules see it: with
    comm_overlap's TP overlap a tp 1 layout is one Bridge runs (the overlap off), and its row is what
    `projection performance --set model.tensor_model_parallel_size=1 --set model.sequence_parallel=false` gives."""
    import json

    from projection.cli import main

    path = write(tmp_path, SMALL + "comm_overlap:\n  tp_comm_overlap: true\n")
    cluster = ["--hardware", "h100-sxm", "--nodes", "1", "--gpus-per-node", "8"]
    assert main(["plan", "--config", str(path), *cluster, "--tp", "1,2", "--pp", "2", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    (tp1,) = [r for r in rows["candidates"] if r["tp"] == 1]
    assert not rows.get("refused") and tp1.get("step_time_s")
    assert main(["performance", "--config", str(path), *cluster, "--set", "model.tensor_model_parallel_size=1",
                 "--set", "model.sequence_parallel=false", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == pytest.approx(tp1["step_time_s"], rel=1e-9)


def test_fsdp2_runs_without_gradient_accumulation_fusion(tmp_path: Path) -> None:
    text = SMALL.replace("ddp:\n  use_distributed_optimizer: true\n", "ddp:\n") + "dist:\n  use_torch_fsdp2: true\n"
    sc = api.load(write(tmp_path, text), **CLUSTER)
    assert sc.plan.sharding.fsdp == "torch_fsdp2" and sc.training.gradient_accumulation_fusion is False


def test_a_one_letter_slip_is_refused_but_not_digits(tmp_path: Path) -> None:
    msg = problems(write(tmp_path, SMALL.replace("use_distributed_optimizer", "use_distributed_optimiser")))
    assert "did you mean ddp.use_distributed_optimizer?" in msg
    # fp4_param: a real field, fp8_param's twin
    fp4 = SMALL.replace("  num_layers: 32\n", "  num_layers: 32\n  fp4_param: false\n")
    assert api.load(write(tmp_path, fp4, "fp4.yaml"), **CLUSTER).model.num_layers == 32


def test_megatron_fsdp_no_shard_with_overlap_param_gather(tmp_path: Path) -> None:
    """Megatron-FSDP on a run_config whose ddp has overlap_param_gather and the no_shard strategy: Megatron accepts it
    (the all-gather overlap needs the distributed optimizer *or* Megatron-FSDP); it was refused as needing the
    distributed optimizer, which the file had on."""
    text = SMALL.replace("ddp:\n", "ddp:\n  use_megatron_fsdp: true\n  data_parallel_sharding_strategy: no_shard\n"
                         "  overlap_grad_reduce: true\n  overlap_param_gather: true\n")
    assert text != SMALL
    sc = api.load(write(tmp_path, text), **CLUSTER)
    assert (sc.plan.sharding.zero_stage, sc.plan.overlap.param_gather) == (0, False)
