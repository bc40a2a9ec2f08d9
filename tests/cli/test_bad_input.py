"""One test per bad-input class: the CLI exits 2, prints no traceback, and names the file, the key and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"

GOOD = """\
model:
  num_layers: 32
  hidden_size: 4096
  num_attention_heads: 32
  num_kv_heads: 8
  ffn_hidden_size: 14336
  vocab_size: 128256
training:
  seq_length: 4096
  micro_batch_size: 1
  global_batch_size: 64
plan:
  tp: 2
  pp: 2
cluster:
  hardware: mi300x
  nodes: 1
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "projection", *args], capture_output=True, text=True, timeout=120)


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def assert_user_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode == 2, res.stderr + res.stdout
    assert "Traceback" not in res.stderr
    assert res.stdout == ""  # nothing half-written
    for n in needles:
        assert n in res.stderr, f"{n!r} not in:\n{res.stderr}"
    assert "fix:" in res.stderr


def test_good_config_runs(tmp_path: Path) -> None:
    res = run("inspect", "--config", str(write(tmp_path, GOOD)), "--format", "json")
    assert res.returncode == 0, res.stderr


def test_unknown_key(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("  pp: 2", "  pp: 2\n  tpp: 4"))
    assert_user_error(run("inspect", "--config", str(p)), str(p), "plan.tpp", "unknown key", ":15")


def test_wrong_type(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("tp: 2", "tp: two"))
    assert_user_error(run("inspect", "--config", str(p)), str(p), "plan.tp", "'two'")


def test_missing_file(tmp_path: Path) -> None:
    assert_user_error(run("inspect", "--config", str(tmp_path / "nope.yaml")), "nope.yaml", "file not found")


def test_yaml_syntax_error(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("  tp: 2", "  tp: [2"))
    assert_user_error(run("inspect", "--config", str(p)), str(p), "YAML syntax error")


def test_toml_syntax_error(tmp_path: Path) -> None:
    p = write(tmp_path, "[model]\nname = \"llama3\"\nflavor = 8B\n", "job.toml")
    assert_user_error(run("inspect", "--config", str(p)), str(p), "TOML syntax error")


def test_unknown_preset(tmp_path: Path) -> None:
    text = "model: llama9_1T\n" + GOOD[GOOD.index("training:"):]
    p = write(tmp_path, text)
    assert_user_error(run("inspect", "--config", str(p)), str(p), "llama9_1T", "llama3.1_8B")


def test_unknown_hardware(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD)
    res = run("inspect", "--config", str(p), "--hardware", "tpu-v9")
    assert_user_error(res, "tpu-v9", "mi300x")


def test_bad_set_item(tmp_path: Path) -> None:
    assert_user_error(run("inspect", "--config", str(write(tmp_path, GOOD)), "--set", "plan.tp"), "KEY=VALUE")


def test_every_layout_violation_at_once(tmp_path: Path) -> None:
    """tp not dividing heads, KV heads neither a multiple nor a divisor of tp, layers not divisible by pp*vpp, gbs
    not divisible by mbs*dp, ep with
    no experts: all reported in one run, each with the line that set it."""
    text = GOOD.replace("num_attention_heads: 32", "num_attention_heads: 30\n  head_dim: 128").replace(
        "num_kv_heads: 8", "num_kv_heads: 6")
    text = text.replace("global_batch_size: 64", "global_batch_size: 63")
    text = text.replace("micro_batch_size: 1", "micro_batch_size: 2")
    text = text.replace("  tp: 2\n  pp: 2", "  tp: 4\n  pp: 2\n  vpp: 5\n  schedule: interleaved_1f1b\n  ep: 2")
    res = run("inspect", "--config", str(write(tmp_path, text)))
    assert_user_error(res, "num_attention_heads = 30", "num_query_groups = 6 is neither a multiple nor a divisor of "
                      "tp = 4", "pp * vpp", "global batch 63",
                      "no experts", "problems:")
    assert "exp.yaml:14" in res.stderr  # the line of `tp: 4`


def test_world_not_divisible(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("  tp: 2\n  pp: 2", "  tp: 2\n  pp: 3").replace("num_layers: 32",
                                                                                    "num_layers: 33"))
    assert_user_error(run("inspect", "--config", str(p)), "world size 8 is not divisible by tp * cp * pp")


def test_experts_not_divisible_by_ep(tmp_path: Path) -> None:
    text = GOOD.replace("  ffn_hidden_size: 14336", "  ffn_hidden_size: 14336\n  moe: {num_experts: 6, top_k: 2, "
                        "expert_ffn_hidden_size: 1024}").replace("  pp: 2", "  pp: 1\n  ep: 4")
    assert_user_error(run("inspect", "--config", str(write(tmp_path, text))), "ep = 4 does not divide num_experts = 6")


def test_layout_stage_count(tmp_path: Path) -> None:
    text = GOOD.replace("  pp: 2", "  pp: 2\n  vpp: 2\n  schedule: interleaved_1f1b\n  pipeline_layout: "
                        "'Et*8|t*8|t*8|t*8L|t*0'")
    assert_user_error(run("inspect", "--config", str(write(tmp_path, text))), "layout has 5 stages",
                      "pp * vpp = 2 * 2 = 4")


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared fixtures absent (user clone)")
def test_unresolved_variable(tmp_path: Path) -> None:
    text = (FIXTURES / "primus/examples/megatron/configs/MI300X/llama2_7B-BF16-pretrain.yaml").read_text()
    text = text.replace("micro_batch_size: 4", "micro_batch_size: ${MY_MBS}")
    assert "${MY_MBS}" in text
    p = write(tmp_path, text)
    res = run("inspect", "--config", str(p), "--primus-root", str(FIXTURES / "primus"))
    assert_user_error(res, str(p), "MY_MBS", "micro_batch_size")


def test_sequence_parallel_needs_seq_divisible_by_tp(tmp_path: Path) -> None:
    text = GOOD.replace("seq_length: 4096", "seq_length: 4095").replace("  tp: 2\n", "  tp: 2\n  sp: true\n")
    assert_user_error(run("memory", "--config", str(write(tmp_path, text))), "training.seq_length",
                      "not divisible by cp * tp = 1 * 2", "exp.yaml:9")


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    """YAML would silently keep the last `plan:`; both places are named."""
    p = write(tmp_path, GOOD + "plan:\n  tp: 4\n")
    assert_user_error(run("inspect", "--config", str(p)), "key 'plan'", "duplicate key (first set at line 12)",
                      "exp.yaml:18")


def test_boolean_where_a_number_goes(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("  tp: 2", "  tp: true"))
    assert_user_error(run("inspect", "--config", str(p)), "exp.yaml:13", "plan.tp", "expected a number")


def test_misspelt_megatron_flag(tmp_path: Path) -> None:
    """Megatron's argparse would reject the flag; projection must not read the job as pp 1."""
    p = write(tmp_path, "torchrun pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 \\\n"
              "  --seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 \\\n"
              "  --vocab-size 1000 --pipeline-model-paralel-size 4\n", name="train.sh")
    assert_user_error(run("inspect", "--config", str(p)), "train.sh:3", "--pipeline-model-paralel-size",
                      "did you mean --pipeline-model-parallel-size?")


NO_VOCAB_SCRIPT = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                   "--num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 "
                   "--global-batch-size 7 --bf16 --tensor-model-parallel-size 3\n")


def test_an_unknown_vocabulary_does_not_hide_the_layout(tmp_path: Path) -> None:
    """Neither --vocab-size nor a tokenizer: the vocabulary's problem is listed with every layout violation."""
    p = write(tmp_path, NO_VOCAB_SCRIPT, name="train.sh")
    res = run("memory", "--config", str(p))
    assert_user_error(res, "key '--vocab-size'", "cannot tell the vocabulary size", "world size 8 is not divisible",
                      "tp = 3 does not divide num_attention_heads", "tp = 3 does not divide ffn_hidden_size")
    assert res.stderr.index("cannot tell the vocabulary") < res.stderr.index("world size")
    # a layout problem found with a stand-in vocabulary stays once the real one is given, and only it
    res = run("memory", "--config", str(p), "--set", "model.vocab_size=50000", "--set", "plan.tp=2")
    assert_user_error(res, "global batch 7 is not divisible by micro batch * dp = 1 * 4 = 4")
    assert "cannot tell the vocabulary size" not in res.stderr
    res = run("memory", "--config", str(p), "--set", "vocab_size=50000", "--set", "plan.tp=2",
              "--set", "global_batch_size=8")
    assert res.returncode == 0, res.stderr


def test_a_preset_without_a_vocabulary_is_still_refused(tmp_path: Path) -> None:
    """The stand-in vocabulary never reaches a report: a model preset without one is refused, layout too."""
    preset = write(tmp_path, "num_layers: 4\nhidden_size: 256\nnum_attention_heads: 8\nseq_length: 128\n"
                   "max_position_embeddings: 128\n", name="tiny.yaml")
    text = ("model: tiny.yaml\ntraining: {seq_length: 128, micro_batch_size: 1, global_batch_size: 8}\n"
            "plan: {tp: 3}\ncluster: {hardware: h100-sxm, nodes: 1}\n")
    res = run("inspect", "--config", str(write(tmp_path, text)))
    assert_user_error(res, str(preset), "cannot tell the vocabulary size", "tp = 3 does not divide")
    ok = text.replace("plan: {tp: 3}", "plan: {tp: 2}")
    assert run("inspect", "--config", str(write(tmp_path, ok)), "--set", "model.vocab_size=1000").returncode == 0


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared fixtures absent (user clone)")
def test_misspelt_primus_override(tmp_path: Path) -> None:
    cfg = FIXTURES / "primus/examples/megatron/configs/MI300X/llama3_8B-BF16-pretrain.yaml"
    assert_user_error(run("memory", "--config", str(cfg), "--set", "tensor_model_paralel_size=2"),
                      "tensor_model_paralel_size", "did you mean", "tensor_model_parallel_size")


def test_set_hint_names_the_canonical_key(tmp_path: Path) -> None:
    res = run("memory", "--config", str(write(tmp_path, GOOD)), "--set", "tensor_model_parallel_size=8")
    assert_user_error(res, "tensor_model_parallel_size", "--set plan.tp=")
    assert_user_error(run("memory", "--config", str(write(tmp_path, GOOD)), "--set", "=4"), "give a key before '='")


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared fixtures absent (user clone)")
def test_missing_primus_root(tmp_path: Path) -> None:
    cfg = FIXTURES / "primus/examples/megatron/configs/MI300X/llama3_8B-BF16-pretrain.yaml"
    assert_user_error(run("memory", "--config", str(cfg), "--primus-root", str(tmp_path / "nope")),
                      "--primus-root", "does not exist", str(cfg))


def test_hf_config_without_hidden_size(tmp_path: Path) -> None:
    p = write(tmp_path, '{"model_type": "llama", "num_hidden_layers": 2}', name="config.json")
    assert_user_error(run("inspect", "--config", str(p)), str(p), "key 'hidden_size'", "required key is missing")


def test_model_args_not_a_mapping(tmp_path: Path) -> None:
    p = write(tmp_path, "ENV_VARS: {}\nMODEL_ARGS: 5\n", name="model_config.yaml")
    assert_user_error(run("inspect", "--config", str(p)), "model_config.yaml:2", "key 'MODEL_ARGS'",
                      "must be a mapping")


def test_interleaved_schedule_needs_pp_microbatches(tmp_path: Path) -> None:
    """Megatron's interleaved schedule needs at least pp microbatches per data-parallel rank: every command says so
    (memory used to stop with a ValueError traceback)."""
    text = GOOD.replace("  pp: 2", "  pp: 2\n  vpp: 2\n  schedule: interleaved_1f1b").replace(
        "global_batch_size: 64", "global_batch_size: 2")  # dp 2: one microbatch per rank
    p = write(tmp_path, text)
    for command in ("inspect", "memory", "performance"):
        assert_user_error(run(command, "--config", str(p)), str(p), "microbatch group size 2 must lie in",
                          "= 1 microbatches", "at least 2 microbatches per data-parallel rank")


@pytest.mark.parametrize("group", [1, 33, 31])
def test_a_bad_microbatch_group_size_is_named(tmp_path: Path, group: int) -> None:
    """Enough microbatches, but a group size outside [pp, microbatches] (1, 33) or one leaving a remainder below pp
    (32 % 31 = 1 < pp): the error names plan.microbatch_group_size and lists sizes that work."""
    text = GOOD.replace("  pp: 2", f"  pp: 2\n  vpp: 2\n  schedule: interleaved_1f1b\n  microbatch_group_size: {group}")
    res = run("performance", "--config", str(write(tmp_path, text)))  # dp 2: 32 microbatches per rank
    assert_user_error(res, "key 'plan.microbatch_group_size'", "(32 microbatches per data-parallel rank)",
                      "use a group size in [2, 32]", "e.g. 2, 3, 4")
    assert "key 'plan.schedule'" not in res.stderr


def test_fp8_on_a_device_without_fp8(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("global_batch_size: 64", "global_batch_size: 64\n  fp8: {format: hybrid}"))
    assert_user_error(run("performance", "--config", str(p), "--hardware", "a100-80g"), "training.fp8",
                      "a100-80g has no fp8 peak", "choose a device that runs fp8")


def test_expert_grid_on_the_assumed_single_node(tmp_path: Path) -> None:
    """The file gives no cluster size: the fix names --nodes."""
    text = GOOD.replace("  ffn_hidden_size: 14336", "  ffn_hidden_size: 14336\n  moe: {num_experts: 16, top_k: 2, "
                        "expert_ffn_hidden_size: 1024}").replace("  pp: 2", "  pp: 2\n  ep: 16").replace(
        "cluster:\n  hardware: mi300x\n  nodes: 1\n", "cluster:\n  hardware: mi300x\n")
    assert_user_error(run("inspect", "--config", str(write(tmp_path, text))), "etp * ep = 2 * 16",
                      "1 node was assumed: give it with --nodes")


def test_world_size_on_the_assumed_single_node(tmp_path: Path) -> None:
    """An audit: tp x pp beyond one node's GPUs, in a file without a cluster size, named --nodes in one format's
    message and not in another's. The world-size rule names it too."""
    text = GOOD.replace("  pp: 2", "  pp: 8").replace("cluster:\n  hardware: mi300x\n  nodes: 1\n",
                                                         "cluster:\n  hardware: mi300x\n")
    assert_user_error(run("memory", "--config", str(write(tmp_path, text))), "world size 8 is not divisible",
                      "1 node was assumed: give it with --nodes")


def test_plans_megatron_core_refuses_at_start_up(tmp_path: Path) -> None:
    """Megatron's own start-up checks (transformer_config.py, arguments.py validate_args), all listed at once: EP with
    TP needs sequence parallelism; --overlap-param-gather needs the distributed optimizer and --overlap-grad-reduce;
    a first pipeline stage with no layers; --tp-comm-overlap needs sequence parallelism."""
    text = GOOD.replace("  ffn_hidden_size: 14336", "  ffn_hidden_size: 14336\n  moe: {num_experts: 8, top_k: 2, "
                        "expert_ffn_hidden_size: 1024}").replace(
        "  tp: 2\n  pp: 2", "  tp: 2\n  pp: 2\n  ep: 2\n  sp: false\n  first_stage_layers: 0\n"
        "  overlap: {param_gather: true, tp_comm: true}")
    res = run("inspect", "--config", str(write(tmp_path, text)))
    assert_user_error(res, "needs sequence parallelism", "without the distributed optimizer",
                      "without --overlap-grad-reduce", "a pipeline stage with no transformer layers", "problems:",
                      "without --sequence-parallel")
    assert "key 'plan.sp'" in res.stderr and "key 'plan.first_stage_layers'" in res.stderr
    assert "key 'plan.overlap.tp_comm'" in res.stderr
    fixed = text.replace("sp: false", "sp: true").replace("first_stage_layers: 0", "first_stage_layers: 8").replace(
        "overlap: {param_gather: true, tp_comm: true}", "overlap: {param_gather: true, grad_reduce: true, "
        "tp_comm: true}\n  sharding: {zero_stage: 1}")
    assert run("inspect", "--config", str(write(tmp_path, fixed))).returncode == 0


def test_virtual_pipeline_without_a_pipeline(tmp_path: Path) -> None:
    """pp 1 with vpp 2: refused in the native format as the Megatron loader refuses it (validate_args)."""
    text = GOOD.replace("  tp: 2\n  pp: 2", "  tp: 2\n  pp: 1\n  vpp: 2\n  schedule: interleaved_1f1b")
    assert_user_error(run("performance", "--config", str(write(tmp_path, text))), "key 'plan.vpp'",
                      "a virtual pipeline needs a pipeline (pp > 1)")


def test_layer_cpu_offloading_plans_megatron_core_refuses(tmp_path: Path) -> None:
    """transformer_config.py's checks on --cpu-offloading-num-layers, all listed at once: fewer layers than the model,
    no pipeline parallelism, no recomputation, not with fine-grained offloading."""
    text = GOOD.replace("  pp: 2", "  pp: 2\n  offload: {activation_layers: 32, activation_modules: [core_attn]}\n"
                        "  recompute: {granularity: selective}")
    assert_user_error(run("memory", "--config", str(write(tmp_path, text))), "4 problems:",
                      "cannot be enabled with cpu_offloading",
                      "offloads fewer than the model's 32 layers",
                      "no support for Pipeline parallelism with CPU offloading",
                      "does not work when activation recomputation is enabled")
    fixed = GOOD.replace("  pp: 2", "  pp: 1\n  offload: {activation_layers: 16}")
    assert run("memory", "--config", str(write(tmp_path, fixed))).returncode == 0


def test_more_gpus_per_node_than_the_part_builds(tmp_path: Path) -> None:
    """An MI300X node holds 8 GPUs on one xGMI island: 64 per node would be priced as an island that does not exist."""
    res = run("performance", "--config", str(write(tmp_path, GOOD)), "--gpus-per-node", "64")
    assert_user_error(res, "key '--gpus-per-node'", "a mi300x node holds 8", "use at most 8 GPUs per node")
    assert run("memory", "--config", str(write(tmp_path, GOOD)), "--gpus-per-node", "4").returncode == 0


def test_a_schedule_too_large_to_build_is_refused_before_it_is_built() -> None:
    """10,000 ranks x 20,000 microbatches used to exhaust memory (the OOM killer ended it); now it is a user error."""
    res = run("schedule", "--schedule", "1f1b", "--pp", "10000", "--microbatches", "20000")
    assert_user_error(res, "200,000,000 forward actions", "more than the 1,000,000")


def test_a_single_value_for_a_table_lists_its_keys(tmp_path: Path) -> None:
    """`--set training.fp8=hybrid` (fp8 is a table): the error says so and names the keys to set instead."""
    res = run("performance", "--config", str(write(tmp_path, GOOD)), "--set", "training.fp8=hybrid")
    assert_user_error(res, "key 'training.fp8'", "a table of settings, not a single value (got 'hybrid')",
                      "--set training.fp8.format=...", "keys: format, recipe, param_gather")


def test_default_group_size_that_fails_names_the_size_that_works(tmp_path: Path) -> None:
    """pp 4, 6 microbatches, no group size: the default (pp = 4) leaves 6 % 4 = 2 < pp; 6 works, and the fix says so
    rather than asking for at least 4 microbatches (there are 6)."""
    text = GOOD.replace("  tp: 2\n  pp: 2", "  tp: 1\n  pp: 4\n  vpp: 2\n  schedule: interleaved_1f1b").replace(
        "global_batch_size: 64", "global_batch_size: 12")  # dp 2: 6 microbatches per rank
    res = run("inspect", "--config", str(write(tmp_path, text)))
    assert_user_error(res, "key 'plan.microbatch_group_size'", "6 % 4 = 2", "e.g. 6")
    assert "at least 4 microbatches" not in res.stderr and "leave it unset" not in res.stderr


def test_too_many_microbatches_is_a_batch_problem(tmp_path: Path) -> None:
    """memory and performance: the fix is fewer microbatches (the batch), not another schedule."""
    text = GOOD.replace("global_batch_size: 64", "global_batch_size: 5000000")  # dp 2, pp 2: 2.5M per rank
    for command in ("memory", "performance"):
        res = run(command, "--config", str(write(tmp_path, text)))
        assert_user_error(res, "key 'training.global_batch_size'", "forward actions", "use fewer microbatches")


def test_tp_comm_overlap_at_tp_1_in_a_megatron_launch(tmp_path: Path) -> None:
    """Megatron turns sequence parallelism off at tp 1 and then refuses --tp-comm-overlap; a native scenario at tp 1
    has no TP communication and is accepted."""
    fixture = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "megatron" / \
        "gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer" / "model_config.yaml"
    if not fixture.is_file():
        pytest.skip("../shared/fixtures is absent (a user's clone)")
    assert_user_error(run("memory", "--config", str(fixture), "--set", "tp_comm_overlap=true"),
                      "key 'tp_comm_overlap'", "turns sequence parallelism off at tp 1", "turn the TP overlap off")
    native = GOOD.replace("  tp: 2", "  tp: 1\n  overlap: {tp_comm: true}")
    assert run("memory", "--config", str(write(tmp_path, native))).returncode == 0


def test_mxfp8_needs_mx_matrix_cores(tmp_path: Path) -> None:
    """MXFP8 on an MI300X (CDNA3, no microscaling) is refused; on an MI355X (CDNA4) it runs."""
    text = GOOD.replace("global_batch_size: 64", "global_batch_size: 64\n  fp8: {format: e4m3, recipe: mxfp8}")
    assert_user_error(run("memory", "--config", str(write(tmp_path, text))), "key 'training.fp8'",
                      "MXFP8 needs matrix cores", "mi300x's device YAML says it has none")
    assert run("memory", "--config", str(write(tmp_path, text)), "--hardware", "mi355x").returncode == 0
