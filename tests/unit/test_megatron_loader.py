"""Megatron-LM loader: derived defaults (config-formats.md §1.3), flag spellings, bash parsing, the safe list
expressions, tokenizer lengths, and bad input. Expected numbers come from the reference doc, not from the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from projection.errors import ConfigError
from projection.formats.megatron import args_to_raw
from projection.formats.megatron_args import ArgValueError, eval_list_expression, flag_to_dest
from projection.formats.megatron_files import load_megatron
from projection.formats.tokenizers import tokenizer_vocab_size
from projection.specs.hardware import load_device
from projection.specs.model import ModelSpec, MoESpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Origin, build_scenario
from projection.specs.training import TrainingSpec

BASE: dict[str, Any] = {"num_layers": 4, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048,
                        "max_position_embeddings": 2048, "vocab_size": 32000}


def raw_of(**args: Any) -> Any:
    merged = {**BASE, **args}
    return args_to_raw(merged, {k: Origin("t.yaml", i + 1, k) for i, k in enumerate(merged)}, source="t.yaml")


def model(**args: Any) -> ModelSpec:
    return ModelSpec.model_validate(raw_of(**args).data["model"])


def plan(**args: Any) -> ParallelPlan:
    return ParallelPlan.model_validate(raw_of(**args).data["plan"])


def training(**args: Any) -> TrainingSpec:
    return TrainingSpec.model_validate(raw_of(**args).data["training"])


def write(tmp_path: Path, text: str, name: str = "train.sh") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- derived defaults


@pytest.mark.parametrize(("hidden", "swiglu", "ffn"), [(4096, True, 10880), (8192, True, 21824), (4096, False, 16384),
                                                        (512, False, 2048)])
def test_ffn_default_follows_megatron_rounding(hidden: int, swiglu: bool, ffn: int) -> None:
    # §1.3: with --swiglu 8h/3 rounded *down* to a multiple of 64 (4096 -> 10880, 8192 -> 21824), else 4h.
    m = model(hidden_size=hidden, swiglu=swiglu, num_attention_heads=8)
    assert m.ffn_hidden_size == ffn
    assert m.gated_mlp is swiglu
    assert m.activation == ("silu" if swiglu else "gelu")


def test_explicit_ffn_wins_and_derived_ffn_points_at_hidden_size() -> None:
    assert model(ffn_hidden_size=11008, swiglu=True).ffn_hidden_size == 11008
    raw = raw_of(swiglu=True)
    assert raw.origins["model.ffn_hidden_size"].key == "hidden_size"


def test_gqa_flag_semantics() -> None:
    assert model(num_query_groups=8).kv_heads == 32  # groups ignored without --group-query-attention (§1.3)
    assert model(group_query_attention=True).attention_kind == "mqa"  # CLI default num_query_groups = 1
    assert model(group_query_attention=True, num_query_groups=8).kv_heads == 8


def test_kv_channels_default_and_explicit() -> None:
    assert model().head_dim_ == 4096 // 32
    assert model(kv_channels=128, hidden_size=2048).head_dim_ == 128  # Qwen3-30B-A3B style, != h/heads


def test_megatron_gpt_defaults() -> None:
    m = model()
    assert (m.norm, m.tie_embeddings, m.add_bias_linear, m.add_qkv_bias) == ("layernorm", True, True, True)
    assert m.position_embedding == "learned" and m.max_position_embeddings == 2048
    assert model(add_bias_linear=False).add_qkv_bias is False
    assert model(add_bias_linear=False, add_qkv_bias=True).add_qkv_bias is True
    t = training()
    assert t.params_dtype == "fp32" and t.dropout == pytest.approx(0.1) and t.fp8 is None
    p = plan()
    assert (p.tp, p.pp, p.cp, p.ep, p.etp, p.vpp, p.sharding.zero_stage) == (1, 1, 1, 1, None, None, 0)
    assert p.overlap.p2p_comm is True and not p.megatron_p2p_overlap  # the flag as given, off without interleaving


def test_padded_vocab_gpt2_at_tp8() -> None:
    # §1.11: GPT-2 BPE 50257 -> 51200 at TP 8 with divisor 128.
    for extra in ({"tokenizer_type": "GPT2BPETokenizer"}, {"vocab_file": "/d/vocab.json", "merge_file": "/d/m.txt"}):
        args = {k: v for k, v in BASE.items() if k != "vocab_size"} | extra
        m = ModelSpec.model_validate(args_to_raw(args, {}, source="x").data["model"])
        assert m.vocab_size == 50257
        assert m.padded_vocab(8) == 51200
        assert m.padded_vocab(1) == 50304


def test_odd_divisor_pads_with_tp() -> None:
    m = model(vocab_size=151669, make_vocab_size_divisible_by=1187)
    assert m.padded_vocab(1) == 151936  # §1.3: Qwen3-30B uses 1187 so 1187*128 = 151936


def test_null_tokenizer_eod_choice() -> None:
    assert model(tokenizer_type="NullTokenizer", vocab_size=128256).vocab_size == 128256
    args = {**BASE, "tokenizer_type": "NullTokenizer", "vocab_size": 128256}
    primus = args_to_raw(args, {}, source="p.yaml", framework="primus-megatron")
    assert primus.data["model"]["vocab_size"] == 128257  # Primus pin d3528a2 adds the EOD id (§1.3 trap)
    forced = args_to_raw(args, {}, source="x", null_tokenizer_adds_eod=True)
    assert ModelSpec.model_validate(forced.data["model"]).padded_vocab(1) == 128384


def test_missing_vocab_names_tokenizer_and_fix() -> None:
    args = {k: v for k, v in BASE.items() if k != "vocab_size"} | {"tokenizer_model": "acme/secret-tok"}
    # the loader stands in for the vocabulary (so the layout is still checked) and keeps its problem until it is set
    raw = args_to_raw(args, {"tokenizer_model": Origin("f.yaml", 7, "tokenizer_model")}, source="f.yaml")
    p = raw.placeholders["model.vocab_size"]
    assert (p.key, p.file, p.line) == ("tokenizer_model", "f.yaml", 7)
    assert "--set vocab_size=N" in (p.fix or "")
    with pytest.raises(ConfigError) as err:
        build_scenario(raw, load_device("mi300x"))
    assert err.value.problems[0] is p
    raw.set("model.vocab_size", 32000, Origin("--set", None, "model.vocab_size"))
    assert not raw.placeholders


def test_moe_defaults_and_list_expression() -> None:
    m = model(num_experts=8, ffn_hidden_size=14336, swiglu=True, num_layers=61,
              moe_layer_freq="([0]*3+[1]*58)", moe_shared_expert_intermediate_size=2048)
    assert m.moe is not None
    assert (m.moe.top_k, m.moe.expert_ffn_hidden_size, m.moe.shared_expert_ffn_hidden_size) == (2, 14336, 2048)
    assert m.num_moe_layers == 58 and not m.is_moe_layer(2) and m.is_moe_layer(3)
    assert (m.moe.first_k_dense, m.moe.layer_freq, m.moe.layer_pattern) == (3, 1, None)  # DeepSeek form, as HF
    odd = model(num_experts=4, num_layers=4, moe_layer_freq="[1,1,0,1]").moe
    assert odd is not None and odd.layer_pattern == (1, 1, 0, 1)  # no (k, freq) rule: kept as a list
    every_other = model(num_experts=4, moe_layer_freq=2)
    assert [every_other.is_moe_layer(i) for i in range(4)] == [True, False, True, False]  # layer 0 is MoE
    assert model(num_experts=0).moe is None


def test_moe_token_dropping_flags() -> None:
    """--moe-expert-capacity-factor (None = dropless) and --moe-pad-expert-input-to-capacity; padding without a
    capacity factor is a located error, as Megatron refuses it."""
    dropless = model(num_experts=8).moe
    assert dropless is not None and (dropless.capacity_factor, dropless.pad_to_capacity) == (None, False)
    capped = model(num_experts=8, moe_expert_capacity_factor=1.25, moe_pad_expert_input_to_capacity=True).moe
    assert capped is not None and (capped.capacity_factor, capped.pad_to_capacity) == (1.25, True)
    assert capped.routed_copies(1000) == 8 * 313  # ceil(2 x 1000 / 8 x 1.25) = 313 rows per expert
    with pytest.raises(ValueError, match="pad_to_capacity needs capacity_factor"):
        MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=64, pad_to_capacity=True)


def test_moe_token_dispatcher() -> None:
    """Megatron's default dispatcher is allgather; alltoall_seq is the older all-to-all; DeepEP runs on flex, which
    Megatron-Core wants named beside it (TransformerConfig refuses --moe-enable-deepep with another dispatcher)."""
    assert training().kernels.moe_token_dispatcher == "allgather"
    assert training(moe_token_dispatcher_type="alltoall_seq").kernels.moe_token_dispatcher == "alltoall"
    assert training(moe_token_dispatcher_type="flex", moe_enable_deepep=True).kernels.moe_token_dispatcher == "flex"
    with pytest.raises(ConfigError) as err:
        raw_of(moe_token_dispatcher_type="alltoall", moe_enable_deepep=True)
    assert err.value.problems[0].key == "moe_enable_deepep"
    with pytest.raises(ConfigError) as err:
        raw_of(moe_token_dispatcher_type="carrier_pigeon")
    assert err.value.problems[0].key == "moe_token_dispatcher_type"


def test_list_expression_is_evaluated_safely() -> None:
    assert eval_list_expression("([0]*3+[1]*2)") == [0, 0, 0, 1, 1]
    assert eval_list_expression("[1,0]*2") == [1, 0, 1, 0]
    for bad in ("__import__('os').system('true')", "[0]*10**9", "[x]*3", "[0]*999999999", "open('f')", "[0.5]"):
        with pytest.raises(ArgValueError):
            eval_list_expression(bad)
    with pytest.raises(ConfigError) as err:
        raw_of(num_experts=8, moe_layer_freq="[__import__('os')]*4")
    assert err.value.problems[0].key == "moe_layer_freq"


def test_mla_uses_cli_defaults() -> None:
    m = model(multi_latent_attention=True, num_attention_heads=128, hidden_size=7168)
    assert m.mla is not None
    # §1.8: CLI defaults q_lora_rank None (-> 0), kv_lora_rank 32 (not the dataclass's 512).
    assert (m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_head_dim, m.mla.qk_rope_head_dim, m.mla.v_head_dim) == \
        (0, 32, 128, 64, 128)
    with pytest.raises(ConfigError):
        raw_of(multi_latent_attention=True, group_query_attention=True)


def test_virtual_pipeline_spellings() -> None:
    p = plan(num_layers=32, pipeline_model_parallel_size=4, num_layers_per_virtual_pipeline_stage=2)
    assert (p.vpp, p.schedule) == (4, "interleaved_1f1b")
    assert plan(num_layers=32, pipeline_model_parallel_size=4, num_virtual_stages_per_pipeline_rank=2).vpp == 2
    assert plan(num_layers=8, pipeline_model_parallel_size=4, num_layers_per_virtual_pipeline_stage=2).vpp is None
    layout = plan(num_layers=14, pipeline_model_parallel_size=4, pipeline_model_parallel_layout="Et*2|(tt|)*5t|tmL")
    assert (layout.vpp, layout.pipeline_layout) == (2, "Et*2|(tt|)*5t|tmL")
    with pytest.raises(ConfigError):
        raw_of(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1,
               num_virtual_stages_per_pipeline_rank=2)
    emb = plan(num_layers=30, pipeline_model_parallel_size=4, num_layers_per_virtual_pipeline_stage=4,
               account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    assert emb.vpp == 2  # (30 + 1 + 1) / 4 / 4


def test_microbatch_group_size_flag_as_megatron_spells_it(tmp_path: Path) -> None:
    """Megatron's flag is --microbatch-group-size-per-virtual-pipeline-stage (arguments.py, dest
    microbatch_group_size_per_vp_stage): written in a script or a MODEL_ARGS file it sets the plan's group size."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py --num-layers 32 --hidden-size 1024 --num-attention-heads 16 "
                      "--seq-length 1024 --max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 "
                      "--global-batch-size 16 --pipeline-model-parallel-size 4 "
                      "--num-layers-per-virtual-pipeline-stage 2 "
                      "--microbatch-group-size-per-virtual-pipeline-stage 8\n")
    raw = load_megatron(script)
    assert raw.get("plan.microbatch_group_size") == 8
    assert raw.origins["plan.microbatch_group_size"].key == "--microbatch-group-size-per-virtual-pipeline-stage"
    cfg = tmp_path / "model_config.yaml"
    cfg.write_text("MODEL_ARGS:\n  --num-layers: 32\n  --hidden-size: 1024\n  --num-attention-heads: 16\n"
                   "  --microbatch-group-size-per-virtual-pipeline-stage: 8\n  --vocab-size: 32000\n")
    assert load_megatron(cfg).get("plan.microbatch_group_size") == 8


def test_primus_manual_split_list() -> None:
    p = plan(num_layers=30, pipeline_model_parallel_size=4, decoder_pipeline_manual_split_list=[6, 8, 8, 8])
    assert p.stage_layers == (6, 8, 8, 8)


def test_sharding_flags() -> None:
    assert plan(use_distributed_optimizer=True).sharding.zero_stage == 1
    fsdp2 = plan(use_torch_fsdp2=True).sharding
    assert (fsdp2.zero_stage, fsdp2.fsdp) == (3, "torch_fsdp2")
    for strategy, stage in (("optim", 1), ("optim_grads", 2), ("optim_grads_params", 3), ("no_shard", 0)):
        assert plan(use_custom_fsdp=True, data_parallel_sharding_strategy=strategy).sharding.zero_stage == stage
    assert plan(use_megatron_fsdp=True).sharding.fsdp == "megatron_fsdp"


@pytest.mark.parametrize(("strategy", "gathered"), [("no_shard", False), ("optim", True), ("optim_grads", True)])
def test_megatron_fsdp_overlap_param_gather(strategy: str, gathered: bool) -> None:
    """validate_args accepts --overlap-param-gather with Megatron-FSDP under any strategy; no_shard gathers no
    parameters, so the overlap is off there (it was refused as 'needs the distributed optimizer', which was on)."""
    p = plan(use_megatron_fsdp=True, use_distributed_optimizer=True, data_parallel_sharding_strategy=strategy,
             overlap_grad_reduce=True, overlap_param_gather=True)
    assert p.overlap.param_gather is gathered


def test_recompute_flags() -> None:
    sel = plan(recompute_activations=True).recompute
    assert (sel.granularity, sel.modules) == ("selective", ("core_attn",))
    full = plan(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1).recompute
    assert (full.granularity, full.method, full.num_layers) == ("full", "uniform", 1)
    ids = plan(recompute_granularity="full", recompute_layer_ids="[0, 1, 2]").recompute
    assert ids.layer_ids == (0, 1, 2)
    mods = plan(recompute_granularity="selective", recompute_modules="[layernorm mla_up_proj mlp]").recompute
    assert mods.modules == ("layernorm", "mla_up_proj", "mlp")
    assert plan(moe_layer_recompute=True, num_experts=4).recompute.modules == ("moe",)


def test_precision_and_optimizer() -> None:
    t = training(bf16=True, fp8="hybrid", fp8_param_gather=True, grad_reduce_in_bf16=True,
                 use_distributed_optimizer=True)
    assert t.params_dtype == "bf16" and t.fp8 is not None
    assert (t.fp8.format, t.fp8.recipe, t.fp8.param_gather) == ("hybrid", "delayed", True)
    assert t.optimizer.main_grads_dtype == "bf16"
    pa = training(bf16=True, use_precision_aware_optimizer=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    assert pa.optimizer.precision_aware and pa.optimizer.exp_avg_dtype == "bf16"
    assert training(fp16=True).params_dtype == "fp16"
    with pytest.raises(ConfigError):
        raw_of(bf16=True, fp16=True)


def test_logging_flags_default_off_and_are_located() -> None:
    """Megatron's --log-params-norm and --log-num-zeros-in-grad are store_true flags (off by default)."""
    assert not training().log_params_norm and not training().log_num_zeros_in_grad
    raw = raw_of(log_params_norm=True, log_num_zeros_in_grad=True)
    t = TrainingSpec.model_validate(raw.data["training"])
    assert t.log_params_norm and t.log_num_zeros_in_grad
    assert raw.origins["training.log_params_norm"].key == "log_params_norm"


def test_nan_checks_default_on_and_store_false() -> None:
    """--check-for-nan-in-loss-and-grad defaults to True in Megatron; --no-check-for-nan-in-loss-and-grad clears it."""
    from projection.formats.megatron_args import flag_to_dest

    assert training().check_for_nan_in_loss_and_grad
    assert not training(check_for_nan_in_loss_and_grad=False).check_for_nan_in_loss_and_grad
    assert flag_to_dest("--no-check-for-nan-in-loss-and-grad") == ("check_for_nan_in_loss_and_grad", True)
    assert not TrainingSpec(seq_length=8).check_for_nan_in_loss_and_grad  # framework-neutral spec default: off


@pytest.mark.parametrize("value", [1, "1", "true", True])
def test_bools_arrive_as_ints_or_strings(value: Any) -> None:
    assert plan(sequence_parallel=value, tensor_model_parallel_size=2).sp_ is True


def test_bad_value_is_located() -> None:
    with pytest.raises(ConfigError) as err:
        args_to_raw({**BASE, "num_layers": "many"}, {"num_layers": Origin("f.sh", 12, "--num-layers")}, source="f.sh")
    p = err.value.problems[0]
    assert (p.key, p.file, p.line) == ("--num-layers", "f.sh", 12)


def test_flag_spellings() -> None:
    assert flag_to_dest("--disable-bias-linear") == ("add_bias_linear", True)
    assert flag_to_dest("--no-gradient-accumulation-fusion") == ("gradient_accumulation_fusion", True)
    assert flag_to_dest("--fp8-format") == ("fp8", False)
    assert flag_to_dest("--num-experts") == ("num_experts", False)
    assert flag_to_dest("--norm-epsilon") == ("layernorm_epsilon", False)
    assert flag_to_dest("--no-load-optim") == ("no_load_optim", False)  # not a store_false of a known dest
    assert flag_to_dest("--use-checkpoint-opt_param-scheduler")[0] == "use_checkpoint_opt_param_scheduler"


@pytest.mark.parametrize(("name", "size"), [
    ("meta-llama/Llama-3.1-70B", 128256), ("Llama3Tokenizer", 128256), ("meta-llama/Meta-Llama-3-8B", 128256),
    ("meta-llama/Llama-2-7b-hf", 32000), ("Llama2Tokenizer", 32000), ("MixtralTokenizer", 32000),
    ("mistralai/Mixtral-8x7B-v0.1", 32000), ("Qwen/Qwen2.5-72B", 151665), ("Qwen/Qwen3-30B-A3B", 151669),
    ("deepseek-ai/DeepSeek-V3", 129280), ("DeepSeekV3Tokenizer", 129280), ("GPT2BPETokenizer", 50257),
    ("/data/utils/nemotron_2_256k.model", 256000), ("huggyllama/llama-30b", None), ("acme/unknown", None),
])
def test_tokenizer_table(name: str, size: int | None) -> None:
    assert tokenizer_vocab_size(name) == size


# ---------------------------------------------------------------------------------------------------------- files

SCRIPT = """#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NNODES=${SLURM_NNODES:-"2"}
CHECKPOINT_PATH=$1
NUM_LAYERS=${NUM_LAYERS:-16}
DTYPE="fp8"
MODEL_ARGS=(
    --num-layers $NUM_LAYERS      # from a variable with a default
    --hidden-size 4096
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
#   --num-experts 8
    --swiglu
    --disable-bias-linear
    --normalization RMSNorm
    --position-embedding-type rope
    --untie-embeddings-and-output-weights
)
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    DTYPE_ARGS+=( "--fp8-format hybrid" "--fp8-param-gather" --use-distributed-optimizer )
else
    DTYPE_ARGS+=( --fp8-format e4m3 )
fi
if [ -n "${WANDB_API_KEY}" ]; then
    LOGGING=( --tensorboard-dir /tb )
fi
DATA="--tokenizer-type Llama3Tokenizer \\
      --seq-length 8192 --max-position-embeddings 8192"
torchrun --nproc_per_node $GPUS_PER_NODE pretrain_gpt.py \\
    ${MODEL_ARGS[@]} \\
    ${DTYPE_ARGS[@]} $DATA \\
    --tensor-model-parallel-size 2 --sequence-parallel \\
    --bf16 --save $CHECKPOINT_PATH
"""


def test_bash_script_arrays_variables_branches(tmp_path: Path) -> None:
    raw = load_megatron(write(tmp_path, SCRIPT))
    m = ModelSpec.model_validate(raw.data["model"])
    assert (m.num_layers, m.hidden_size, m.kv_heads, m.ffn_hidden_size) == (16, 4096, 8, 10880)
    assert (m.norm, m.position_embedding, m.add_bias_linear, m.tie_embeddings) == ("rmsnorm", "rope", False, False)
    assert m.moe is None  # commented out
    assert m.vocab_size == 128256
    t = TrainingSpec.model_validate(raw.data["training"])
    assert (t.seq_length, t.params_dtype) == (8192, "bf16")
    assert t.fp8 is not None and (t.fp8.format, t.fp8.param_gather) == ("hybrid", True)  # the taken branch only
    assert raw.data["plan"]["tp"] == 2 and raw.data["plan"]["sp"] is True
    assert raw.data["cluster"] == {"gpus_per_node": 8, "nodes": 2}
    assert raw.origins["model.num_layers"] == Origin(str(tmp_path / "train.sh"), 9, "--num-layers")
    assert raw.origins["training.seq_length"].line == 31
    assert raw.origins["cluster.nodes"].line == 4


def test_bash_env_and_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, SCRIPT)
    raw = load_megatron(path, env={"NUM_LAYERS": "48", "SLURM_NNODES": "4", "DTYPE": "bf16"})
    assert raw.data["model"]["num_layers"] == 48 and raw.data["cluster"]["nodes"] == 4
    assert raw.data["training"]["fp8"]["format"] == "hybrid"  # DTYPE is assigned in the script, env loses
    over = load_megatron(path, {"hidden_size": 2048, "--num-layers": 24, "plan.cp": 2, "--disable-bias-linear": False})
    assert (over.data["model"]["hidden_size"], over.data["model"]["num_layers"]) == (2048, 24)
    assert over.data["plan"]["cp"] == 2 and over.data["model"]["add_bias_linear"] is True
    assert over.origins["model.hidden_size"].file == "--set"
    assert load_megatron(path, {"disable-bias-linear": "true"}).data["model"]["add_bias_linear"] is False
    unknown = load_megatron(path, {"num_layer": 4}).deferred  # reported with the layout's problems (build_scenario)
    assert unknown[0].key == "num_layer" and "num_layers" in (unknown[0].fix or "")


def test_unresolved_variable_in_used_flag(tmp_path: Path) -> None:
    path = write(tmp_path, "ARGS=( --num-layers $LAYERS --hidden-size 64 --num-attention-heads 4 \n"
                           "  --seq-length 128 --vocab-size 1000 --save $1 --tokenizer-model $TOK/gpt2-vocab.json )\n")
    with pytest.raises(ConfigError) as err:
        load_megatron(path)
    assert len(err.value.problems) == 1  # --save and the tokenizer path are not used as values
    p = err.value.problems[0]
    assert (p.key, p.line) == ("--num-layers", 1) and "$LAYERS" in p.message
    assert load_megatron(path, env={"LAYERS": "2"}).data["model"]["num_layers"] == 2
    assert load_megatron(path, {"num_layers": 3}).data["model"]["num_layers"] == 3


def test_plain_flag_file_and_flag_equals(tmp_path: Path) -> None:
    path = write(tmp_path, "--num-layers=2 --hidden-size 64 --num-attention-heads 4\n--seq-length 128 "
                           "--max-position-embeddings 128 --vocab-size 1000 --moe-layer-freq ([0]*1+[1]*1) "
                           "--num-experts 2\n", "flags.txt")
    m = ModelSpec.model_validate(load_megatron(path).data["model"])
    assert m.num_layers == 2 and m.moe is not None and [m.is_moe_layer(i) for i in range(2)] == [False, True]
    quoted = write(tmp_path, path.read_text().replace("([0]*1+[1]*1)", "'([1]*1+[0]*1)'"), "quoted.sh")
    q = ModelSpec.model_validate(load_megatron(quoted).data["model"])
    assert q.moe is not None and [q.is_moe_layer(i) for i in range(2)] == [True, False]


def test_model_args_yaml_with_env(tmp_path: Path) -> None:
    text = ("ENV_VARS:\n  X: 1\nMODEL_ARGS:\n  --num-layers: ${LAYERS}\n  --hidden-size: 64\n"
            "  --num-attention-heads: 4\n  --seq-length: 128\n  --disable-bias-linear: true\n"
            "  --tokenizer-type: GPT2BPETokenizer\n  --save: ${CHECKPOINT_SAVE_PATH}\n  --sequence-parallel: 1\n")
    path = write(tmp_path, text, "model_config.yaml")
    with pytest.raises(ConfigError) as err:
        load_megatron(path)
    assert (err.value.problems[0].key, err.value.problems[0].line) == ("--num-layers", 4)
    raw = load_megatron(path, env={"LAYERS": "6"})
    assert raw.data["model"]["num_layers"] == 6 and raw.data["model"]["add_bias_linear"] is False
    assert raw.data["plan"]["sp"] is True and raw.origins["model.hidden_size"].line == 5


def test_flat_yaml_of_dests(tmp_path: Path) -> None:
    path = write(tmp_path, "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nswiglu: true\n"
                           "tokenizer_model: meta-llama/Llama-2-7b-hf\n", "preset.yaml")
    raw = load_megatron(path, {"seq_length": 128})
    assert raw.data["model"]["vocab_size"] == 32000 and raw.data["model"]["ffn_hidden_size"] == 128
    assert "micro_batch_size" not in raw.data["training"]  # left for build_scenario to report
    # with no training argument at all the file is a model preset: said as such, not as a missing seq_length
    with pytest.raises(ConfigError, match="describes a model only") as err:
        load_megatron(path)
    assert "model: preset" in (err.value.problems[0].fix or "")


def test_missing_file() -> None:
    with pytest.raises(ConfigError) as err:
        load_megatron(Path("/nonexistent/train.sh"))
    assert "not found" in err.value.problems[0].message


def test_missing_model_shape_is_reported_once_per_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_megatron(write(tmp_path, "--seq-length 128 --vocab-size 10\n", "f.txt"))
    assert {p.key for p in err.value.problems} == {"--num-layers", "--hidden-size", "--num-attention-heads"}


def test_builds_into_a_scenario(tmp_path: Path) -> None:
    raw = load_megatron(write(tmp_path, SCRIPT))
    sc = build_scenario(raw, load_device("mi300x"))
    assert sc.world_size == 16 and sc.plan.dp == 8


def test_set_of_an_argument_the_file_sets_is_accepted_even_if_unused(tmp_path: Path) -> None:
    """`--set lr=1` on a file that has `--lr`: a real Megatron argument of this job that nothing here reads is accepted
    (as the file's own line is); a name neither read nor in the file is still refused, with a suggestion."""
    path = write(tmp_path, "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
                           "  --seq-length: 128\n  --lr: 0.0001\n  --tokenizer-model: meta-llama/Llama-2-7b-hf\n",
                 "model_config.yaml")
    assert load_megatron(path, {"lr": 1}).data == load_megatron(path).data
    unknown = load_megatron(path, {"tensor_model_paralel_size": 2}).deferred  # reported by build_scenario
    assert "not a Megatron argument this projection reads" in unknown[0].message
    assert "tensor_model_parallel_size" in (unknown[0].fix or "")


@pytest.mark.parametrize(("args", "schedule", "vpp"), [
    ({}, "1f1b", None),                                                                   # Primus defaults: off
    ({"patch_zero_bubble": True}, "zb_h1", None),                                         # 'auto' pending: zb1p
    ({"patch_zero_bubble": True, "zero_bubble_max_pending_backward": "8"}, "zb_h2", None),  # 2 pp = 8: zb2p
    ({"patch_zero_bubble": True, "zero_bubble_max_pending_backward": "4"}, "zb_h1", None),
    ({"patch_zero_bubble": True, "enable_zero_bubble": False}, "1f1b", None),
    ({"patch_zero_bubble": True, "zero_bubble_v_schedule": True}, "v_half", 2),           # mem setup 'half'
    ({"patch_zero_bubble": True, "zero_bubble_v_schedule": True, "zero_bubble_v_schedule_mem_setup": "zb"}, "zbv", 2),
    ({"patch_primus_pipeline": True, "pp_algorithm": "v-min"}, "v_min", 2),
    ({"patch_primus_pipeline": True, "pp_algorithm": "zero-bubble"}, "zb_h1", None),
    ({"patch_primus_pipeline": True, "pp_algorithm": "1f1b-interleaved"}, "1f1b", None),  # no virtual pipeline
])
def test_primus_pipeline_patches_pick_the_schedule(args: dict[str, Any], schedule: str, vpp: int | None) -> None:
    """Primus's zero_bubble.yaml / primus_pipeline.yaml switches (they used to be read and dropped)."""
    raw = raw_of(pipeline_model_parallel_size=4, **args)
    assert raw.data["plan"].get("schedule", "1f1b") == schedule
    assert raw.data["plan"].get("vpp") == vpp


def test_primus_schedules_it_cannot_project_or_primus_refuses() -> None:
    """1F1B-V is not modelled; a V schedule with a virtual pipeline other than 2 is refused, as Primus asserts."""
    with pytest.raises(ConfigError, match="1F1B-V schedule is not modelled"):
        raw_of(pipeline_model_parallel_size=4, patch_zero_bubble=True, enable_1f1b_v=True)
    with pytest.raises(ConfigError, match="needs vpp 2, not 4"):
        raw_of(num_layers=16, pipeline_model_parallel_size=2, num_virtual_stages_per_pipeline_rank=4,
               patch_primus_pipeline=True, pp_algorithm="v-half")
    # Primus's zero-bubble runtime (zbpp_utils.validate_arguments): no overlapped reduction or gather with the
    # distributed optimizer, and gradient-accumulation fusion on
    with pytest.raises(ConfigError) as err:
        raw_of(pipeline_model_parallel_size=4, patch_zero_bubble=True, enable_zero_bubble=True,
               use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
               gradient_accumulation_fusion=False)
    assert {p.key for p in err.value.problems} >= {"overlap_grad_reduce", "overlap_param_gather",
                                                   "gradient_accumulation_fusion"}
    assert raw_of(pipeline_model_parallel_size=4, patch_zero_bubble=True, enable_zero_bubble=True,
                  use_distributed_optimizer=False, overlap_grad_reduce=True).data["plan"]["schedule"] == "zb_h1"


def test_seq_length_beyond_max_position_embeddings_is_refused(tmp_path: Path) -> None:
    """Megatron's validate_args asserts max_position_embeddings >= seq_length (RoPE models too); a learned table
    has that many rows in every framework."""
    from projection import api
    from projection.errors import PlanError

    path = write(tmp_path, "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
                           "  --seq-length: 128\n  --max-position-embeddings: 128\n  --micro-batch-size: 1\n"
                           "  --global-batch-size: 8\n  --bf16: true\n  --position-embedding-type: rope\n"
                           "  --tokenizer-model: meta-llama/Llama-2-7b-hf\n", "model_config.yaml")
    assert api.load(path).training.seq_length == 128
    with pytest.raises((ConfigError, PlanError)) as err:
        api.load(path, overrides={"seq_length": 256})
    (p,) = err.value.problems
    assert p.key == "seq_length" and "longer than max_position_embeddings 128" in p.message
    assert "--max-position-embeddings" in (p.fix or "")


def test_no_position_embedding_beside_a_learned_table_is_refused() -> None:
    """validate_args raises '--no-position-embedding is deprecated' unless the type is rope; the learned table
    comes from position_embedding_type alone (it used to be read as 'none', dropping the table's parameters)."""
    with pytest.raises(ConfigError, match="no-position-embedding is deprecated") as err:
        raw_of(position_embedding_type="learned_absolute", add_position_embedding=False)
    assert err.value.problems[0].key == "add_position_embedding"
    with pytest.raises(ConfigError, match="unless the type is rope"):
        raw_of(position_embedding_type="none", add_position_embedding=False)
    assert model(position_embedding_type="rope", add_position_embedding=False).position_embedding == "rope"
    assert model(position_embedding_type="learned_absolute").position_embedding == "learned"


def test_torchrun_flags_give_the_cluster(tmp_path: Path) -> None:
    """`torchrun --nproc_per_node 4 --nnodes 2 pretrain_gpt.py ...`: the launcher's counts are the job's cluster
    (they were ignored: 8 GPUs per node, 1 node); they win over GPUS_PER_NODE, --nodes / --gpus-per-node over them,
    and an elastic range or an unset variable is left alone."""
    from projection import api

    flags = ("pretrain_gpt.py --num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
             "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 --vocab-size 32000\n")
    script = write(tmp_path, "GPUS_PER_NODE=8\ntorchrun --nproc_per_node 4 --nnodes 2 " + flags)
    sc = api.load(script, hardware="h100-sxm")
    assert (sc.cluster.nodes, sc.cluster.gpus_per_node) == (2, 4)
    assert "--nproc_per_node" in sc.origins["cluster.gpus_per_node"]
    assert api.load(script, hardware="h100-sxm", nodes=1, gpus_per_node=8).world_size == 8
    elastic = write(tmp_path, "torchrun --nproc-per-node $GPUS --nnodes 1:4 " + flags, "elastic.sh")
    sc = api.load(elastic, hardware="h100-sxm")
    assert (sc.cluster.nodes, sc.cluster.gpus_per_node) == (1, 8)
    named = write(tmp_path, "torchrun --nproc-per-node gpu --nnodes 2 "  # torchrun's own GPU count: the device's
                  + flags.replace("batch-size 8", "batch-size 16"), "named.sh")
    sc = api.load(named, hardware="h100-sxm")
    assert (sc.cluster.nodes, sc.cluster.gpus_per_node) == (2, 8)


@pytest.mark.parametrize(("launch", "flag"), [("--nproc_per_node 2.5", "--nproc_per_node"),
                                              ("--nproc-per-node 0", "--nproc-per-node"),
                                              ("--nproc_per_node 4 --nnodes two", "--nnodes")])
def test_torchrun_counts_torchrun_refuses(tmp_path: Path, launch: str, flag: str) -> None:
    """A count torchrun would refuse is refused at its flag; `--nproc_per_node 2.5` was ignored (the device's 8)."""
    script = write(tmp_path, f"torchrun {launch} pretrain_gpt.py --num-layers 2 --hidden-size 1024 "
                             "--num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 --global-batch-size 8 "
                             "--vocab-size 32000\n")
    with pytest.raises(ConfigError) as err:
        load_megatron(script)
    (problem,) = err.value.problems
    assert (problem.key, problem.line) == (flag, 1) and "torchrun takes a whole number" in problem.message


def test_torch_fsdp2_refusals_of_megatron_lm(tmp_path: Path) -> None:
    """megatron/training/arguments.py validate_args under --use-torch-fsdp2: no pipeline or expert parallelism, no
    gradient-accumulation fusion (on by default), untied embeddings, not fp16; every violation listed at once."""
    from projection import api
    from projection.errors import ProjectionError

    base = ("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
            "--micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 --bf16 --use-torch-fsdp2")
    path = tmp_path / "fsdp2.txt"
    path.write_text(base + " --pipeline-model-parallel-size 2\n", encoding="utf-8")
    with pytest.raises(ProjectionError) as e:
        api.load(path, hardware="h100-sxm", nodes=1, fmt="megatron")
    keys = {p.key for p in e.value.problems}
    assert {"--pipeline-model-parallel-size", "--gradient-accumulation-fusion",
            "--untie-embeddings-and-output-weights"} <= keys, keys
    path.write_text(base + " --no-gradient-accumulation-fusion --untie-embeddings-and-output-weights\n",
                    encoding="utf-8")
    assert api.load(path, hardware="h100-sxm", nodes=1, fmt="megatron").plan.sharding.fsdp == "torch_fsdp2"
