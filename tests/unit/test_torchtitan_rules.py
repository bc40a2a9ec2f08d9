"""TorchTitan's own start-up rules (pytorch/torchtitan torchtitan/distributed/parallel_dims.py: ParallelDims._validate
and seq_len_divisor, asserted by every model's parallelize), `--schedule NAME` on a TorchTitan pipeline (TorchTitan's
pipeline_parallel_schedule, with the stages per rank the schedule runs), the grouped-GEMM float8 converter alone, and
errors located at the key the user set. Expected outcomes are TorchTitan's asserts, worked by hand per case."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from projection import api
from projection.errors import ConfigError, PlanError, ProjectionError

DSV3_16B = """
[model]
name = "deepseek_v3"
flavor = "16B"
[training]
local_batch_size = 4
seq_len = 4096
[parallelism]
data_parallel_shard_degree = -1
"""

LLAMA_8B = """
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 8
seq_len = 8192
[parallelism]
pipeline_parallel_degree = 2
"""


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _problems(path: Path, *sets: str, **kw: object) -> list[str]:
    with pytest.raises((ConfigError, PlanError)) as e:
        api.load(path, hardware="h100-sxm", nodes=2, overrides=list(sets), **kw)  # type: ignore[arg-type]
    return [f"{p.key}: {p.message} | {p.fix}" for p in e.value.problems]


# ParallelDims._validate with EP: etp == tp -> ep % cp == 0 and (dp_shard * cp) % ep == 0;
# etp == 1 -> ep % (cp * tp) == 0 and (dp_shard * cp * tp) % ep == 0 (16 GPUs here)
@pytest.mark.parametrize(("sets", "ok"), [
    (("parallelism.tensor_parallel_degree=4", "parallelism.expert_parallel_degree=2"), False),  # 2 % (1*4) != 0
    (("parallelism.tensor_parallel_degree=4", "parallelism.expert_parallel_degree=4"), True),   # dp_shard 4: 16 % 4
    (("parallelism.tensor_parallel_degree=4", "parallelism.expert_parallel_degree=2",
      "parallelism.expert_tensor_parallel_degree=4"), True),                                  # etp=tp: 2 % 1, 4 % 2
    (("parallelism.context_parallel_degree=4", "parallelism.expert_parallel_degree=2"), False),  # 2 % 4 != 0
    (("parallelism.context_parallel_degree=2", "parallelism.expert_parallel_degree=16",
      "parallelism.data_parallel_replicate_degree=2"), False),  # dp_shard 4: (4 * 2) % 16 != 0 (replicas not borrowed)
    (("parallelism.context_parallel_degree=2", "parallelism.expert_parallel_degree=8",
      "parallelism.data_parallel_replicate_degree=2"), True),   # (4 * 2) % 8 == 0
])
def test_expert_parallel_degrees_torchtitan_refuses(tmp_path: Path, sets: tuple[str, ...], ok: bool) -> None:
    path = _toml(tmp_path, DSV3_16B)
    if ok:
        assert api.load(path, hardware="h100-sxm", nodes=2, overrides=list(sets)).plan.ep > 1
        return
    problems = _problems(path, *sets)
    assert [p for p in problems if p.startswith("parallelism.expert_parallel_degree:") and "TorchTitan" in p]
    assert not [p for p in problems if "Megatron" in p]


@pytest.mark.parametrize(("sets", "ok"), [
    (("training.seq_len=8196", "parallelism.tensor_parallel_degree=2", "parallelism.context_parallel_degree=2",
      "parallelism.pipeline_parallel_degree=1"), False),   # 8196 % (2 * 2 * 2) = 4
    (("training.seq_len=8200", "parallelism.tensor_parallel_degree=2", "parallelism.context_parallel_degree=2",
      "parallelism.pipeline_parallel_degree=1"), True),    # 8200 % 8 = 0
    (("training.seq_len=8191", "parallelism.pipeline_parallel_degree=1"), False),  # tp 1, cp 1: still 2 * cp = 2
])
def test_sequence_length_divisor(tmp_path: Path, sets: tuple[str, ...], ok: bool) -> None:
    path = _toml(tmp_path, LLAMA_8B)
    if ok:
        api.load(path, hardware="h100-sxm", nodes=2, overrides=list(sets))
        return
    assert [p for p in _problems(path, *sets) if p.startswith("training.seq_len:") and "tp * 2 * cp" in p]


@pytest.mark.parametrize(("schedule", "vpp"), [("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2), ("zbv", 2),
                                               ("dualpipev", 2)])
def test_schedule_flag_takes_the_stages_torchtitan_gives_it(tmp_path: Path, schedule: str, vpp: int) -> None:
    """Interleaved1F1B, ZBVZeroBubble and DualPipeV run 2 stages per rank without layers_per_stage (TorchTitan's
    pipeline split), as the same schedule named in the file does."""
    path = _toml(tmp_path, LLAMA_8B)
    sc = api.load(path, hardware="h100-sxm", nodes=2, schedule=schedule)
    torchtitan = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved_1f1b": "Interleaved1F1B", "zbv": "ZBVZeroBubble",
                  "dualpipev": "DualPipeV"}[schedule]
    in_file = api.load(path, hardware="h100-sxm", nodes=2,
                       overrides=[f"parallelism.pipeline_parallel_schedule={torchtitan}"])
    assert (sc.plan.schedule, sc.plan.vpp_) == (in_file.plan.schedule, vpp)
    assert sc.plan.stage_layers == in_file.plan.stage_layers
    assert sc.origins["plan.schedule"].endswith("(--schedule)")


@pytest.mark.parametrize("schedule", ["zb_h1", "zb_h2", "dualpipe", "v_half", "v_min"])
def test_schedules_torchtitan_does_not_have_are_refused(tmp_path: Path, schedule: str) -> None:
    problems = _problems(_toml(tmp_path, LLAMA_8B), schedule=schedule)
    assert problems == [f"--schedule: {schedule!r} is not a TorchTitan pipeline schedule | use one of gpipe (GPipe), "
                        "1f1b (1F1B), interleaved_1f1b (Interleaved1F1B), zbv (ZBVZeroBubble), dualpipev (DualPipeV)"]


def test_grouped_float8_converter_alone_with_modules_is_refused(tmp_path: Path) -> None:
    """Float8GroupedMMConverter converts the MoE modules its fqns name: with fqns and no linear converter the experts
    run fp8 and the dense linears bf16, which is not modelled; with empty fqns it converts nothing (bf16)."""
    path = _toml(tmp_path, DSV3_16B + '\n[quantize.grouped_mm.float8]\nfqns = ["experts"]\n')
    alone = 'model.converters=["quantize.grouped_mm.float8"]'
    assert [p for p in _problems(path, alone) if p.startswith("model.converters:") and "not modelled" in p]
    with_linear = 'model.converters=["quantize.linear.float8", "quantize.grouped_mm.float8"]'
    fp8 = api.load(path, hardware="h100-sxm", nodes=2, overrides=[with_linear]).training.fp8
    assert fp8 is not None and fp8.grouped_experts
    empty = _toml(tmp_path, DSV3_16B + "\n[quantize.grouped_mm.float8]\nfqns = []\n")
    assert api.load(empty, hardware="h100-sxm", nodes=2, overrides=[alone]).training.fp8 is None


def test_a_world_size_problem_is_located_at_the_size_the_user_set(tmp_path: Path) -> None:
    problems = _problems(_toml(tmp_path, LLAMA_8B), "parallelism.pipeline_parallel_degree=3",
                         "training.local_batch_size=3")
    assert [p for p in problems if p.startswith("parallelism.pipeline_parallel_degree: world size 16")]


def test_a_shard_degree_problem_names_the_shard_degree_in_its_fix(tmp_path: Path) -> None:
    problems = _problems(_toml(tmp_path, LLAMA_8B), "parallelism.data_parallel_shard_degree=4",
                         "parallelism.pipeline_parallel_degree=1")
    assert problems == ["parallelism.data_parallel_shard_degree: dp = 4, but world 16 / (tp*cp*pp = 1) = 16 | set "
                        "data_parallel_shard_degree to 16 (or -1, the ranks left over), or change the number of "
                        "nodes/GPUs"]


def test_schedule_all_compares_each_torchtitan_schedule_with_its_own_stages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.cli.test_performance_cli import perf_json

    path = _toml(tmp_path, LLAMA_8B)
    doc = perf_json(capsys, "--config", str(path), "--hardware", "h100-sxm", "--nodes", "2", "--schedule", "all")
    got = {p["schedule"]: p for p in doc["schedules"]}
    assert set(got) == {"gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev"}
    for name, p in got.items():  # each row is the job --schedule NAME projects
        one = perf_json(capsys, "--config", str(path), "--hardware", "h100-sxm", "--nodes", "2", "--schedule", name)
        assert p["step_time_s"] == pytest.approx(one["step_time_s"], rel=1e-12)
        assert len(p["stages"]) == len(one["stages"]) == (4 if name in ("interleaved_1f1b", "zbv", "dualpipev") else 2)


def test_a_scaling_count_whose_share_is_below_the_pipeline_microbatch_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At 8 nodes (dp 32) a global batch of 32 leaves each rank 1 sequence, fewer than the pipeline microbatch of 2:
    that is the reason given, and the global batch suggested is a multiple of microbatch x dp that runs: 128 (64
    would leave each rank one microbatch, fewer than torch's Schedule1F1B takes on pp 2)."""
    from tests.cli.test_performance_cli import perf

    path = _toml(tmp_path, LLAMA_8B)
    code, _, err = perf(capsys, "--config", str(path), "--hardware", "h100-sxm", "--nodes", "1", "--scaling", "1,8",
                        "--set", "parallelism.pipeline_parallel_microbatch_size=2")
    assert code == 2
    assert "each rank's share of the global batch, 32 / dp 32 = 1, is not a multiple of the pipeline microbatch " \
           "size 2" in err
    assert "local batch * dp" not in err and "--set training.global_batch_size=128" in err


@pytest.mark.parametrize(("rotate", "cp_comm"), [(None, "all_gather"), ("allgather", "all_gather"),
                                                 ("alltoall", "p2p")])
def test_context_parallel_rotate_method(tmp_path: Path, rotate: str | None, cp_comm: str) -> None:
    """TorchTitan's default rotate method is allgather (JobConfig); alltoall passes K/V round a ring. Both are priced
    as torch runs them (torch.distributed.tensor.experimental context parallel): K/V all-gathered once or passed
    round the ring in forward and again in backward, dK/dV round the ring in fp32, cp sends with the last exposed;
    the K/V are TorchTitan's repeat_kv copies, one per query head (32 for Llama-3-8B, not its 8 KV heads)."""
    from projection.perf import project
    from projection.workload.ops import layer_ops

    sets = ["parallelism.context_parallel_degree=2", "parallelism.pipeline_parallel_degree=1"]
    if rotate is not None:
        sets.append(f"parallelism.context_parallel_rotate_method={rotate}")
    sc = api.load(_toml(tmp_path, LLAMA_8B), hardware="h100-sxm", nodes=1, overrides=sets)
    assert sc.plan.cp_comm == cp_comm
    assert not [n for n in project(sc).notes if n.startswith("context parallelism")]
    got = {o.name: (o.coll, o.coll_bytes, o.count) for o in layer_ops(sc.model, sc.training, sc.plan, 0)
           if o.group == "cp"}
    chunk = 8 * 8192 // 2 * 32 * (128 + 128) * 2  # local batch x s/cp tokens x 32 repeated heads x (K + V) x bf16
    dkv = {"attn.cp_ring.dkv": ("send_recv", 2 * chunk, 1), "attn.cp_ring.dkv.exposed": ("send_recv", 2 * chunk, 1)}
    if cp_comm == "all_gather":
        assert got == {"attn.cp_ag.overlap": ("all_gather", 2 * chunk, 1),
                       "attn.cp_ag.bwd.overlap": ("all_gather", 2 * chunk, 1), **dkv}
    else:
        assert got == {"attn.cp_ring": ("send_recv", chunk, 1), "attn.cp_ring.bwd": ("send_recv", chunk, 1), **dkv}


def test_megatron_cp_comm_type_is_read(tmp_path: Path) -> None:
    args = tmp_path / "args.txt"
    args.write_text("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "
                    "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 "
                    "--context-parallel-size 2 --cp-comm-type a2a a2a p2p p2p --bf16\n")
    with pytest.raises(ProjectionError, match="1-based layer number"):  # a list Megatron-Core cannot run
        api.load(args, hardware="h100-sxm", nodes=1, fmt="megatron")
    sc = api.load(args, hardware="h100-sxm", nodes=1, fmt="megatron", overrides={"cp_comm_type": "a2a"})
    assert sc.plan.cp_comm == "a2a"


def test_repeat_kv_is_priced_for_eager_torchtitan(tmp_path: Path) -> None:
    """TorchTitan's Llama attention copies K and V to every query head before SDPA (`repeat_kv`): a copy kernel in
    forward, the copies' gradients summed in backward, and an attention kernel reading the query heads' K/V. A
    Megatron job (Transformer Engine takes GQA as it is) has neither."""
    from projection.workload.ops import layer_ops

    sc = api.load(_toml(tmp_path, LLAMA_8B), hardware="h100-sxm", nodes=1,
                  overrides=["parallelism.pipeline_parallel_degree=1"])
    ops = {o.name: o for o in layer_ops(sc.model, sc.training, sc.plan, 0)}
    tokens = sc.training.micro_batch_size * 8192
    small, big = tokens * 8 * 2 * 128 * 2, tokens * 32 * 2 * 128 * 2  # K and V of 8 heads, of 32, bf16
    assert (ops["attn.repeat_kv"].bytes_read, ops["attn.repeat_kv"].bytes_written) == (small, big)
    assert (ops["attn.repeat_kv.bwd"].bytes_read, ops["attn.repeat_kv.bwd"].bytes_written) == (big, small)
    assert ops["attn.core"].kv_heads == 32
    mega = api.load(Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml", hardware="h100-sxm",
                    nodes=1)
    names = {o.name: o for o in layer_ops(mega.model, mega.training, mega.plan, 0)}
    assert "attn.repeat_kv" not in names and names["attn.core"].kv_heads == 8 // mega.plan.tp
