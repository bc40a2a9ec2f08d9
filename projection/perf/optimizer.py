"""The optimizer step: a memory-bound update over the rank's (sharded) optimizer state, the gradient-norm
all-reduce, and the kernels the host issues for it.

Per pipeline rank, over the elements it updates (all its parameters, or its 1/d shard with the distributed optimizer
or ZeRO, d = dp x cp for dense and expert-dp for expert parameters, projection.memory.model_states.shard_groups):
- with `check_for_nan_in_loss_and_grad` (Megatron's default), each gradient bucket's norm and its isnan/isinf host
  reads before the data-parallel reduction (projection/perf/checks.py; booked here, at the end of the backward);
- zero the gradient buffer (Megatron zero_grad_buffer at the start of the step): write local grads;
- gradient norm for clipping (Megatron clip_grad_norm_fp32, multi_tensor_l2norm): read the grads; then one scalar
  all-reduce over every rank (the norm is reduced over the model- and data-parallel groups) that Megatron's host
  reads (`.item()`: a synchronisation, projection/perf/action_time.py; TorchTitan's torch clip_grad_norm_ keeps
  the norm on the device);
- with `log_num_zeros_in_grad` (Megatron count_zeros_fp32): per gradient tensor `numel - count_nonzero(grad)` added
  to a running total, COUNT_ZEROS_KERNELS kernels each (a Python loop, megatron/core/optimizer/clip_grads.py), read
  of the grads, then a scalar all-reduce the host reads;
- Adam/AdamW (fused multi-tensor kernel): read the gradient, read and write the fp32 master copy (mixed precision)
  and each moment; then copy the master parameters into the model parameters (params dtype, one copy kernel per
  parameter tensor, as DistributedOptimizer._copy_main_params_to_model_params loops over them). SGD, Lion and Muon
  use their number of moments (OptimizerSpec.num_moments); Muon's Newton-Schulz GEMMs are not modelled;
- with the optimizer offloaded (Megatron --optimizer-cpu-offload, HybridDeviceOptimizer), the offloaded fraction's
  gradients cross the host link (DeviceSpec.host_link_bytes_per_s) to the host and its updated parameters come back,
  one after the other; the host's Adam over that fraction is not priced (the projection notes say so); with FSDP2
  CPU offload the host runs the whole update (its copies ride on the FSDP collectives, perf/pricing.py);
- with `log_params_norm` (Megatron calc_params_l2_norm, every iteration when set): multi_tensor_l2norm over the
  (fp32 master) parameters the rank updates, a scalar all-reduce over the data-parallel and one over the
  model-parallel group, read by the host.
With Megatron's distributed optimizer (ZeRO 1/2) every loop above runs over the rank's shard: the optimizer's
param_groups hold only the fp32 shards of the parameters that overlap the rank's slice of each bucket
(distrib_optimizer.py _build_model_and_main_param_groups), so `shard_tensors` of them, not all of the stage's.
Each memory-bound part is priced by the cost model's memory-bound pricing; the host issues its kernels (a
multi-tensor launch per 36 tensors: apex/TE multi_tensor_apply's depth-4 limit, csrc/multi_tensor_apply.cuh
depth_to_max_tensors) at the host issue time of projection/perf/costmodel.host_issue, as in action_time.py.
"""

from __future__ import annotations

import math

from projection.cost.collectives import CollectiveKind, GroupPlacement
from projection.cost.model import CostModel, op_label, priced_collective
from projection.memory.model_states import shard_groups
from projection.perf.action_time import Item, blocking, run, run_items, sync
from projection.perf.checks import grad_check_items
from projection.perf.costmodel import host_issue
from projection.perf.dp import buckets, is_bucketed
from projection.perf.placement import world_placement
from projection.perf.stage_params import stage_params
from projection.specs.scenario import Scenario
from projection.specs.training import DTYPE_BYTES, OptimizerSpec
from projection.workload.ops import Op
from projection.workload.stages import split_stages

ADAM_TENSORS_PER_LAUNCH = 36
L2NORM_TENSORS_PER_LAUNCH = 110
COPY_TENSORS_PER_LAUNCH = 64
# torch's multi_tensor_apply (aten/src/ATen/native/cuda/MultiTensorApply.cuh): at most depth_to_max_tensors[lists - 1]
# tensors and 320 blocks of 65536 elements per launch
FOREACH_TENSORS = {1: 110, 2: 64, 3: 48}
FOREACH_ELEMENTS = 320 * 65536
# Per gradient tensor: count_nonzero (on CUDA a compare and a sum: ATen ReduceOps.cpp count_nonzero_cuda computes
# (self != 0).sum()), the rsub of numel and the add into the total; tests/oracle/test_op_bytes.py checks the three
# dispatched ops.
COUNT_ZEROS_KERNELS = 4


def optimizer_items(scenario: Scenario, cost_model: CostModel, pp_rank: int) -> list[Item]:
    """The optimizer step of one pipeline rank as action items (memory-bound kernels and the norm all-reduce)."""
    model, training, plan = scenario.model, scenario.training, scenario.plan
    opt = training.optimizer
    mirror = plan.pp - 1 - pp_rank if plan.schedule == "dualpipe" else pp_rank  # DualPipe: two stages per rank
    slots = [s for s in split_stages(model, plan) if s.pp_rank in (pp_rank, mirror)]
    params = [stage_params(model, plan, s) for s in slots]
    dense = sum(p.dense for p in params)
    expert = sum(p.expert for p in params)
    g_dense, g_expert = shard_groups(plan)
    zero = plan.sharding.zero_stage
    # gradient buckets (elements) of each stage's dense and expert buffers
    layout = [(p, buckets(scenario, p.dense, b), buckets(scenario, p.expert, b))
              for s, p in zip(slots, params, strict=True) for b in [is_bucketed(scenario, s.pp_rank, s.chunk)]]
    if zero in (1, 2):
        tensors = max(1, round(sum(shard_tensors(p.tensors - p.expert_tensors, len(db), g_dense)
                                   + shard_tensors(p.expert_tensors, len(eb), g_expert) for p, db, eb in layout)))
    else:
        tensors = max(1, sum(p.tensors for p in params))
    updated = dense / g_dense + expert / g_expert if zero >= 1 else float(dense + expert)
    local_grads = updated if zero >= 2 else float(dense + expert)
    param_b = DTYPE_BYTES[training.params_dtype]
    mixed = training.params_dtype != "fp32"
    # FSDP2 casts each reduced shard back to the sharded parameter's dtype (_fsdp_collectives.foreach_reduce:
    # `_to_dtype_if_needed(reduce_output, orig_dtype)`): the optimizer reads fp32 gradients whatever the reduce dtype,
    # as memory/model_states counts them
    fsdp2 = zero == 3 and plan.sharding.fsdp == "torch_fsdp2"
    grad_b = DTYPE_BYTES[opt.main_params_dtype if fsdp2 and mixed else opt.main_grads_dtype]
    master_b = DTYPE_BYTES[opt.main_params_dtype] if mixed else param_b
    moments_b = sum(DTYPE_BYTES[d] for d in (opt.exp_avg_dtype, opt.exp_avg_sq_dtype)[: opt.num_moments])
    # the share of the update the host runs: an offloaded optimizer's fraction, all of it with FSDP2 CPU offload
    cpu = 1.0 if plan.offload.fsdp_params else plan.offload.optimizer_fraction if plan.offload.optimizer else 0.0
    on_gpu = updated * (1.0 - cpu)
    items: list[Item] = []
    if training.check_for_nan_in_loss_and_grad and zero < 3:  # Megatron DDP's bucket checks (perf/checks.py)
        sizes = [n * grad_b for _, db, eb in layout for n in db + eb]
        items += grad_check_items(sizes, cost_model.op_seconds, "optimizer")

    def memory(name: str, read: float, written: float, kernels: int) -> None:
        k = max(1, kernels)
        op = Op(name, "memory_bound", "W", dtype="fp32", bytes_read=read / k, bytes_written=written / k, count=k)
        items.append(run("optimizer", cost_model.op_seconds(op), k))

    memory("zero_grad", 0.0, local_grads * grad_b, 1)
    memory("grad_norm", updated * grad_b, 0.0, math.ceil(tensors / L2NORM_TENSORS_PER_LAUNCH))
    world = world_placement(scenario.cluster, plan)
    norm_s = cost_model.collective_seconds("all_reduce", 4, world) if world.n_ranks > 1 else 0.0
    items += [blocking("optimizer", norm_s), *([] if "torchtitan" in scenario.framework else [sync()])]
    if training.log_num_zeros_in_grad:
        memory("count_zeros", updated * grad_b, 0.0, COUNT_ZEROS_KERNELS * tensors)
        items += [blocking("optimizer", norm_s), sync()]
    link = scenario.cluster.device.host_link_bytes_per_s
    if plan.offload.optimizer and cpu > 0.0 and link:  # the CPU share's gradients out, its parameters back
        items += [blocking("optimizer", updated * cpu * grad_b / link),
                  blocking("optimizer", updated * cpu * master_b / link)]
    if opt.implementation != "fused" and opt.name in ("adam", "adamw"):
        for name, read, written, lists in foreach_adam(opt, master_b, grad_b):
            launches = tensors if opt.implementation == "for-loop" else \
                max(math.ceil(tensors / FOREACH_TENSORS[lists]), math.ceil(on_gpu / FOREACH_ELEMENTS))
            memory(f"adam.{name}", on_gpu * read, on_gpu * written, launches)
    else:
        memory("adam", on_gpu * (grad_b + master_b + moments_b), on_gpu * (master_b + moments_b),
               math.ceil(tensors / ADAM_TENSORS_PER_LAUNCH))
    if mixed and not (zero == 3 and plan.sharding.fsdp == "torch_fsdp2"):
        looped = training.params_dtype == "bf16" or zero in (1, 2)
        memory("copy_main_to_model", updated * master_b, updated * param_b,
               tensors if looped else math.ceil(tensors / COPY_TENSORS_PER_LAUNCH))
    if training.log_params_norm:
        memory("params_norm", updated * master_b, 0.0, math.ceil(tensors / L2NORM_TENSORS_PER_LAUNCH))
        items += [blocking("optimizer", norm_s), blocking("optimizer", norm_s), sync()]
    return items


def foreach_adam(opt: OptimizerSpec, param_b: int, grad_b: int | None = None
                 ) -> list[tuple[str, float | int, float | int, int]]:
    """(pass, bytes read, bytes written per updated element, tensor lists) of torch.optim's foreach Adam / AdamW
    (torch/optim/adam.py _multi_tensor_adam, capturable off: the step counts stay on the host, so their
    _foreach_add_ and the bias corrections are host work): weight decay (AdamW: params *= 1 - lr wd; Adam:
    grads + wd params, a new gradient list), exp_avg lerp towards the gradient, exp_avg_sq scaled then addcmul of the
    gradient with itself (read twice), its sqrt into a new list, divided and shifted in place, and the addcdiv into the
    parameters; no decay pass at weight decay 0 (TorchTitan's default is 0.1). The oracle is
    tests/oracle/test_eager_kernels.py."""
    g = DTYPE_BYTES[opt.main_grads_dtype] if grad_b is None else grad_b
    m, v = DTYPE_BYTES[opt.exp_avg_dtype], DTYPE_BYTES[opt.exp_avg_sq_dtype]
    decay = [("decay_mul_", param_b, param_b, 1) if opt.name == "adamw" else ("decay_add", g + param_b, g, 3)]
    return [*(decay if opt.weight_decay != 0 else []), ("lerp_", m + g, m, 2), ("scale_", v, v, 1),
            ("addcmul_", v + 2 * g, v, 3), ("sqrt", v, v, 2),
            ("div_", v, v, 1), ("add_", v, v, 1), ("addcdiv_", param_b + m + v, param_b, 3)]


def shard_tensors(tensors: int, n_buckets: int, d: int) -> float:
    """Mean number of a buffer's `tensors` that overlap one of the `d` equal slices each of its `n_buckets` buckets
    is cut into (Megatron DistributedOptimizer). Summed over the d ranks, a tensor counts once plus once per slice
    boundary inside it; each bucket has d - 1 boundaries, which fall inside a tensor unless one lands exactly on a
    tensor edge or in the bucket's end padding: (tensors + n_buckets (d - 1)) / d, at most `tensors`."""
    if tensors <= 0 or n_buckets <= 0:
        return 0.0
    return min(float(tensors), (tensors + n_buckets * (d - 1)) / d)


def optimizer_step_seconds(scenario: Scenario, cost_model: CostModel, sources: dict[str, float] | None = None
                           ) -> tuple[float, ...]:
    """Seconds of the optimizer step per pipeline rank (update, gradient norm and its all-reduce, host issue);
    `sources` gets every pipeline rank's priced seconds under their cost sources (the host-link copies of an
    offloaded optimizer are the device YAML's link, no cost model's)."""
    host_s = host_issue(scenario, cost_model)[0]
    priced = cost_model if sources is None else _Sourced(cost_model, sources)
    return tuple(run_items(optimizer_items(scenario, priced, r), host_s).seconds
                 for r in range(scenario.plan.pp))


class _Sourced:
    """A cost model that adds each price it gives to `sources` under its cost source (the optimizer prices every
    kernel once as its step runs it; the norm all-reduce, which the logging options repeat, once)."""

    def __init__(self, model: CostModel, sources: dict[str, float]) -> None:
        self.model, self.sources = model, sources

    def op_seconds(self, op: Op) -> float:
        seconds = self.model.op_seconds(op)
        label = op_label(self.model, op)
        self.sources[label] = self.sources.get(label, 0.0) + seconds
        return seconds

    def collective_seconds(self, kind: CollectiveKind, size_bytes: float, group: GroupPlacement) -> float:
        return priced_collective(self.model, kind, size_bytes, group, self.sources)

    def provenance(self, op: Op) -> str:
        return self.model.provenance(op)

    def collective_provenance(self, kind: CollectiveKind, size_bytes: float, group: GroupPlacement) -> str:
        return self.model.collective_provenance(kind, size_bytes, group)
