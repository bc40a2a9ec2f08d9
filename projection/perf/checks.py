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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from projection.perf.action_time import Item, run, sync
from projection.workload.ops import Op

CHECKS = ("isnan", "isinf")


def scalar_check_items(name: str, compute_s: Callable[[Op], float]) -> list[Item]:
    """isnan and isinf of one scalar, each read by the host."""
    items: list[Item] = []
    for check in CHECKS:
        op = Op(f"{name}.{check}", "memory_bound", "F", dtype="fp32", bytes_read=4, bytes_written=1)
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
