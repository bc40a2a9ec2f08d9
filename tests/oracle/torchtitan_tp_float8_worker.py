"""One rank of the TorchTitan float8 tensor-parallel oracle (tests only; spawned by test_torchtitan_tp_float8.py).

As tests/oracle/torchtitan_tp_worker.py, with the block's linears converted by torchao's
`convert_to_float8_training` (tensorwise, `emulate=True`: the fp8 GEMM is emulated on the CPU, the casts and the
tensors are real) and TorchTitan's float8 TP plan (v0.1 `apply_tp` with `enable_float8_tensorwise_tp`, read through
the public-code index; no code copied): PrepareFloat8ModuleInput in front of attention and feed-forward,
Float8ColwiseParallel for wq / wk / wv / w1 / w3, Float8RowwiseParallel(output_layouts=Shard(1)) for wo / w2, the norms
SequenceParallel. gloo has no float8 dtypes, so this rank's all-gathers run on the fp8 bytes viewed as uint8 (the
same bytes; `_gloo_byte_gathers`). Per rank and case: the bytes kept after forward (rank_probes.kept_bytes, a
Float8TrainingTensor counted by its fp8 data: rank_probes.local), and every collective of forward and of backward
with its element size and bytes."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

from projection.specs.model import ModelSpec
from tests.oracle import rank_probes
from tests.oracle.rank_probes import AliveStorages, kept_bytes, run_cases
from tests.oracle.torchtitan_layers import Block
from tests.oracle.torchtitan_tp_worker import _tp_norms

_LIBS: list[Any] = []


def _gloo_byte_gathers() -> None:
    """Run `_c10d_functional.all_gather_into_tensor` on the CPU through c10d's all_gather_into_tensor, 1-byte
    floats viewed as uint8 (gloo refuses float8 dtypes; the bytes moved are the same)."""
    if _LIBS:
        return
    lib = torch.library.Library("_c10d_functional", "IMPL")

    def gather(inp: torch.Tensor, group_size: int, group_name: str) -> torch.Tensor:
        flat = inp.contiguous()
        raw = flat.view(torch.uint8) if flat.is_floating_point() and flat.element_size() == 1 else flat
        out = raw.new_empty((raw.shape[0] * group_size, *raw.shape[1:]))
        dist.all_gather_into_tensor(out, raw, group=_resolve_process_group(group_name))
        return out.view(inp.dtype)

    lib.impl("all_gather_into_tensor", gather, "CPU")
    _LIBS.append(lib)


class Collectives(TorchDispatchMode):
    """Every functional collective issued: (projection's name, element bytes, this rank's input bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.__name__.split(".")[0]
        if func.namespace == "_c10d_functional" and name in rank_probes.COLLECTIVES:
            t = rank_probes.local(args[0])
            self.seen.append((rank_probes.COLLECTIVES[name], t.element_size(), t.numel() * t.element_size()))
        return func(*args, **(kwargs or {}))


def tp_plan() -> dict[str, Any]:
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    gather = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
    return {"attention_norm": SequenceParallel(), "attention": PrepareFloat8ModuleInput(**gather),
            "attention.wq": Float8ColwiseParallel(), "attention.wk": Float8ColwiseParallel(),
            "attention.wv": Float8ColwiseParallel(), "attention.wo": Float8RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(), "feed_forward": PrepareFloat8ModuleInput(**gather),
            "feed_forward.w1": Float8ColwiseParallel(), "feed_forward.w3": Float8ColwiseParallel(),
            "feed_forward.w2": Float8RowwiseParallel(output_layouts=Shard(1))}


def measure(spec: ModelSpec, _: bool, mesh: DeviceMesh, seq: int, micro_batch: int) -> dict[str, Any]:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    _gloo_byte_gathers()
    torch.manual_seed(0)
    block = Block(spec, 0, seq).to(torch.bfloat16)
    _tp_norms(block)
    convert_to_float8_training(block, config=Float8LinearConfig(emulate=True))
    assert sum(type(m).__name__ == "Float8Linear" for m in block.modules()) == 7
    parallelize_module(block, mesh, tp_plan())
    tp, rank = mesh.size(), mesh.get_local_rank()
    torch.manual_seed(1 + rank)
    x = torch.randn(micro_batch, seq // tp, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    alive, fwd = AliveStorages(), Collectives()
    with alive, fwd:  # a Float8TrainingTensor is counted by its fp8 data (rank_probes.local)
        y = block(x)
    kept, storages = kept_bytes(alive, y, x, block)
    bwd = Collectives()
    with bwd:
        y.backward(torch.ones_like(y))
    assert x.grad is not None and all(p.grad is not None for p in block.parameters())
    return {"kept": kept, "storages": storages, "forward": fwd.seen, "backward": bwd.seen}


def worker(rank: int, world: int, port: int, cases: list[tuple[ModelSpec, bool]], seq: int, micro_batch: int,
           out: str) -> None:
    run_cases(rank, world, port, cases, seq, micro_batch, out, measure, "tp")
