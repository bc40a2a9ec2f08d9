"""Fewer KV heads (query groups) than tensor-parallel ranks.

Megatron-Core 0.16 accepts num_query_groups that is a multiple or a divisor of tp (transformer_config.py) and, with
fewer groups than ranks, keeps linear_qkv column-parallel over all (heads + 2 groups) heads, all-gathers its output
over TP and gives each rank heads / tp query heads against its group's one KV head (attention.py). Here: the Megatron
configs load (2 groups at tp 4, MQA at tp 8) and 6 groups at tp 4 is refused with Megatron's rule, TorchTitan keeps
refusing (its wk / wv shard column-wise, specs/validate_gqa.py); the per-rank parameters against a PyTorch Linear's
weight cut into tp row shards; the per-rank FLOPs against FlopCounterMode on plain PyTorch running every rank's share
of the algorithm in one process; the all-gather and its reduce-scatter in the op list at the gathered output's bytes.
Megatron-Core's own layer on tp gloo ranks checks the saved bytes, parameters, FLOPs and collectives in
tests/oracle/test_memory_megatron_core_layers.py (test_query_groups_below_tp_against_megatron_core).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from projection import api
from projection.errors import ConfigError, PlanError
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import KernelSpec, TrainingSpec
from projection.specs.validate_gqa import kv_heads_problem
from projection.workload.ops import layer_ops
from projection.workload.params import Sharding, attention_params

_CONFIG = """MODEL_ARGS:
  --num-layers: 8
  --hidden-size: {hidden}
  --num-attention-heads: {heads}
  --seq-length: 2048
  --max-position-embeddings: 4096
  --micro-batch-size: 1
  --global-batch-size: 64
  --tokenizer-type: NullTokenizer
  --vocab-size: 32000
  --bf16: true
  --tensor-model-parallel-size: {tp}
  --pipeline-model-parallel-size: 1
  --position-embedding-type: rope
  --swiglu: true
  --normalization: RMSNorm
  --disable-bias-linear: true
  --untie-embeddings-and-output-weights: true
  --group-query-attention: true
  --num-query-groups: {groups}
  --sequence-parallel: true
"""


def _write(tmp_path: Path, hidden: int, heads: int, tp: int, groups: int) -> Path:
    path = tmp_path / "model_config.yaml"
    path.write_text(_CONFIG.format(hidden=hidden, heads=heads, tp=tp, groups=groups))
    return path


def _load(path: Path) -> api.Scenario:
    return api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=8)


@pytest.mark.parametrize(("tp", "groups"), [(4, 2), (8, 1)], ids=["gqa-g2-tp4", "mqa-tp8"])
def test_megatron_configs_with_groups_dividing_tp_load(tmp_path: Path, tp: int, groups: int) -> None:
    sc = _load(_write(tmp_path, 1024, 16, tp, groups))
    assert (sc.plan.tp, sc.model.kv_heads) == (tp, groups)
    assert api.estimate_memory(sc).ranks  # priced end to end


def test_groups_neither_multiple_nor_divisor_of_tp_refused(tmp_path: Path) -> None:
    with pytest.raises((ConfigError, PlanError)) as err:
        _load(_write(tmp_path, 1536, 24, 4, 6))
    (p,) = [p for p in err.value.problems if "num_query_groups" in p.message]
    assert "a multiple or a divisor of tp" in p.message and p.key == "--tensor-model-parallel-size"


def _model(heads: int = 16, groups: int = 2, hidden: int = 1024) -> ModelSpec:
    return ModelSpec(name="gqa", num_layers=1, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=groups,
                     ffn_hidden_size=4 * hidden, vocab_size=1000)


def test_torchtitan_keeps_refusing_fewer_kv_heads_than_tp() -> None:
    """TorchTitan shards wk / wv column-wise: n_kv_heads * head_dim / tp columns per rank, part of a head."""
    model, training = _model(), TrainingSpec(seq_length=128, micro_batch_size=1)
    plan = ParallelPlan(tp=4)
    assert kv_heads_problem("megatron", model, training, plan) is None
    for framework, tr, pl in (("torchtitan", training, plan), ("primus-torchtitan", training, plan),
                              ("native", training.model_copy(update={"kernels": KernelSpec(
                                  transformer_impl="torchtitan")}), plan),
                              ("native", training, plan.model_copy(update={"tp_style": "dtensor"}))):
        problem = kv_heads_problem(framework, model, tr, pl)
        assert problem is not None and "TorchTitan" in problem[0], framework
    assert kv_heads_problem("torchtitan", _model(groups=8), training, plan) is None


@pytest.mark.parametrize(("tp", "groups"), [(4, 2), (8, 1), (2, 2), (4, 8)])
def test_attention_params_per_rank_equal_column_parallel_shards(tp: int, groups: int) -> None:
    """Each rank holds one of tp equal row blocks of the fused QKV weight [(heads + 2 groups) * d, h] and one of tp
    column blocks of the output projection (torch.chunk of full nn.Linear weights, Megatron's Column/RowParallel)."""
    model = _model(groups=groups)
    d, h = model.head_dim_, model.hidden_size
    qkv = torch.nn.Linear(h, (model.num_attention_heads + 2 * groups) * d, bias=False, device="meta")
    proj = torch.nn.Linear(model.num_attention_heads * d, h, bias=False, device="meta")
    shards = [q.numel() + o.numel() for q, o in zip(qkv.weight.chunk(tp, 0), proj.weight.chunk(tp, 1), strict=True)]
    assert set(shards) == {attention_params(model, Sharding(tp=tp))}


def _rank_share(x: torch.Tensor, w_qkv: torch.Tensor, w_proj: torch.Tensor, heads: int, groups: int, d: int,
                tp: int, rank: int, gathered: torch.Tensor) -> torch.Tensor:
    """Rank `rank`'s attention after the all-gather (Megatron get_query_key_value_tensors): its group's slice of the
    gathered [b, s, groups * (heads / groups + 2) * d], heads / tp of the group's query heads, the group's K and V,
    causal SDPA, and its column block of the output projection."""
    b, s, _ = x.shape
    per_group = heads // groups
    group = gathered.view(b, s, groups, (per_group + 2) * d)[:, :, rank // (tp // groups)]
    q, k, v = group.split([per_group * d, d, d], -1)
    local = heads // tp
    q = q.view(b, s, per_group, d)[:, :, (rank % (tp // groups)) * local:][:, :, :local]
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.view(b, s, 1, d).transpose(1, 2),
                                       v.view(b, s, 1, d).transpose(1, 2), is_causal=True, enable_gqa=True)
    return o.transpose(1, 2).reshape(b, s, local * d) @ w_proj.chunk(tp, 1)[rank].T


@pytest.mark.parametrize(("tp", "groups"), [(4, 2), (4, 1)], ids=["g2-tp4", "mqa-tp4"])
def test_attention_flops_per_rank_equal_flop_counter(tp: int, groups: int) -> None:
    """FlopCounterMode over every rank's share run in one process (each rank's QKV GEMM on its weight shard, the
    gathered output, each rank's attention and projection block) = tp x the rank's GEMM and attention ops (causal
    attention doubled: the math SDPA kernel computes the full matrix), forward and backward."""
    heads, b, s = 8, 2, 32
    model = _model(heads=heads, groups=groups, hidden=64)
    d, h = model.head_dim_, model.hidden_size
    torch.manual_seed(0)
    x = torch.randn(b, s, h, requires_grad=True)
    w_qkv = torch.randn((heads + 2 * groups) * d, h, requires_grad=True)
    w_proj = torch.randn(h, heads * d, requires_grad=True)
    with sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as fwd:
            gathered = torch.cat([x @ w.T for w in w_qkv.chunk(tp, 0)], -1)  # the all-gather along the last dim
            y = sum(_rank_share(x, w_qkv, w_proj, heads, groups, d, tp, r, gathered) for r in range(tp))
        with FlopCounterMode(display=False) as bwd:
            y.sum().backward()  # type: ignore[union-attr]
    training = TrainingSpec(seq_length=s, micro_batch_size=b, params_dtype="fp32")
    ops = [o for o in layer_ops(model, training, ParallelPlan(tp=tp, dp=1), 0) if o.tag in ("attn", "core_attn")]

    def flop(phases: str) -> float:
        return sum(o.total_flop * (2 if o.causal else 1) for o in ops
                   if o.phase in phases and o.kind in ("gemm", "attention"))

    assert tp * flop("F") == fwd.get_total_flops()
    assert tp * flop("IW") == bwd.get_total_flops()
    (qkv,) = [o for o in ops if o.name == "attn.qkv" and o.phase == "F"]
    assert (qkv.m, qkv.n, qkv.k) == ((heads + 2 * groups) * d // tp, b * s, h)
    core = next(o for o in ops if o.kind == "attention")
    assert (core.heads, core.kv_heads) == (heads // tp, 1)


def test_qkv_all_gather_and_reduce_scatter_in_op_list(tmp_path: Path) -> None:
    """2 groups at tp 4 (16 heads of 64, bf16, 2048 tokens, SP): linear_qkv's output [2048, (16 + 4) * 64] is
    all-gathered over TP after the GEMM (forward) and its gradient reduce-scattered (backward), 2048 * 1280 * 2 bytes;
    with groups >= tp neither exists."""
    sc = _load(_write(tmp_path, 1024, 16, 4, 2))
    ops = layer_ops(sc.model, sc.training, sc.plan, 0)
    gathered = 2048 * (16 + 2 * 2) * 64 * 2
    names = [o.name for o in ops if o.phase == "F"]
    assert names.index("attn.qkv_out.ag") == names.index("attn.qkv") + 1
    (ag,) = [o for o in ops if o.name == "attn.qkv_out.ag"]
    (rs,) = [o for o in ops if o.name == "attn.qkv_out.rs"]
    assert (ag.phase, ag.coll, ag.group, ag.coll_bytes) == ("F", "all_gather", "tp", gathered)
    assert (rs.phase, rs.coll, rs.group, rs.coll_bytes) == ("I", "reduce_scatter", "tp", gathered)
    bwd = [o.name for o in ops if o.phase in "IW"]
    assert bwd.index("attn.qkv_out.rs") < bwd.index("attn.qkv.dgrad")
    wide = layer_ops(sc.model.model_copy(update={"num_kv_heads": 4}), sc.training, sc.plan, 0)
    assert not [o for o in wide if o.name.startswith("attn.qkv_out")]
