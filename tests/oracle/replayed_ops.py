"""What a backward replays, for the distributed TorchTitan oracles (tests/oracle/torchtitan_tp_worker.py,
torchtitan_ep_worker.py): this rank's FLOPs of the mm and grouped-mm calls run with grad mode on (the checkpoint's
recompute; the autograd engine's gradient functions run with it off), from the local shards' shapes (a DTensor mm is
seen here at its global shapes and runs on the local ones), and every functional collective the backward issues, by
projection's collective name (grad mode does not tell the recompute's from the gradients': DTensor redistributes
inside autograd Functions, with grad mode off; the tests subtract the no-recompute block's)."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

# functional collective op -> projection's collective name (workload Op.coll)
COLLECTIVES = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
               "all_reduce": "all_reduce", "all_to_all_single": "all_to_all"}


def local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding t's data on this rank (a DTensor's local shard)."""
    while isinstance(t, DTensor):
        t = t._local_tensor
    return t


class ReplayedOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.flop = 0.0
        self.collectives: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if torch.is_grad_enabled() and func == torch.ops.aten.mm.default:
            (m, k), n = local(args[0]).shape, local(args[1]).shape[1]
            self.flop += 2.0 * m * k * n
        elif torch.is_grad_enabled() and func == torch.ops.aten._grouped_mm.default:
            (rows, k), n = local(args[0]).shape, local(args[1]).shape[-1]
            self.flop += 2.0 * rows * k * n
        elif func.namespace == "_c10d_functional" and func.__name__.split(".")[0] in COLLECTIVES:
            name = COLLECTIVES[func.__name__.split(".")[0]]
            self.collectives[name] = self.collectives.get(name, 0) + 1
        return func(*args, **(kwargs or {}))
