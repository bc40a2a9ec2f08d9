"""Saved-activation bytes of real Megatron-Core decoder layers (local spec), measured on a CPU forward, against the
estimator.

tests/oracle/megatron_core_layers.py builds one Megatron-Core 0.16 TransformerLayer from `get_gpt_layer_local_spec`
(Transformer Engine needs a GPU: the local spec's torch LayerNorm, Megatron's Column/RowParallelLinear and its unfused
DotProductAttention, which materializes the s x s scores, softmax and dropout) in fp32 on the CPU, with one gloo
process and Megatron's parallel state at tp = pp = ep = 1, and runs its forward once, sequence-first ([s, b, h]),
under a dispatch mode that keeps a weak reference to the storage of every tensor an op creates (as
test_memory_torchtitan_layers.py does). After the forward, the storages still alive, less the parameters, buffers,
the layer's output and Megatron's persistent global memory buffer (the score baddbmm's beta = 0 input, one per
process: projection/memory/buffers.py counts it), plus the layer's input (the first norm saves it), are what the
layer keeps for its backward. The worker runs in its own interpreter: its process group and its patches of
CUDA-only calls must not leak into this one.

The estimate is `projection.memory.activations.saved_layer_bytes` for the same ModelSpec, fp32, tp 1, no recompute,
`kernels.transformer_impl = "local"`, `attention_backend = "unfused"` (what the Megatron loader sets for the local
spec), the layer's dispatcher and `moe_grouped_gemm = False` (SequentialMLP). Must agree within 1 % (the estimator
leaves out the norms' fp32 per-row statistics and the router's small index / mask tensors).

Layers: hidden 256, 8 heads, FFN 1024, sequence 256, micro batch 2. Dense: GPT-style (LayerNorm, GeLU, biases,
Megatron-LM's default bias-GeLU fusion) at dropout 0 and 0.1 (hidden and attention dropout; the functional tests'
default), and SwiGLU (no biases, fused bias-SwiGLU). MoE: 8 experts, top-2, expert FFN 128, SequentialMLP, no
biases, allgather and alltoall dispatchers, load balancing none or aux_loss; GeLU experts (unfused: Megatron's
GeLU fusion needs a bias) and SwiGLU experts (fused weighted SwiGLU, Megatron-LM's default).

Found by this oracle (and mended in memory/activations.py `moe_tensors`): Megatron-Core >= 0.13 applies the routing
probabilities inside the experts' activation (MLP.forward's per_token_scale / weighted_bias_swiglu_impl), not in the
unpermute, so the unpermute keeps only integer indices and no expert output (e * T * k * h) is kept; where the
activation is not fused (GeLU experts without biases, Megatron fusing GeLU only with one), the `* probs` multiply
keeps the activation output (e * T * k * ffn_e). Before, the estimator counted the expert output and not the
activation output: 4-9 % high on these layers, and 7.7 % low on the functional tests' own MoE layer (case
`moe-functional-test`: GeLU, --disable-bias-linear --no-bias-gelu-fusion, expert FFN = 4 h, sinkhorn top-1, dropout
0.1), the direction of the golden values' MoE peaks. `test_moe_keeps_no_expert_output_and_unfused_activation_output`
checks the two terms against the alive storages themselves.

GQA: `gqa-swiglu` (2 query groups, tp 1) and, on tp gloo processes (megatron_core_layers.main_tp, `TP_CASES`), fewer
query groups than TP ranks: 2 groups at tp 4 and MQA at tp 2; and sequence parallelism at tp 2 (GPT, and GQA with
4 groups), the local spec's norm built as torch's LayerNorm over the sequence shard (megatron_core_layers.py
`_sp_layer_norm`: the local norm refuses SP only for its weight gradients' all-reduce after the step).
Each rank's saved bytes, parameters, FlopCounterMode FLOPs and collectives are compared with the projection of that
rank (test_query_groups_below_tp_against_megatron_core). Found by these (mended in memory/activations.py
`attention_tensors`): Megatron's own DotProductAttention repeats K and V to the local query heads
(repeat_interleave) and keeps the copies, where the estimator had counted the KV heads alone: 5.4 % low at tp 1,
2.6 % low at 2 groups / tp 4, 4.8 % low for MQA at tp 2. Transformer Engine's attention keeps q, k, v as given
(contiguous copies of them), which the estimator counts for `transformer_engine`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")



def _have_megatron_core() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):  # no `megatron` package at all
        return False


if not _have_megatron_core():
    pytest.skip("megatron-core is not installed (it is in the test extras: `pip install -e \".[test]\"` installs "
                "megatron-core==0.16.1)", allow_module_level=True)

from projection.calibrate.bench_collective import free_port  # noqa: E402
from projection.memory.activations import (  # noqa: E402
    embedding_tensors,
    layer_tensors,
    loss_tensors,
    saved_layer_bytes,
)
from projection.specs.model import ModelSpec, MoESpec  # noqa: E402
from projection.specs.plan import ParallelPlan  # noqa: E402
from projection.specs.training import KernelSpec, TrainingSpec  # noqa: E402
from projection.workload.ops import layer_ops  # noqa: E402
from projection.workload.params import Sharding, layer_params  # noqa: E402
from tests.oracle.megatron_core_layers import (  # noqa: E402
    CASES,
    FFN,
    HEADS,
    HIDDEN,
    MICRO_BATCH,
    MODEL_CASES,
    MODEL_VOCAB,
    MOE,
    SEQ,
    TP_CASES,
)

REPO = Path(__file__).resolve().parents[2]
MIB = 2**20

_COMMON: dict[str, Any] = {"num_layers": 1, "hidden_size": HIDDEN, "num_attention_heads": HEADS,
                           "ffn_hidden_size": FFN, "norm": "layernorm", "position_embedding": "learned",
                           "max_position_embeddings": SEQ, "vocab_size": 1000}
GELU = {"gated_mlp": False, "activation": "gelu"}
SWIGLU = {"gated_mlp": True, "activation": "silu"}


def _routed(case: dict[str, Any]) -> MoESpec:
    return MoESpec(num_experts=case.get("experts", MOE[0]), top_k=case.get("topk", MOE[1]),
                   expert_ffn_hidden_size=case.get("ffn", MOE[2]))


def model_of(name: str) -> ModelSpec:
    case = CASES.get(name) or TP_CASES[name]
    act = SWIGLU if case.get("gated") else GELU
    bias = not case["moe"] and not case.get("gated")  # Megatron's default biases on the GPT layer only
    return ModelSpec(name=f"mcore-{name}", **_COMMON, **act, add_bias_linear=bias, add_qkv_bias=bias,
                     num_kv_heads=case.get("groups"), moe=_routed(case) if case["moe"] else None)


def setup_of(name: str) -> tuple[TrainingSpec, ParallelPlan]:
    case = CASES.get(name) or TP_CASES[name]
    kernels = KernelSpec(transformer_impl="local", moe_grouped_gemm=False,
                         moe_token_dispatcher=case.get("dispatcher", "alltoall"))
    training = TrainingSpec(seq_length=SEQ, micro_batch_size=MICRO_BATCH, params_dtype="fp32",
                            dropout=case["dropout"], attention_backend="unfused", kernels=kernels)
    return training, ParallelPlan(tp=case.get("tp", 1), sp=case.get("sp", False), pp=1, dp=1)


@functools.cache
def _measured_all(tp: bool = False) -> dict[str, Any]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONWARNINGS": "ignore"}
    args = ["--tp", *TP_CASES] if tp else [*CASES, *MODEL_CASES]
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.oracle.megatron_core_layers", *args], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail("the Megatron-Core layer worker did not finish in 600 s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@JSON@@")]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"the Megatron-Core layer worker failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("@@JSON@@"):])


def measured(name: str) -> dict[str, Any]:
    return _measured_all()["cases"][name]


def _report(name: str) -> tuple[float, float]:
    model = model_of(name)
    training, plan = setup_of(name)
    got = saved_layer_bytes(model, training, plan, 0, False)
    m = measured(name)
    want = m["bytes"]
    print(f"\n{name}: projected {got / MIB:.4f} MiB, measured {want / MIB:.4f} MiB, ratio {got / want:.4f}")
    print("  projected: " + ", ".join(f"{k} {v / MIB:.4f}" for k, v in layer_tensors(model, training, plan, 0).items()))
    print(f"  measured (alive after forward): layer input {m['input'] / MIB:.4f} MiB")
    for t in m["tensors"]:
        print(f"    {t['op']:<32} {t['shape']!s:<20} {t['dtype']:<14} {t['bytes'] / MIB:.4f} MiB")
    return got, want


PARAMS = list(CASES)


@pytest.mark.parametrize("name", PARAMS)
def test_megatron_core_layer_saved_bytes(name: str) -> None:
    got, want = _report(name)
    assert abs(got / want - 1) <= 0.01, f"{name}: projected {got / MIB:.4f} MiB, measured {want / MIB:.4f} MiB"


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["moe"]])
def test_moe_keeps_no_expert_output_and_unfused_activation_output(name: str) -> None:
    """Per term: nothing [T k, h]-shaped survives past the experts but the dispatched tokens (the experts' fc1 input),
    and the estimator has no `moe.expert_out`; the unfused GeLU's output is alive (the `* probs` multiply keeps it)
    and equals `moe.experts.act_out`, which a fused SwiGLU case does not have."""
    model = model_of(name)
    training, plan = setup_of(name)
    terms = layer_tensors(model, training, plan, 0)
    m = measured(name)
    n = MICRO_BATCH * SEQ * _routed(CASES[name]).top_k  # dropless: T * k routed token copies
    assert [t["shape"] for t in m["tensors"] if t["shape"] == [n, HIDDEN]] == [[n, HIDDEN]]
    assert "moe.expert_out" not in terms
    act_out = sum(t["bytes"] for t in m["tensors"] if t["op"] == "aten.gelu.default")
    assert act_out == terms.get("moe.experts.act_out", 0)
    assert (act_out == 0) == bool(CASES[name].get("gated"))


# c10d op -> (projection's collective name, which tensor argument is its size: ops_base's convention, the output of
# an all-gather, the input of a reduce-scatter, the buffer of an all-reduce)
_C10D = {"c10d._allgather_base_.default": ("all_gather", 0),
         "c10d._reduce_scatter_base_.default": ("reduce_scatter", 1), "c10d.allreduce_.default": ("all_reduce", 0)}


@pytest.mark.parametrize("name", list(TP_CASES))
def test_query_groups_below_tp_against_megatron_core(name: str) -> None:
    """Fewer query groups than TP ranks (TP_CASES: 2 groups at tp 4, MQA at tp 2; 8 heads), and sequence parallelism
    (GPT and GQA at tp 2), each TP rank of the real layer against the projection of that rank: the saved bytes (within
    1 %: the norms' per-row statistics), the parameters it holds (linear_qkv keeps (heads + 2 groups) * head_dim / tp
    rows), FlopCounterMode's forward and backward FLOPs (mm, baddbmm, bmm; the op list's GEMM and attention ops,
    exactly), and the collectives in the order the rank issues them with their sizes: below tp groups, linear_qkv's
    output all-gathered over TP and its gradient reduce-scattered; with SP, each block's input all-gathered and its
    output reduce-scattered, and in the backward the mirror images with the input re-gathered for the weight
    gradients."""
    model = model_of(name)
    training, plan = setup_of(name)
    tp, d = plan.tp, model.head_dim_
    ops = [o for o in layer_ops(model, training, plan, 0) if not o.recompute]
    want_colls = {phase: [(o.coll, o.coll_bytes) for o in ops if o.kind == "collective" and o.phase in phases]
                  for phase, phases in (("F", "F"), ("B", "IW"))}
    saved = saved_layer_bytes(model, training, plan, 0, False)
    for rank, m in enumerate(_measured_all(True)["cases"][name]):
        print(f"\n{name} rank {rank}: saved projected {saved} measured {m['bytes']}; params {m['params']}; "
              f"flop {m['flop']}; collectives {m['collectives']}")
        assert abs(saved / m["bytes"] - 1) <= 0.01, (rank, saved, m["bytes"])
        assert m["qkv_weight"] == [(HEADS + 2 * model.kv_heads) * d // tp, HIDDEN]
        assert sum(layer_params(model, 0, Sharding(tp=tp)).values()) == m["params"]
        for phase, phases in (("F", "F"), ("B", "IW")):
            flop = sum(o.total_flop for o in ops if o.phase in phases and o.kind in ("gemm", "attention"))
            assert flop == m["flop"][phase], (rank, phase, flop, m["flop"][phase])
            got = [(_C10D[op][0], sizes[_C10D[op][1]]) for op, sizes in m["collectives"][phase]]
            assert got == want_colls[phase], (rank, phase, got, want_colls[phase])
    if model.kv_heads < tp:
        gathered = MICRO_BATCH * SEQ * (HEADS + 2 * model.kv_heads) * d * 4  # fp32 [s, b, (heads + 2 groups) * d]
        assert ("all_gather", gathered) in want_colls["F"] and ("reduce_scatter", gathered) in want_colls["B"]
    if plan.sp:  # the sequence-parallel gathers and reduce-scatters of the [s, b, h] activations, both blocks
        full = MICRO_BATCH * SEQ * HIDDEN * 4
        assert want_colls["F"] == [("all_gather", full), ("reduce_scatter", full)] * 2


@pytest.mark.parametrize("name", list(MODEL_CASES))
def test_megatron_core_model_embedding_and_loss(name: str) -> None:
    """A whole one-layer GPTModel (learned positions, untied output layer, Megatron's unfused
    vocab_parallel_cross_entropy) run forward with labels: what it keeps for the backward is the layer's saved bytes
    (the test above) plus the first stage's embedding tensors (token ids; the dropout mask at dropout 0.1) and the
    last stage's loss tensors (the final norm's input, the output layer's input, the fp32 softmax the loss keeps in
    place of the logits), as the estimator adds them per stage (memory/estimate.py stage_activation_bytes). Within
    1 %: the estimator leaves out the norms' per-row statistics, the learned positions' own int64 ids and the loss's
    [s, b] target mask and shifted targets."""
    case = MODEL_CASES[name]
    model = ModelSpec(name=f"mcore-{name}", **{**_COMMON, "vocab_size": MODEL_VOCAB}, **GELU, add_bias_linear=True,
                      add_qkv_bias=True)
    training = TrainingSpec(seq_length=SEQ, micro_batch_size=MICRO_BATCH, params_dtype="fp32", dropout=case["dropout"],
                            attention_backend="unfused", kernels=KernelSpec(transformer_impl="local"))
    plan = ParallelPlan(tp=1, pp=1, dp=1)
    parts = {"layer": saved_layer_bytes(model, training, plan, 0, False),
             "embedding": sum(embedding_tensors(model, training, plan).values()),
             "loss": sum(loss_tensors(model, training, plan).values())}
    m = measured(name)
    got, want = sum(parts.values()), m["bytes"]
    print(f"\n{name}: projected {got / MIB:.4f} MiB ({', '.join(f'{k} {v / MIB:.4f}' for k, v in parts.items())}), "
          f"measured {want / MIB:.4f} MiB")
    for t in m["tensors"]:
        print(f"    {t['op']:<32} {t['shape']!s:<20} {t['dtype']:<14} {t['bytes'] / MIB:.4f} MiB")
    assert abs(got / want - 1) <= 0.01, (got, want)
    # the model's own tensors alone: the measured model less its layer measured alone (test above), against the
    # embedding and loss terms (the int64 position ids, target mask, shifted targets and final-norm statistics the
    # estimator leaves out are 13 KiB of 3.6 MiB)
    own = want - measured(case["layer"])["bytes"]
    assert abs((parts["embedding"] + parts["loss"]) / own - 1) <= 0.01, (parts, own)
    softmax = [t for t in m["tensors"] if t["shape"] == [MICRO_BATCH * SEQ, MODEL_VOCAB]]
    assert [t["bytes"] for t in softmax] == [loss_tensors(model, training, plan)["loss.softmax"]]
