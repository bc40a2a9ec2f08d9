"""Megatron-Bridge ConfigContainer YAML (projection/formats/bridge.py): detection, the dataclass-path rules that
differ from Megatron-LM's argparse, --set in Bridge's spelling, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.errors import ProjectionError
from projection.formats.detect import detect_format

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "benchmarks" / "bridge_runs" / "llama32_1b_bf16_8xh100.yaml"
CLUSTER = {"hardware": "h100-sxm", "nodes": 1, "gpus_per_node": 8}

# A hand-written Bridge YAML of the sections a recipe fills (no _target_ lines): what a user may keep beside a
# recipe. Llama-3-8B's shape, as Megatron-Bridge's Llama3ModelProvider8B gives it.
SMALL = """\
model:
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 14336
  num_attention_heads: 32
  num_query_groups: 8
  gated_linear_unit: true
  activation_func: torch.nn.functional.silu
  normalization: RMSNorm
  add_bias_linear: false
  position_embedding_type: rope
  share_embeddings_and_output_weights: false
  vocab_size: 128256
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 2
  sequence_parallel: true
train:
  micro_batch_size: 1
  global_batch_size: 64
dataset:
  sequence_length: 8192
ddp:
  use_distributed_optimizer: true
  grad_reduce_in_fp32: true
mixed_precision: bf16_mixed
"""


def write(tmp_path: Path, text: str, name: str = "bridge.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_detected_as_megatron_bridge(tmp_path: Path) -> None:
    assert detect_format(RUN) == "megatron-bridge"
    assert detect_format(write(tmp_path, SMALL)) == "megatron-bridge"
    sc = api.load(write(tmp_path, SMALL), **CLUSTER)
    assert sc.framework == "megatron-bridge"


def test_fields_map_to_the_scenario(tmp_path: Path) -> None:
    sc = api.load(write(tmp_path, SMALL), **CLUSTER)
    m, p, t = sc.model, sc.plan, sc.training
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.kv_heads, m.gated_mlp, m.activation, m.norm) == \
        (32, 4096, 14336, 8, True, "silu", "rmsnorm")
    assert (m.tie_embeddings, m.add_bias_linear, m.position_embedding) == (False, False, "rope")
    assert (p.tp, p.pp, p.sp, p.dp_(), p.sharding.zero_stage) == (2, 2, True, 2, 1)
    assert (t.seq_length, t.micro_batch_size, t.global_batch_size, t.params_dtype) == (8192, 1, 64, "bf16")
    assert t.optimizer.main_grads_dtype == "fp32"


def test_dataclass_defaults_differ_from_argparse(tmp_path: Path) -> None:
    """Without ffn_hidden_size a gated TransformerConfig gets 4h (Megatron-LM's CLI would give 8h/3 rounded to 64);
    the vocabulary is not padded unless should_pad_vocab (and an unpadded one tp does not divide is refused, as
    Megatron-Core's vocab-parallel embedding cannot split it); gradient-accumulation fusion is on (GPTModelProvider
    with Transformer Engine); main grads follow grad_reduce_in_fp32, whose DDP default is False (with no
    mixed_precision recipe, which sets it)."""
    text = SMALL.replace("  ffn_hidden_size: 14336\n", "").replace("  vocab_size: 128256\n", "  vocab_size: 128258\n")
    text = text.replace("  grad_reduce_in_fp32: true\n", "").replace("mixed_precision: bf16_mixed", "")
    text = text.replace("  vocab_size: 128258\n", "  vocab_size: 128258\n  bf16: true\n")
    sc = api.load(write(tmp_path, text), **CLUSTER)
    assert sc.model.ffn_hidden_size == 4 * 4096
    assert sc.model.padded_vocab(sc.plan.tp) == 128258
    assert sc.training.gradient_accumulation_fusion is True
    assert sc.training.optimizer.main_grads_dtype == "bf16"
    msg = problems(write(tmp_path, text.replace("128258", "128257"), "odd.yaml"))
    assert "128257 rows unpadded" in msg and "model.vocab_size" in msg
    text = text.replace("128258", "128257")
    padded = api.load(write(tmp_path, text.replace("  vocab_size: 128257\n",
                                                   "  vocab_size: 128257\n  should_pad_vocab: true\n"), "pad.yaml"),
                      **CLUSTER)
    # Megatron's padding rule: ceil(V / (128 * tp)) * 128 * tp, with tp 2
    assert padded.model.padded_vocab(padded.plan.tp) == -(-128257 // 256) * 256


def test_dataset_sequence_wins_over_the_model_table(tmp_path: Path) -> None:
    text = SMALL.replace("  vocab_size: 128256\n", "  vocab_size: 128256\n  seq_length: 131072\n")
    assert api.load(write(tmp_path, text), **CLUSTER).training.seq_length == 8192
    no_dataset = text.replace("dataset:\n  sequence_length: 8192\n", "")
    assert api.load(write(tmp_path, no_dataset, "b.yaml"), **CLUSTER).training.seq_length == 131072


@pytest.mark.parametrize(("recipe", "fmt", "fp8_recipe"), [
    ("bf16_with_fp8_current_scaling_mixed", "hybrid", "tensorwise"),
    ("bf16_with_fp8_delayed_scaling_mixed", "hybrid", "delayed"),
    ("bf16-with-fp8-subchannel-scaling-mixed", "hybrid", "blockwise"),
    ("bf16_with_mxfp8_mixed", "e4m3", "mxfp8"),
])
def test_mixed_precision_recipe_names(tmp_path: Path, recipe: str, fmt: str, fp8_recipe: str) -> None:
    sc = api.load(write(tmp_path, SMALL.replace("mixed_precision: bf16_mixed", f"mixed_precision: {recipe}")),
                  **{**CLUSTER, "hardware": "b200"})  # MXFP8 needs an MX-capable part
    assert sc.training.fp8 is not None
    assert (sc.training.params_dtype, sc.training.fp8.format, sc.training.fp8.recipe) == ("bf16", fmt, fp8_recipe)


def test_mixed_precision_table_applies_over_the_model(tmp_path: Path) -> None:
    text = SMALL.replace("mixed_precision: bf16_mixed", "mixed_precision:\n  bf16: true\n  fp8: hybrid\n"
                         "  fp8_recipe: tensorwise")
    text = text.replace("  vocab_size: 128256\n", "  vocab_size: 128256\n  fp8: null\n  bf16: false\n")
    sc = api.load(write(tmp_path, text), **CLUSTER)
    assert sc.training.params_dtype == "bf16" and sc.training.fp8 is not None


def test_set_in_bridge_spelling(tmp_path: Path) -> None:
    sc = api.load(write(tmp_path, SMALL), overrides={"model.tensor_model_parallel_size": "4",
                                                     "train.global_batch_size": "128", "plan.pp": 1}, **CLUSTER)
    assert (sc.plan.tp, sc.plan.pp, sc.training.global_batch_size) == (4, 1, 128)
    assert sc.origins["plan.tp"].startswith("--set")


def test_serialised_objects_are_read_back() -> None:
    sc = api.load(RUN, **CLUSTER)
    assert (sc.training.params_dtype, sc.training.attention_backend, sc.model.activation) == ("bf16", "auto", "silu")
    assert (sc.training.optimizer.main_grads_dtype, sc.model.padded_vocab(1)) == ("fp32", 128256)


def problems(path: Path, **kw: object) -> str:
    with pytest.raises(ProjectionError) as e:
        api.load(path, **CLUSTER, **kw)  # type: ignore[arg-type]
    return "\n".join(p.render() for p in e.value.problems)


def test_a_recipe_override_file_says_what_is_missing(tmp_path: Path) -> None:
    text = "train:\n  global_batch_size: 256\nmodel:\n  tensor_model_parallel_size: 2\n"
    msg = problems(write(tmp_path, text))
    assert "no model.num_layers" in msg and "run_config.yaml" in msg


def test_bad_sections_fields_and_values_are_all_listed(tmp_path: Path) -> None:
    text = SMALL.replace("train:", "trian_extra: {}\ntrain:").replace(
        "  normalization: RMSNorm", "  normalization:\n    _target_: my.own.Norm")
    msg = problems(write(tmp_path, text), overrides={"model.tensor_model_paralel_size": "2"})
    assert "model.tensor_model_paralel_size" in msg and "did you mean model.tensor_model_parallel_size" in msg
    assert "unknown Megatron-Bridge section 'trian_extra'" in msg
    text2 = SMALL.replace("  normalization: RMSNorm", "  normalization:\n    _target_: my.own.Norm")
    msg2 = problems(write(tmp_path, text2, "b.yaml"))
    assert "my.own.Norm" in msg2 and "model.normalization" in msg2


def test_layout_rules_still_apply(tmp_path: Path) -> None:
    msg = problems(write(tmp_path, SMALL.replace("tensor_model_parallel_size: 2", "tensor_model_parallel_size: 3")))
    assert "tensor_model_parallel_size" in msg


def test_start_up_changes_are_applied(tmp_path: Path) -> None:
    """Megatron-Bridge's runtime_config_update / validate(): comm_overlap turns the data-parallel overlaps on with
    ddp's distributed optimizer (read before validate() copies optimizer's to ddp: asked for by the optimizer
    table only, the optimizer is distributed but the overlaps stay off), the p2p overlap with a virtual pipeline, and
    TP overlap only with sequence parallelism."""
    vp = SMALL.replace("  pipeline_model_parallel_size: 2\n", "  pipeline_model_parallel_size: 2\n"
                       "  virtual_pipeline_model_parallel_size: 2\n") + "comm_overlap:\n  tp_comm_overlap: true\n"
    sc = api.load(write(tmp_path, vp, "ddp.yaml"), **CLUSTER)
    ov = sc.plan.overlap
    assert (sc.plan.sharding.zero_stage, ov.grad_reduce, ov.param_gather, ov.p2p_comm, ov.tp_comm) == \
        (1, True, True, True, True)
    text = vp.replace("ddp:\n  use_distributed_optimizer: true\n", "optimizer:\n  use_distributed_optimizer: true\n"
                      "ddp:\n")
    sc = api.load(write(tmp_path, text), **CLUSTER)
    ov = sc.plan.overlap
    assert (sc.plan.sharding.zero_stage, ov.grad_reduce, ov.param_gather, ov.p2p_comm, ov.tp_comm) == \
        (1, False, False, True, True)
    no_sp = api.load(write(tmp_path, text.replace("sequence_parallel: true", "sequence_parallel: false"), "b.yaml"),
                     **CLUSTER)
    assert no_sp.plan.overlap.tp_comm is False
    # without comm_overlap nothing is overlapped, which interleaving at pp 2 refuses: Megatron-Core's blocking batch
    # to the one neighbour would pair its sends and receives crosswise (specs/validate_schedule.py); at pp 4 it runs
    plain = text.replace("comm_overlap:\n  tp_comm_overlap: true\n", "")
    with pytest.raises(ProjectionError, match="model.overlap_p2p_comm"):
        api.load(write(tmp_path, plain, "c.yaml"), **CLUSTER)
    four = api.load(write(tmp_path, plain.replace("pipeline_model_parallel_size: 2", "pipeline_model_parallel_size: 4"),
                          "d.yaml"), **CLUSTER)
    assert (four.plan.overlap.grad_reduce, four.plan.overlap.p2p_comm, four.plan.megatron_p2p_overlap) == \
        (False, False, False)


def test_megatron_fsdp_from_either_table(tmp_path: Path) -> None:
    text = SMALL + "dist:\n  use_megatron_fsdp: true\n"
    text = text.replace("  grad_reduce_in_fp32: true\n", "  grad_reduce_in_fp32: true\n"
                        "  data_parallel_sharding_strategy: optim_grads_params\n")
    sc = api.load(write(tmp_path, text.replace("  sequence_parallel: true\n", "  sequence_parallel: true\n"
                                               "  gradient_accumulation_fusion: true\n")), **CLUSTER)
    assert (sc.plan.sharding.zero_stage, sc.plan.sharding.fsdp) == (3, "megatron_fsdp")
    assert sc.training.gradient_accumulation_fusion is False


def test_vocabulary_from_the_tokenizer_is_padded(tmp_path: Path) -> None:
    text = SMALL.replace("  vocab_size: 128256\n", "") + "tokenizer:\n  vocab_size: 128257\n"
    sc = api.load(write(tmp_path, text), **CLUSTER)
    assert (sc.model.vocab_size, sc.model.padded_vocab(sc.plan.tp)) == (128257, -(-128257 // 256) * 256)


def test_fp4_recipes_are_refused(tmp_path: Path) -> None:
    mp = "mixed_precision: bf16_mixed"
    msg = problems(write(tmp_path, SMALL.replace(mp, "mixed_precision: bf16_with_nvfp4_mixed")))
    assert "fp4 GEMMs are not modelled" in msg
    msg = problems(write(tmp_path, SMALL.replace(mp, "mixed_precision: bf16_mixd"), "b.yaml"))
    assert "unknown mixed-precision recipe 'bf16_mixd'" in msg


def test_cli_bad_bridge_file_exits_2_without_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = write(tmp_path, "train:\n  global_batch_size: 256\nmodel:\n  tensor_model_parallel_size: 2\n")
    res = subprocess.run([sys.executable, "-m", "projection", "memory", "--config", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr and res.stdout == ""
    assert "model.num_layers" in res.stderr and "fix:" in res.stderr


def test_keep_fp8_transpose_cache_is_megatron_fsdps_alone(tmp_path: Path) -> None:
    """DistributedDataParallelConfig.keep_fp8_transpose_cache (default False) acts under Megatron-FSDP only: the
    Llama-3.2-1B dump's `false` without FSDP leaves Transformer Engine's transpose cache alone."""
    fp8 = SMALL.replace("mixed_precision: bf16_mixed", "mixed_precision: bf16_with_fp8_current_scaling_mixed")
    plain = api.load(write(tmp_path, fp8.replace("ddp:\n", "ddp:\n  keep_fp8_transpose_cache: false\n")), **CLUSTER)
    assert plain.training.fp8 is not None and plain.training.fp8.weight_transpose_cache is True
    fsdp = fp8.replace("ddp:\n", "ddp:\n  keep_fp8_transpose_cache: false\n  use_megatron_fsdp: true\n"
                       "  data_parallel_sharding_strategy: optim_grads_params\n")
    sc = api.load(write(tmp_path, fsdp, "b.yaml"), **CLUSTER)
    assert sc.training.fp8 is not None and sc.training.fp8.weight_transpose_cache is False
