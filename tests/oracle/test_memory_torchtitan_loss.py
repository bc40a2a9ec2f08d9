"""The memory peak of TorchTitan's uncompiled loss, measured by PyTorch's memory tracker on a real CPU step.

TorchTitan's training step computes `pred = model(inputs)`, `loss = cross_entropy(pred.flatten(0, 1).float(),
labels.flatten(0, 1))`, deletes `pred` and runs `loss.backward()` ("need to free pred before bwd to avoid peaking
memory"). Autograd saves the fp32 log-softmax; in backward nll_loss_backward makes a zero-filled fp32 gradient and
log_softmax's backward a second one while the saved result lives. The output layer's input and weight are left out
(they are counted elsewhere): the logits come from a bf16 leaf. The estimate of that moment is
`loss_tensors(...)["loss.softmax"] + loss_working_set(...)` (projection/memory/activations.py); it must equal the
tracker's peak of activations and temporaries within 1 % (the labels and scalars).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

from projection.memory.activations import loss_tensors, loss_working_set  # noqa: E402
from projection.specs.model import ModelSpec  # noqa: E402
from projection.specs.plan import ParallelPlan  # noqa: E402
from projection.specs.training import KernelSpec, TrainingSpec  # noqa: E402

B, S, VOCAB, HIDDEN = 2, 512, 4000, 64
MODEL = ModelSpec(name="tt-loss", num_layers=1, hidden_size=256, num_attention_heads=8, ffn_hidden_size=704,
                  vocab_size=VOCAB, vocab_divisible_by=1)


def _peak() -> float:
    """Peak bytes the tracker counts over the loss forward and backward, less the logits themselves (a leaf here,
    kept alive by the test; the output layer's result in a model, freed by the step)."""
    pred = torch.randn(B, S, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (B, S))
    tracker = MemTracker()
    tracker.track_external(pred)
    with tracker:
        loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        logits = pred
        del pred  # TorchTitan's step frees its reference; autograd holds none (log_softmax saves its result)
        loss.backward()
    peak = tracker.get_tracker_snapshot("peak")
    by_kind = next(iter(peak.values()))
    # the leaf stays alive here (a model frees it with `del pred`); its gradient is made after the peak
    return float(by_kind["Total"]) - logits.untyped_storage().nbytes()


def test_eager_loss_peak_is_three_fp32_logits() -> None:
    training = TrainingSpec(seq_length=S, micro_batch_size=B, kernels=KernelSpec(transformer_impl="torchtitan"))
    plan = ParallelPlan(dp=1)
    want = loss_tensors(MODEL, training, plan)["loss.softmax"] + loss_working_set(MODEL, training, plan)
    got = _peak()
    print(f"\nprojected {want / 2**20:.2f} MiB, measured {got / 2**20:.2f} MiB ({got / (4 * B * S * VOCAB):.3f} fp32 "
          "logits)")
    assert want == pytest.approx(got, rel=0.01)


def _loss_parallel_rank(rank: int, world: int, port: int, out: str) -> None:
    """One TP rank: TorchTitan's output layer (vocab-sharded) and loss under `loss_parallel`, the step's peak."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        x = distribute_tensor(torch.randn(B, S, HIDDEN, dtype=torch.bfloat16), mesh, [Replicate()]).requires_grad_()
        w = distribute_tensor(torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16), mesh, [Shard(0)]).requires_grad_()
        labels = torch.randint(0, VOCAB, (B, S))
        tracker = MemTracker()
        tracker.track_external(x, w)
        with tracker, loss_parallel():
            pred = F.linear(x, w)  # logits Shard(-1): this rank's vocabulary shard
            loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
            del pred
            loss.backward()
        peak = float(next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"])
        weights = x.to_local().nbytes + w.to_local().nbytes  # the inputs (their gradients come after the peak)
        with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
            fh.write(str(peak - weights))
    finally:
        dist.destroy_process_group()


def test_loss_parallel_peak(tmp_path: Any) -> None:
    """Under TP TorchTitan runs the loss with `loss_parallel` (DTensor's vocabulary-parallel log_softmax and
    nll_loss): 2 gloo ranks, each rank's peak over the loss forward and backward (less the output layer's input and
    weight shard) against the projection of tp 2."""
    from tests.oracle.spawn import free_port, require_gloo, run_spawned

    require_gloo()
    world = 2
    run_spawned(_loss_parallel_rank, (world, free_port(), str(tmp_path / "peak")), world, 300, "loss_parallel")
    measured = [float((tmp_path / f"peak.{r}").read_text()) for r in range(world)]
    training = TrainingSpec(seq_length=S, micro_batch_size=B, kernels=KernelSpec(transformer_impl="torchtitan"))
    plan = ParallelPlan(tp=world, dp=1, sp=True, tp_style="dtensor")
    want = loss_tensors(MODEL, training, plan)["loss.softmax"] + loss_working_set(MODEL, training, plan)
    local = 4 * B * S * VOCAB / world
    print(f"\nprojected {want / local:.3f} fp32 local logits, measured {[round(m / local, 3) for m in measured]}")
    for m in measured:
        assert want == pytest.approx(m, rel=0.02)
