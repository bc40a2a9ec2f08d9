"""Megatron's NaN/Inf checks (`--check-for-nan-in-loss-and-grad`, on by default; `TrainingSpec.
check_for_nan_in_loss_and_grad`), as action items: small kernels whose result the host reads, so each is a host
synchronisation (projection/perf/action_time.py `sync`).

- Loss, per microbatch on the loss stage (pretrain_gpt.py loss_func): `rerun_state_machine.validate_result` with
  `torch.isnan` and with `torch.isinf` on the microbatch's loss; validate_result evaluates `if rejection_func(result)`,
  a Python bool of a CUDA tensor, in every rerun mode (megatron/core/rerun_state_machine.py).
- Gradients, per gradient bucket before its data-parallel reduction (param_and_grad_buffer.py
  `_ParamAndGradBucketGroup.check_grads`, called by start_grad_sync when ddp_config.check_for_nan_in_grad, which
  Megatron's training.py sets from the same flag): the bucket's L2 norm (`grad_data.norm(p=2)`), then the same two
  validate_result calls on it.
Each check: one element-wise kernel on a scalar, then the host read (its device-to-host copy and the wait).
Megatron-Bridge sets the two apart (`TrainingSpec.check_for_nan_in_loss`): the loss's from
rerun_state_machine.check_for_nan_in_loss (default on; training/losses.py masked_next_token_loss), the buckets' from
ddp.check_for_nan_in_grad (default off).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from projection.perf.action_time import Item, run, sync
from projection.specs.scenario import Scenario
from projection.workload.ops import Op
from projection.workload.ops_mlp import ROUTER_TOPK

CHECKS = ("isnan", "isinf")


def check_ops(name: str) -> list[Op]:
    """isnan and isinf of one scalar: the kernels."""
    return [Op(f"{name}.{check}", "memory_bound", "F", dtype="fp32", bytes_read=4, bytes_written=1) for check in CHECKS]


def scalar_check_items(name: str, compute_s: Callable[[Op], float]) -> list[Item]:
    """isnan and isinf of one scalar, each read by the host."""
    items: list[Item] = []
    for op in check_ops(name):
        items += [run("memory_bound", compute_s(op)), sync()]
    return items


def grad_check_items(bucket_bytes: Sequence[float], compute_s: Callable[[Op], float], category: str) -> list[Item]:
    """Per gradient bucket: its L2 norm (one read of the bucket), then the scalar checks."""
    items: list[Item] = []
    for i, nbytes in enumerate(bucket_bytes):
        op = Op(f"grad_bucket{i}.norm", "memory_bound", "W", dtype="fp32", bytes_read=nbytes, bytes_written=4)
        items.append(run(category, compute_s(op)))
        items += scalar_check_items(f"grad_bucket{i}", compute_s)
    return items


def token_count_syncs(scenario: Scenario) -> frozenset[str]:
    """Ops after which the host waits for the GPU to read a MoE layer's token counts, once per forward (recomputed
    forwards too): what the token dispatcher needs on the host to size its exchange.
    - Megatron all-to-all dispatcher (megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher
      .preprocess): the per-rank splits are copied to the host and `_maybe_dtoh_and_synchronize` waits on that copy
      at its `cuda_sync_point` (`before_ep_alltoall` with ep or tp > 1, else `before_finish`);
    - Megatron allgather dispatcher (MoEAllGatherTokenDispatcher.dispatch_postprocess): `tokens_per_expert
      ... .cpu()`;
    - TorchTitan with expert parallelism (torchtitan/distributed/expert_parallel.py, token dispatch): the output
      splits `.to("cpu", non_blocking=False)`, "this would incur a device-to-host sync"; without EP its grouped GEMM
      takes the counts on the device.
    - Megatron's flex dispatcher: DeepEP's normal dispatch, which Megatron calls without `num_worst_tokens`
      (megatron/core/transformer/moe/fused_a2a.py: "the CPU will wait for GPU's signal to arrive"; DeepEP
      csrc/deep_ep.cpp busy-polls the received counts), and `tokens_per_expert.sum().item()` after it; HybridEP
      without a static size ("None means no up-bound, will cause a CPU sync").
    Not: the all-to-all dispatcher or HybridEP padding every expert to its capacity (`drop_and_pad`: the counts are
    known on the host; DeepEP with padding is refused, validate_kernels.py), nor Primus-Turbo's DeepEP, priced
    sync-free as the README says. Native and HF scenarios follow Megatron's rule."""
    model, training, plan = scenario.model, scenario.training, scenario.plan
    if model.moe is None:
        return frozenset()
    if "torchtitan" in scenario.framework:
        return frozenset({ROUTER_TOPK}) if plan.ep > 1 else frozenset()
    dispatcher, backend = training.kernels.moe_token_dispatcher, training.kernels.moe_flex_backend
    if dispatcher == "flex" and backend == "turbo_deepep":
        return frozenset()
    if model.moe.pad_to_capacity and (dispatcher == "alltoall" or (dispatcher == "flex" and backend == "hybridep")):
        return frozenset()
    return frozenset({ROUTER_TOPK})
