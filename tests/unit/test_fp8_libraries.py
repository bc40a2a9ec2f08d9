"""What each FP8 library converts, keeps and moves, from the library's own rules (Fp8Spec docstring):

* fp8 parameter gather (torchao enable_fsdp_float8_all_gather): the gathered GEMM weights are 1 B in memory (the
  FSDP units in flight) and on the wire (the all-gathers `projection shapes` lists and the performance prices), while
  routed experts, which torchao's linear converter does not touch, stay in the params dtype;
* a grouped-GEMM converter beside the linear one runs the experts' grouped GEMMs in fp8;
* Primus-Turbo saves each forward's fp8 weights with its fp8 inputs;
* the output layer is an FP8 GEMM where the converter's filter does not name it.
The expected bytes are counted from the parameter inventory by component (projection.workload.params), not from the
code under test's own per-unit arithmetic.
"""

from __future__ import annotations

from typing import Any

import pytest

from projection.memory.activations import layer_tensors
from projection.memory.model_states import unsharded_unit_bytes
from projection.perf import project
from projection.specs.hardware import ClusterSpec, load_device
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.specs.training import Fp8Spec, TrainingSpec
from projection.workload.ops import layer_ops, output_ops
from projection.workload.params import Sharding, layer_params, per_rank_params
from projection.workload.shapes import step_shapes

H100 = load_device("h100-sxm")
MOE = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, num_kv_heads=4, ffn_hidden_size=4096,
                vocab_size=32000, moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 512})


def scenario(fp8: Fp8Spec | None, *, fsdp: bool = True) -> Scenario:
    training = TrainingSpec(seq_length=1024, micro_batch_size=1, global_batch_size=16, fp8=fp8)
    sharding: dict[str, Any] = {"zero_stage": 3, "fsdp": "torch_fsdp2"} if fsdp else {"zero_stage": 1}
    plan = ParallelPlan(tp=1, pp=1, dp=16, sharding=sharding)
    return Scenario(model=MOE, training=training, plan=plan, framework="torchtitan",
                    cluster=ClusterSpec(device=H100, nodes=2, gpus_per_node=8))


def torchao(**kw: Any) -> Fp8Spec:
    return Fp8Spec(format="hybrid", recipe="tensorwise", library="torchao", **kw)


def test_fp8_gather_holds_converted_weights_in_one_byte_and_experts_in_two() -> None:
    sc = scenario(torchao(param_gather=True))
    (rank,) = per_rank_params(sc.model, sc.plan)
    parts = layer_params(MOE, 3, Sharding(1, 1, 1))  # a MoE layer: the largest unit
    dense = parts["attention"]
    # two units in flight, each whole (FSDP2 gathers into a buffer of its own: tests/oracle/test_fsdp2_unsharded_cpu)
    expected = (dense * 1 + (sum(parts.values()) - dense) * 2) * 2
    assert unsharded_unit_bytes(sc.model, sc.training, sc.plan, rank) == pytest.approx(expected, rel=1e-9)
    plain = unsharded_unit_bytes(sc.model, scenario(torchao()).training, sc.plan, rank)
    assert plain == pytest.approx(sum(parts.values()) * 2 * 2, rel=1e-9)


def _all_gather_bytes(sc: Scenario) -> int:
    rows = step_shapes(sc)
    return sum(r.size_bytes * r.count_per_step for r in rows if r.collective == "all_gather")


def test_fp8_gather_moves_converted_weights_in_one_byte() -> None:
    on, off = scenario(torchao(param_gather=True)), scenario(torchao())
    (rank,) = per_rank_params(MOE, on.plan)
    comps = rank.by_component
    converted = sum(v for k, v in comps.items() if k in ("attention", "dense_mlp"))
    assert _all_gather_bytes(off) - _all_gather_bytes(on) == pytest.approx(converted * (2 - 1) * 2)  # 2 gathers
    dp_on, dp_off = (project(s).breakdown_s.get("comm.dp", 0.0) for s in (on, off))
    total_on, total_off = (sum(project(s).comm_total_s.values()) for s in (on, off))
    assert total_on < total_off and dp_on <= dp_off


def test_grouped_gemm_converter_puts_experts_in_fp8() -> None:
    def expert_dtypes(fp8: Fp8Spec) -> set[str]:
        sc = scenario(fp8)
        return {op.dtype for op in layer_ops(sc.model, sc.training, sc.plan, 3) if op.kind == "grouped_gemm"}

    assert expert_dtypes(torchao()) == {"bf16"}
    assert expert_dtypes(torchao(grouped_experts=True)) == {"fp8"}
    assert expert_dtypes(Fp8Spec()) == {"fp8"}  # Transformer Engine's grouped linear runs under fp8 autocast


def test_primus_turbo_saves_fp8_weights_with_fp8_inputs() -> None:
    turbo = scenario(Fp8Spec(library="primus_turbo"), fsdp=False)
    tensors = layer_tensors(MOE, turbo.training, turbo.plan, 0)  # a MoE layer (experts bf16: not saved in fp8)
    parts = layer_params(MOE, 0, Sharding(1, 1, 1))
    assert tensors["fp8.weights"] == parts["attention"] + parts["dense_mlp"]
    ao = layer_tensors(MOE, scenario(torchao(), fsdp=False).training, turbo.plan, 0)
    assert "fp8.weights" not in ao and ao["attn.linear_in"] == 2 * tensors["attn.linear_in"]
    # the routed experts run in bf16 under both (no grouped-GEMM converter): their inputs are saved in bf16
    for name in ("moe.dispatched", "moe.experts.fc2_in"):
        assert tensors[name] == ao[name], name
    assert tensors["fp8.weights"] == parts["attention"]  # the experts' weights are not fp8 copies either


@pytest.mark.parametrize(("output_layer", "dtype"), [(False, "bf16"), (True, "fp8")])
def test_output_layer_is_fp8_only_when_converted(output_layer: bool, dtype: str) -> None:
    sc = scenario(torchao(output_layer=output_layer))
    gemms = {op.dtype for op in output_ops(sc.model, sc.training, sc.plan) if op.kind == "gemm"}
    assert gemms == {dtype}


def test_casting_on_the_fly_holds_one_gemms_fp8_operands() -> None:
    """torchao holds the fp8 copies of the running GEMM's operands: in this all-MoE model with bf16 experts the FP8
    GEMMs are the fused QKV projection ((16 + 2 x 4) heads x 64 by 1024) and the output projection (1024 x 1024)
    over 1024 tokens; the largest pair is the QKV weight with its output gradient (dgrad: 1536 x 1024 + 1024 x 1536).
    Primus-Turbo casts only the output gradient."""
    from projection.memory.estimate import working_moments
    from projection.workload.stages import split_stages

    qkv_weight, qkv_dy = (16 + 2 * 4) * 64 * 1024, 1024 * (16 + 2 * 4) * 64
    sc = scenario(torchao())
    assert working_moments(sc, split_stages(MOE, sc.plan))[1]["working.fp8_casts"] == qkv_weight + qkv_dy
    turbo = scenario(Fp8Spec(library="primus_turbo"))
    assert working_moments(turbo, split_stages(MOE, turbo.plan))[1]["working.fp8_casts"] == qkv_dy
    te = scenario(Fp8Spec())
    assert "working.fp8_casts" not in working_moments(te, split_stages(MOE, te.plan))[1]


def test_without_the_transpose_cache_te_holds_one_fp8_copy_and_transposes_in_backward(tmp_path: Any) -> None:
    """ROCm Megatron-LM's --no-fp8-weight-transpose-cache (and Primus's no_fp8_weight_transpose_cache): Transformer
    Engine keeps the fp8 copy of every GEMM weight but not its transpose, which each backward makes again (one fp8
    read and write of the weight per GEMM that has one)."""
    from projection import api
    from projection.memory.model_states import fp8_weight_bytes

    base = ("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
            "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 --vocab-size 32000 "
            "--fp8-format hybrid --transformer-impl transformer_engine")
    specs = {}
    for name, extra in (("cached", ""), ("flag", " --no-fp8-weight-transpose-cache")):
        path = tmp_path / f"{name}.sh"
        path.write_text(base + extra + "\n")
        specs[name] = api.load(path, hardware="mi300x")
    primus_args = {"no_fp8_weight_transpose_cache": True}
    from projection.formats.megatron import args_to_raw

    raw = args_to_raw({"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 1024,
                       "max_position_embeddings": 1024, "micro_batch_size": 1, "global_batch_size": 8, "bf16": True,
                       "vocab_size": 32000, "fp8": "hybrid", **primus_args}, {}, source="primus")
    assert raw.get("training.fp8.weight_transpose_cache") is False
    cached, flag = specs["cached"], specs["flag"]
    assert cached.training.fp8 is not None and cached.training.fp8.weight_transpose_cache
    assert flag.training.fp8 is not None and not flag.training.fp8.weight_transpose_cache
    (rank,) = per_rank_params(cached.model, cached.plan)
    assert fp8_weight_bytes(cached.model, cached.training, cached.plan, rank) == \
        2 * fp8_weight_bytes(flag.model, flag.training, flag.plan, rank)
    transposes = [op for op in layer_ops(flag.model, flag.training, flag.plan, 0) if op.name.endswith(".transpose")]
    h = 1024  # GEMM weights of a GPT layer (MHA, 4h MLP): QKV 3h^2, projection h^2, fc1 and fc2 4h^2 each, 1 B each
    assert sum(op.bytes_read for op in transposes) == sum(op.bytes_written for op in transposes) == 12 * h * h
    assert len(transposes) == 4 and all(op.phase == "I" for op in transposes)
    assert not [op for op in layer_ops(cached.model, cached.training, cached.plan, 0) if op.name.endswith(".transpose")]
