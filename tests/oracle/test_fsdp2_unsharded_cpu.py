"""FSDP2's unsharded parameters, measured: a decoder (tests/oracle/memory_models.py, built from a ModelSpec) is sharded
with `fully_shard` (each decoder layer a unit, the root holding the embedding, the final norm and the output layer:
the test decoder calls the output weight directly, so it cannot be a unit of its own as in TorchTitan, which changes
nothing when no unit reshards), bf16 compute over fp32 shards, no reshard after forward (TorchTitan's policy under
PP), on 2 gloo processes on the CPU. After a forward every unit is unsharded: the bytes of the storages behind the
unsharded parameters are what `projection.memory.model_states.unsharded_unit_bytes` must hold, whole (FSDP2 gathers
into a compute-dtype buffer of its own; the fp32 shard stays apart as the sharded parameter), exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from projection.memory.model_states import unsharded_unit_bytes  # noqa: E402
from projection.specs.model import ModelSpec  # noqa: E402
from projection.specs.plan import ParallelPlan  # noqa: E402
from projection.specs.training import TrainingSpec  # noqa: E402
from projection.workload.params import per_rank_params  # noqa: E402
from tests.oracle.spawn import free_port, run_spawned  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = ModelSpec(name="fsdp-probe", num_layers=3, hidden_size=128, num_attention_heads=4, num_kv_heads=2,
                  ffn_hidden_size=352, vocab_size=512, tie_embeddings=False)
SEQ = 32


def _sharded_decoder(rank: int, port: int, reduce_dtype: Any, reshard: bool = False) -> Any:
    """The test decoder under FSDP2 on this rank of a 2-rank gloo group (started here): each layer a unit, the root
    holding the embedding, final norm and output; bf16 compute, `reduce_dtype` reduce."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from tests.oracle.memory_models import Decoder

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = Decoder(MODEL, SEQ)
    mesh = init_device_mesh("cpu", (2,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)  # embedding, final norm, output
    return model


def _worker(rank: int, port: int, out: str, reshard: bool = False) -> None:
    import torch.distributed as dist

    model = _sharded_decoder(rank, port, torch.float32, reshard)
    try:
        ids = torch.randint(0, MODEL.vocab_size, (1, SEQ))
        # a pipeline stage's non-last backward: gradient sync and reshard-after-backward off, as
        # torch.distributed.pipelining sets them
        model.set_requires_gradient_sync(False)
        model.set_reshard_after_backward(False)
        loss = model(ids, ids)
        if reshard:  # resharded after forward: what stays unsharded is what the backward left (measured below)
            loss.backward()
            loss = model(ids, ids)
        storages = {p.untyped_storage()._cdata: p.untyped_storage().nbytes() for p in model.parameters()}
        dtypes = sorted({str(p.dtype) for p in model.parameters()})
        loss.backward()
        if reshard:
            storages = {p.untyped_storage()._cdata: p.untyped_storage().nbytes() for p in model.parameters()}
            dtypes = sorted({str(p.dtype) for p in model.parameters()})
        accumulated = 0
        for module in model.modules():
            state = getattr(module, "_get_fsdp_state", None)
            group = state()._fsdp_param_group if state is not None else None
            for fp in group.fsdp_params if group is not None else ():
                grad = fp.unsharded_accumulated_grad
                accumulated += grad.untyped_storage().nbytes() if grad is not None else 0
        if rank == 0:
            Path(out).write_text(json.dumps({"bytes": sum(storages.values()), "dtypes": dtypes,
                                             "accumulated_grad_bytes": accumulated}), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def test_unsharded_units_are_held_whole(tmp_path: Path) -> None:
    out = tmp_path / "fsdp.json"
    run_spawned(_worker, (free_port(), str(out)), world=2, limit_s=120, what="FSDP2 forward")
    measured: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    plan = ParallelPlan(dp=2, pp=2, schedule_style="torch",
                        sharding={"zero_stage": 3, "fsdp": "torch_fsdp2", "reshard_after_forward": False})
    one_stage = plan.model_copy(update={"pp": 1})
    (rank,) = per_rank_params(MODEL, one_stage)
    projected = unsharded_unit_bytes(MODEL, TrainingSpec(seq_length=SEQ), one_stage.model_copy(
        update={"sharding": plan.sharding}), rank, output_unit=True)
    print(f"\nunsharded bf16 parameters after forward: measured {measured['bytes']} B, projected {projected} B")
    assert measured["dtypes"] == ["torch.bfloat16"]  # after forward the module holds the unsharded compute copies
    assert projected == measured["bytes"]


def test_gradients_without_sync_are_held_whole_in_the_reduce_dtype(tmp_path: Path) -> None:
    """With gradient sync off (every backward of a pipeline stage but the last), FSDP2 keeps each unsharded gradient,
    upcast to the reduce dtype (fp32), until the final reduce-scatter: `gradients.main` of a pipelined FSDP2 rank."""
    from projection.memory.model_states import model_state_bytes

    out = tmp_path / "fsdp.json"
    run_spawned(_worker, (free_port(), str(out)), world=2, limit_s=120, what="FSDP2 backward without sync")
    measured = json.loads(out.read_text(encoding="utf-8"))["accumulated_grad_bytes"]
    plan = ParallelPlan(dp=2, pp=2, schedule_style="torch",
                        sharding={"zero_stage": 3, "fsdp": "torch_fsdp2", "reshard_after_forward": False})
    assert plan.pipelined_fsdp
    (rank,) = per_rank_params(MODEL, plan.model_copy(update={"pp": 1}))  # the whole model as one stage
    training = TrainingSpec(seq_length=SEQ)  # bf16 compute, fp32 master and reduce
    projected = model_state_bytes(MODEL, training, plan, rank).terms["gradients.main"]
    print(f"\nunsharded fp32 gradients held without sync: measured {measured} B, projected {projected} B")
    assert projected == measured


def test_pipelined_units_stay_whole_after_backward_even_with_reshard(tmp_path: Path) -> None:
    """With reshard after forward ("always") but reshard-after-backward off (inside a pipeline stage), every unit is
    left unsharded by its backward until the next forward: the whole stage at once, not two units."""
    out = tmp_path / "fsdp.json"
    run_spawned(_worker, (free_port(), str(out), True), world=2, limit_s=120,
                what="FSDP2 with reshard after forward, none after backward")
    measured: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    plan = ParallelPlan(dp=2, pp=2, schedule_style="torch",
                        sharding={"zero_stage": 3, "fsdp": "torch_fsdp2", "reshard_after_forward": True})
    (rank,) = per_rank_params(MODEL, plan.model_copy(update={"pp": 1}))
    projected = unsharded_unit_bytes(MODEL, TrainingSpec(seq_length=SEQ), plan, rank, output_unit=True)
    print(f"\nunsharded after backward: measured {measured['bytes']} B, projected {projected} B")
    assert measured["dtypes"] == ["torch.bfloat16"]
    assert projected == measured["bytes"]


def _reduce_worker(rank: int, port: int, out: str) -> None:
    """One step of the decoder under FSDP2 with a bf16 reduce (TorchTitan's mixed_precision_reduce = "bfloat16"):
    the sharded gradients it leaves (dtype, bytes on this rank)."""
    import torch.distributed as dist

    model = _sharded_decoder(rank, port, torch.bfloat16)
    try:
        ids = torch.randint(0, MODEL.vocab_size, (1, SEQ))
        model(ids, ids).backward()
        grads = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
        if rank == 0:
            storages = {g.untyped_storage()._cdata: g.untyped_storage().nbytes() for g in grads}  # views of a few
            Path(out).write_text(json.dumps({"dtypes": sorted({str(g.dtype) for g in grads}),
                                             "bytes": sum(storages.values()),
                                             "elements": sum(g.numel() for g in grads)}), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def test_a_bf16_reduce_leaves_fp32_sharded_gradients(tmp_path: Path) -> None:
    """FSDP2 reduce-scatters in the reduce dtype and casts each reduced shard back to the sharded parameter's (fp32):
    the gradients the optimizer reads (projection/perf/optimizer.py) and memory holds are fp32 whatever
    mixed_precision_reduce, which the TorchTitan loader maps to main_grads_dtype."""
    from projection.memory.model_states import model_state_bytes
    from projection.specs.training import OptimizerSpec

    out = tmp_path / "grads.json"
    run_spawned(_reduce_worker, (free_port(), str(out)), world=2, limit_s=120, what="FSDP2 step with a bf16 reduce")
    measured = json.loads(out.read_text(encoding="utf-8"))
    plan = ParallelPlan(dp=2, sharding={"zero_stage": 3, "fsdp": "torch_fsdp2"})
    (rank,) = per_rank_params(MODEL, plan)
    training = TrainingSpec(seq_length=SEQ, optimizer=OptimizerSpec(main_grads_dtype="bf16"))
    projected = model_state_bytes(MODEL, training, plan, rank).terms["gradients.main"]
    print(f"\nsharded gradients after a bf16 reduce: measured {measured}, projected {projected} B")
    assert measured["dtypes"] == ["torch.float32"]
    assert projected == measured["bytes"]
