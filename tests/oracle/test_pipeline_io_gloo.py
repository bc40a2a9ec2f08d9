"""What torch.distributed.pipelining holds beside the model's activations (memory/pipeline_io.py), counted on a real
pipeline: 2 gloo processes each hold one PipelineStage (a Linear block) of a Schedule1F1B step over 4 microbatches
of 2 x 16 x 32 fp32 rows; after each forward the stage's `fwd_cache` is counted, and after the step the tensors its
receive-information lists keep.

Against projection, for the same pipeline written as a scenario (TorchTitan's runtime, fp32, pp 2, 4 microbatches):
* the persistent receive buffers of each rank equal `receive_buffer_bytes` (4 input buffers on the second stage,
  4 gradient buffers on the first, each one boundary tensor of `boundary_bytes`);
* the outputs `fwd_cache` holds peak at the in-flight count projection's schedule gives (2 on the first rank, 1 on
  the last), each the stage's output: a boundary tensor, and on the last stage (which ends in an output layer) its
  logits, as `in_flight_io_bytes` prices them;
* the second stage's module runs on its receive buffers themselves (the same storage), which is why the activations
  a stage saves of its input are not counted twice (`in_flight_io_bytes`);
* the outputs the stage holds after each forward and backward (fwd_cache's and `output_chunks`', each storage once)
  equal projection's in-flight count x the held output plus its finished count (schedule/inflight.py
  done_matrices) x `kept_output_bytes`: torch 2.13 keeps the last stage's logits to the step's end, nothing on
  the first; the merged output `step()` returns is `merge_copy_bytes`; a second step with
  `return_outputs=False` keeps nothing (`pipeline_outputs_kept` "none").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from projection.memory.pipeline_io import (  # noqa: E402
    boundary_bytes,
    in_flight_io_bytes,
    kept_output_bytes,
    merge_copy_bytes,
    receive_buffer_bytes,
)
from projection.schedule.basic import one_f_one_b  # noqa: E402
from projection.schedule.inflight import done_matrices, inflight_matrices, peak_inflight_total  # noqa: E402
from projection.specs.hardware import ClusterSpec, load_device  # noqa: E402
from projection.specs.model import ModelSpec  # noqa: E402
from projection.specs.plan import ParallelPlan  # noqa: E402
from projection.specs.scenario import Scenario  # noqa: E402
from projection.specs.training import TrainingSpec  # noqa: E402
from projection.workload.stages import split_stages  # noqa: E402
from tests.oracle.spawn import free_port, require_gloo, run_spawned  # noqa: E402

require_gloo()
PP, N_MB, ROWS, SEQ, HIDDEN, VOCAB = 2, 4, 2, 16, 32, 128

pytestmark = pytest.mark.slow


def _worker(rank: int, port: int, out: str) -> None:
    from torch import nn
    from torch.distributed import pipelining

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=PP)
    torch.manual_seed(0)
    # the last stage ends in the output layer: its output is the logits
    layers = [nn.Linear(HIDDEN, HIDDEN), nn.GELU()] + ([nn.Linear(HIDDEN, VOCAB)] if rank == PP - 1 else [])
    stage = pipelining.PipelineStage(nn.Sequential(*layers), rank, PP, torch.device("cpu"))
    held: list[int] = []
    seen_inputs: list[int] = []  # the storage each step forward's module input lives in (not shape inference's)
    stepping = [False]
    stage.submod.register_forward_pre_hook(
        lambda _m, inp: seen_inputs.append(inp[0].untyped_storage().data_ptr()) if stepping[0] else None)
    fwd = stage.forward_one_chunk

    def forward(mb: int, *a: Any, **k: Any) -> Any:
        stepping[0] = True
        result = fwd(mb, *a, **k)
        stepping[0] = False
        held.append(sum(sum(t.numel() * t.element_size() for t in outs if isinstance(t, torch.Tensor))
                        for outs, _ in stage.fwd_cache.values()))
        return result

    def outputs_held() -> int:  # fwd_cache's outputs and output_chunks, each storage once
        seen: dict[int, int] = {}
        tensors = [t for outs, _ in stage.fwd_cache.values() for t in outs if isinstance(t, torch.Tensor)]
        for t in tensors + [t for t in stage.output_chunks if isinstance(t, torch.Tensor)]:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(seen.values())

    timeline: list[int] = []  # after each forward and backward, in the order the schedule runs them
    bwd = stage.backward_one_chunk

    def forward_and_count(mb: int, *a: Any, **k: Any) -> Any:
        result = forward(mb, *a, **k)
        timeline.append(outputs_held())
        return result

    def backward(mb: int, *a: Any, **k: Any) -> Any:
        result = bwd(mb, *a, **k)
        timeline.append(outputs_held())
        return result

    stage.forward_one_chunk = forward_and_count  # type: ignore[method-assign]
    stage.backward_one_chunk = backward  # type: ignore[method-assign]
    sched = pipelining.Schedule1F1B(stage, N_MB, loss_fn=lambda y, t: ((y - t) ** 2).mean())
    x, y = torch.randn(N_MB * ROWS, SEQ, HIDDEN), torch.randn(N_MB * ROWS, SEQ, VOCAB)
    merged = sched.step(x) if rank == 0 else sched.step(target=y, losses=[])
    merged_bytes = merged.untyped_storage().nbytes() if isinstance(merged, torch.Tensor) else 0
    kept_at_end = outputs_held()
    first_step = list(timeline)

    def buffers(infos: Any) -> dict[int, int]:
        seen: dict[int, int] = {}
        for per_mb in infos.values():
            for info in per_mb:
                buf = getattr(info, "buffer", None)
                if isinstance(buf, torch.Tensor):
                    seen[buf.untyped_storage().data_ptr()] = buf.numel() * buf.element_size()
        return seen

    inputs = buffers(stage.args_recv_info)
    Path(f"{out}.{rank}").write_text(json.dumps({
        "recv": sum(inputs.values()) + sum(buffers(stage.grad_recv_info).values()), "fwd_cache_peak": max(held),
        # a received input is the buffer itself (no copy): what the stage's first layer saves of it is that memory
        "inputs_are_buffers": len(seen_inputs) == N_MB and all(ptr in inputs for ptr in seen_inputs)}))
    result = {"timeline": first_step, "kept_at_end": kept_at_end, "merged": merged_bytes}
    if rank == 0:  # the second step, with return_outputs=False, keeps nothing to return
        sched.step(x, return_outputs=False)
    else:
        sched.step(target=y, losses=[], return_outputs=False)
    result["kept_without_return"] = outputs_held()
    Path(f"{out}.{rank}.kept").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _scenario(kept: str = "last_stage") -> Scenario:
    model = ModelSpec(num_layers=2, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=4 * HIDDEN,
                      vocab_size=VOCAB)
    training = TrainingSpec(seq_length=SEQ, micro_batch_size=ROWS, global_batch_size=N_MB * ROWS,
                            params_dtype="fp32")
    plan = ParallelPlan(pp=PP, dp=1, schedule="1f1b", schedule_style="torch", pipeline_outputs_kept=kept)
    return Scenario(model=model, training=training, plan=plan,
                    cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=1, gpus_per_node=PP))


def test_receive_buffers_and_held_outputs(tmp_path: Path) -> None:
    out = str(tmp_path / "io")
    run_spawned(_worker, (free_port(), out), PP, 60.0, "pipeline buffers")
    got = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(PP)]
    sc = _scenario()
    slots = split_stages(sc.model, sc.plan)
    b = boundary_bytes(sc)
    assert b == ROWS * SEQ * HIDDEN * 4
    for r in range(PP):
        mine = [s for s in slots if s.pp_rank == r]
        assert got[r]["recv"] == receive_buffer_bytes(sc, mine, len(slots), N_MB), (r, got[r])
    # the outputs held while in flight, at each rank's peak in-flight count: boundary tensors on the first stage,
    # logits on the last, as in_flight_io_bytes prices them per microbatch
    peaks = peak_inflight_total(one_f_one_b(PP, N_MB))
    for r, slot in enumerate(slots):
        held, _ = in_flight_io_bytes(sc, slot, len(slots))
        assert got[r]["fwd_cache_peak"] == peaks[r] * held, (r, got[r]["fwd_cache_peak"], peaks[r], held)
    assert in_flight_io_bytes(sc, slots[-1], len(slots))[0] == ROWS * SEQ * VOCAB * 4
    # the second stage computes on its receive buffers, so the activations it saves of its input are those buffers
    assert got[1]["inputs_are_buffers"]

    # torch 2.13 keeps the last stage's outputs for step() to return (output_chunks): the outputs held after each
    # forward and backward are the in-flight ones plus the finished ones kept, as projection counts them
    sched = one_f_one_b(PP, N_MB)
    for r, slot in enumerate(slots):
        kept = json.loads(Path(f"{out}.{r}.kept").read_text())
        held, _ = in_flight_io_bytes(sc, slot, len(slots))
        per_done = kept_output_bytes(sc, slot, len(slots))
        (_, live), (_, done) = inflight_matrices(sched)[r], done_matrices(sched)[r]
        assert kept["timeline"] == [int(a * held + d * per_done) for a, d in zip(live[:, 0], done[:, 0], strict=True)]
        assert kept["kept_at_end"] == N_MB * per_done
        assert kept["merged"] == merge_copy_bytes(sc, [slot], len(slots), N_MB)
        assert kept["kept_without_return"] == N_MB * kept_output_bytes(_scenario("none"), slot, len(slots)) == 0
    assert kept_output_bytes(sc, slots[0], len(slots)) == 0  # from torch 2.8 the first stage keeps nothing
    assert kept_output_bytes(_scenario("every_stage"), slots[0], len(slots)) == boundary_bytes(sc)
