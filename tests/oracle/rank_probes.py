"""Per-rank probes of the distributed TorchTitan oracles (test_memory_torchtitan_tp.py / _ep.py and their workers).

`AliveStorages`: weak references to the storage of every op output (a DTensor's local tensor's) with the creating op,
shape and dtype; after a forward, the storages still alive are what the rank keeps. `ReplayedOps`: what a backward
replays: this rank's FLOPs of the mm and grouped-mm calls run with grad mode on (the checkpoint's
recompute; the autograd engine's gradient functions run with it off), from the local shards' shapes (a DTensor mm is
seen here at its global shapes and runs on the local ones), and every functional collective the backward issues, by
projection's collective name (grad mode does not tell the recompute's from the gradients': DTensor redistributes
inside autograd Functions, with grad mode off; the tests subtract the no-recompute block's)."""

from __future__ import annotations

import json
import os
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from projection.memory.activations import layer_tensors, saved_layer_bytes, selective_saved
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec
from tests.oracle.spawn import free_port, run_spawned

# functional collective op -> projection's collective name (workload Op.coll)
COLLECTIVES = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
               "all_reduce": "all_reduce", "all_to_all_single": "all_to_all"}


def local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding t's data on this rank: a DTensor's local shard; of a wrapper subclass that keeps its
    bytes in `_data` (torchao's Float8TrainingTensor), that data."""
    while True:
        if isinstance(t, DTensor):
            t = t._local_tensor
        elif type(t) is not torch.Tensor and isinstance(getattr(t, "_data", None), torch.Tensor):
            t = t._data
        else:
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


class AliveStorages(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[Any, str, tuple[int, ...], str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                loc = local(t)
                self.refs.append((weakref.ref(loc.untyped_storage()), str(func), tuple(loc.shape), str(loc.dtype)))
        return out

    def alive(self) -> dict[int, tuple[int, str, tuple[int, ...], str]]:
        """storage id -> (bytes, creating op, shape, dtype) of the storages still alive (first creator)."""
        out: dict[int, tuple[int, str, tuple[int, ...], str]] = {}
        for ref, func, shape, dtype in self.refs:
            st = ref()
            if st is not None and st._cdata not in out:
                out[st._cdata] = (st.nbytes(), func, shape, dtype)
        return out


def run_ranks(worker: Callable[..., None], world: int, cases: list[Any], seq: int, micro_batch: int,
              what: str) -> list[list[dict[str, Any]]]:
    """Spawn `world` gloo ranks running worker(rank, world, port, cases, seq, micro_batch, out); per rank, per case,
    the JSON result each wrote to `out.<rank>`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "saved")
        run_spawned(worker, (world, free_port(), cases, seq, micro_batch, out), world, 120.0, what)
        return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(world)]


def projected(spec: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> tuple[dict[str, float], float]:
    """The estimator's named saved tensors of decoder layer 0 and their bytes (saved_layer_bytes)."""
    tensors = layer_tensors(spec, training, plan, 0)
    if plan.recompute.granularity == "selective":
        tensors = selective_saved(spec, training, plan, 0, tensors)
    return tensors, saved_layer_bytes(spec, training, plan, 0, False)


def kept_bytes(mode: AliveStorages, y: torch.Tensor, x: torch.Tensor, block: torch.nn.Module
               ) -> tuple[int, list[list[Any]]]:
    """What a rank keeps for backward after `y = block(x)` ran under `mode`: the storages still alive less the
    parameters' (local shards), buffers' and the output's, plus the block input; and those storages (bytes,
    creating op, shape, dtype)."""
    alive = mode.alive()
    for t in (y, x, *block.parameters(), *block.buffers()):
        alive.pop(local(t).untyped_storage()._cdata, None)
    kept = sum(v[0] for v in alive.values()) + x.untyped_storage().nbytes()
    storages = [list(v) for v in alive.values()] + [[x.untyped_storage().nbytes(), "block input", list(x.shape),
                                                      str(x.dtype)]]
    return kept, storages


def run_cases(rank: int, world: int, port: int, cases: list[tuple[ModelSpec, bool]], seq: int, micro_batch: int,
              out: str, measure: Callable[..., dict[str, Any]], dim: str) -> None:
    """One spawned rank: a gloo group and a 1-D CPU mesh named `dim`; measure(spec, op_sac, mesh, seq, micro_batch)
    for every case, written as JSON to `out.<rank>` (what run_ranks reads)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh: DeviceMesh = init_device_mesh("cpu", (world,), mesh_dim_names=(dim,))
        results = [measure(spec, op_sac, mesh, seq, micro_batch) for spec, op_sac in cases]
        Path(f"{out}.{rank}").write_text(json.dumps(results))
        dist.barrier()  # both ranks done with their collectives before either tears the group down
    finally:
        dist.destroy_process_group()


def case_params(cases: list[tuple[ModelSpec, bool]], world: int) -> list[Any]:
    """pytest parameters (spec, op_sac, rank) for every case on every rank, with readable ids."""
    return [pytest.param(spec, op_sac, rank, id=f"{spec.name}-{'op' if op_sac else 'none'}-rank{rank}")
            for spec, op_sac in cases for rank in range(world)]
