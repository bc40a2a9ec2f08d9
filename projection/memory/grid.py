"""Vectorised memory estimate over many parallel layouts at once (numpy arrays in, arrays out), for pruning
planner sweeps before the exact per-rank estimate.

Every per-layer quantity of the exact model is affine in 1/tp for a fixed sequence-parallel setting (each saved
tensor and each parameter is either split over TP or replicated; validation forbids a tp that does not divide the
heads, KV heads or FFN), and linear in the micro batch. So the exact scalar functions are evaluated at tp = 1 and
tp = 2 with one micro batch, and the grid interpolates: value(tp, b) = b · (a + c / tp). In-flight microbatches
use the closed forms the schedule builders are tested against (tests/unit/test_schedules.py): 1F1B rank r holds
min(pp - r, m); Megatron interleaved rank 0 holds min(2(pp - 1) + (vpp - 1)·pp + 1, m·vpp) chunk-microbatches.
The grid models the first and the last pipeline rank (where peaks occur) with uniform stages; `tests` check it
against `estimate_memory`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from projection.memory.activations import layer_input_bytes, layer_tensors, loss_tensors, loss_working_set
from projection.memory.buffers import GEMM_THREADS, default_cublas_workspace
from projection.specs.hardware import DeviceSpec
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import DTYPE_BYTES, TrainingSpec
from projection.workload.params import Sharding, embedding_params, layer_params, output_params

Array = np.ndarray


@dataclass(frozen=True)
class GridResult:
    """Bytes per plan (arrays of the broadcast shape of the inputs)."""

    first_rank_bytes: Array
    last_rank_bytes: Array
    peak_bytes: Array
    states_first_bytes: Array
    activations_first_bytes: Array


def _affine(f: object, sp: bool) -> tuple[float, float]:
    """(a, c) with f(tp) = a + c / tp, from f(1) and f(2)."""
    f1, f2 = f(1), f(2)  # type: ignore[operator]
    c = 2 * (f1 - f2)
    return f1 - c, c


def memory_grid(model: ModelSpec, training: TrainingSpec, *, tp: Array, pp: Array, dp: Array, mbs: Array,
                zero_stage: Array, vpp: Array | int = 1, sp: bool = True, cp: int = 1,
                device: DeviceSpec | None = None) -> GridResult:
    """Peak bytes of the first and last pipeline rank for every plan (broadcast arrays). Dense, non-MoE models,
    Megatron mixed precision (bf16 params, fp32 main grads and Adam), no recompute; the global batch of `training`
    fixes the microbatch count m = gbs / (mbs · dp). With `device`, the GEMM-library workspaces every rank holds
    (buffers.py: one per GEMM thread, the device's default size) are included."""
    tp, pp, dp, mbs, zero = (np.asarray(x) for x in (tp, pp, dp, mbs, zero_stage))
    vpp_a = np.asarray(vpp)
    one = training.model_copy(update={"micro_batch_size": 1})

    def plan(t: int) -> ParallelPlan:
        return ParallelPlan(tp=t, sp=sp, cp=cp, dp=1)

    layer_p = _affine(lambda t: sum(layer_params(model, 0, Sharding(tp=t)).values()), sp)
    act = _affine(lambda t: sum(layer_tensors(model, one, plan(t), 0).values()), sp)
    work = _affine(lambda t: max(layer_tensors(model, one, plan(t), 0).values())
                   + 2 * layer_input_bytes(model, one, plan(t)), sp)
    loss = _affine(lambda t: sum(loss_tensors(model, one, plan(t)).values()) + loss_working_set(model, one, plan(t)),
                   sp)
    L = model.num_layers
    layers_per_rank = L / pp
    p_layer = layer_p[0] + layer_p[1] / tp
    emb = np.vectorize(lambda t: embedding_params(model, int(t)), otypes=[float])(tp)
    out = 0.0 if model.tie_embeddings else np.vectorize(lambda t: output_params(model, int(t)), otypes=[float])(tp)
    out = np.where((pp > 1) & model.tie_embeddings, np.vectorize(lambda t: output_params(model, int(t)),
                                                                otypes=[float])(tp), out)
    p_first = layers_per_rank * p_layer + emb + np.where(pp == 1, out, 0.0)
    p_last = layers_per_rank * p_layer + out + np.where(pp == 1, emb, 0.0)

    opt = training.optimizer
    w_b, g_b = DTYPE_BYTES[training.params_dtype], DTYPE_BYTES[opt.main_grads_dtype]
    o_b = DTYPE_BYTES[opt.main_params_dtype] + DTYPE_BYTES[opt.exp_avg_dtype] + DTYPE_BYTES[opt.exp_avg_sq_dtype]
    shard = dp * cp

    def states(p: Array) -> Array:
        w = p * w_b / np.where(zero >= 3, shard, 1)
        g = p * g_b / np.where(zero >= 2, shard, 1)
        o = p * o_b / np.where(zero >= 1, shard, 1)
        return w + g + o

    m = training.resolved_global_batch(1) // (mbs * dp)
    per_layer_act = mbs * (act[0] + act[1] / tp)
    interleaved = vpp_a > 1
    chunks_first = np.where(interleaved, np.minimum(2 * (pp - 1) + (vpp_a - 1) * pp + 1, m * vpp_a),
                            np.minimum(pp, m))
    layers_per_chunk = layers_per_rank / np.where(interleaved, vpp_a, 1)
    act_first = chunks_first * layers_per_chunk * per_layer_act + mbs * (work[0] + work[1] / tp)
    act_last = layers_per_chunk * per_layer_act + mbs * (loss[0] + loss[1] / tp)
    workspaces = GEMM_THREADS * default_cublas_workspace(device) if device is not None else 0
    first = states(p_first) + act_first + workspaces
    last = states(p_last) + act_last + workspaces
    return GridResult(first, last, np.maximum(first, last), states(p_first), act_first)
