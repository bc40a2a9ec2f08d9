"""What torch.distributed.pipelining holds on each pipeline stage besides the model's saved activations (TorchTitan's
pipelines, `ParallelPlan.schedule_style == "torch"`), read in torch 2.5-2.13 `torch/distributed/pipelining/stage.py`:

* receive buffers, allocated for every microbatch of the schedule the first time a stage runs and kept
  (`_prepare_forward_infra`: `args_recv_info[chunk]` for each of the n microbatches, a buffer from
  `_make_tensor_from_meta` each, on every stage but the first; `_prepare_backward_infra`: `grad_recv_info[mb]` the
  same on every stage but the last): n x the boundary tensor each way, persistent;
* the stage's output of each microbatch in flight (`fwd_cache[chunk] = (output_tuple, flatten_input_tensors)` from
  the forward until its backward, which passes the outputs to `stage_backward`): one boundary tensor per in-flight
  microbatch, or on the last stage its logits, which the loss's saved tensors (fp32) do not include; none where the
  next stage is on the same rank (V schedules: `set_local_fwd_input` hands the output over as that stage's input);
* the received input of each microbatch in flight is one of those buffers: the model's saved activations count it
  again when the stage's first layer saves its input as it is (a norm saving its compute-dtype input, or an
  activation checkpoint saving the block's input), so that much per in-flight microbatch is taken back out of the
  activations; the composite eager RMSNorm saves fp32 copies instead (memory/activations.py `e_norm`), and then
  nothing is taken out.

The boundary tensor is the residual stream between two blocks: micro batch x sequence / cp x hidden in the compute
dtype, sequence-sharded by tp where TorchTitan's tensor parallelism keeps it so (its TP plan runs the residual as
Shard(1) local tensors).

Up to torch 2.9 the gradient each input received stays on its receive buffer until the next step
(`kept_input_grad_bytes`).

`output_chunks` (`ParallelPlan.pipeline_outputs_kept`): `forward_one_chunk` also appends each microbatch's output
to `output_chunks`, which only the next `step()`'s `clear_runtime_states` empties, so the schedule can return the
last stage's outputs (`_merge_outputs`, a `torch.cat` of them, made when the step's last backward is done; TorchTitan
drops the result at once). Every stage up to torch 2.7, the last stage (its logits) from 2.8, none under
`step(..., return_outputs=False)` (torch 2.10+). In flight an output is the fwd_cache's own tensor (counted above);
after its backward it is held for `output_chunks` (`kept_output_bytes` per finished microbatch; under a split
backward a stage's `backward_state` also holds it until W, the same storage): through the rest of the step, the
merge once `_step_microbatches` returns (all of them and their concatenated copy on the last stage,
`merge_copy_bytes`) and the optimizer step. Where a V schedule hands an output to the same rank's next stage under
the 2.10+ runtime, the kept output is that stage's receive buffer, counted there. TorchTitan's DualPipeV with
expert-parallel overlap runs its overlapped forwards through a callback that keeps their outputs even under
`return_outputs=False`; that is not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from projection.memory.activations import Dims, dims, recomputed_layers
from projection.specs.accumulation import schedule_microbatches
from projection.specs.scenario import Scenario
from projection.workload.stages import StageSlot

if TYPE_CHECKING:
    from projection.schedule.inflight import Matrices


def torch_pipeline(sc: Scenario) -> bool:
    """torch.distributed.pipelining runs this job's pipeline."""
    return sc.plan.schedule_style == "torch" and sc.plan.pp > 1


def boundary_bytes(sc: Scenario, D: Dims | None = None) -> float:
    """One microbatch's tensor across a pipeline boundary (module docstring); `D`: the scenario's dims, if at hand."""
    D = D or dims(sc.model, sc.training, sc.plan)
    return D.e * D.T * D.h * D.r


def in_flight_io_bytes(sc: Scenario, slot: StageSlot, n_stages: int, same_rank_next: bool = False,
                       same_rank_prev: bool = False) -> tuple[float, float]:
    """(held, counted) bytes per in-flight microbatch on `slot`: the output fwd_cache holds beyond the saved
    activations (a boundary tensor; on the last stage the logits, e x tokens x vocab / tp, which the loss's saved
    tensors do not include; none where the next stage is on the same rank, as in a V schedule, whose receive
    buffer it replaces), and the received input the first layer's saved activations already count (a receive
    buffer, counted persistently: 0 on the first stage, where the first layer does not save its input as it is, or
    where the previous stage is on the same rank and hands its output over instead)."""
    if not torch_pipeline(sc):
        return 0.0, 0.0
    m, p = sc.model, sc.plan
    D = dims(m, sc.training, p)
    b = boundary_bytes(sc, D)
    if slot.stage == n_stages - 1:
        held = D.e * D.T * m.padded_vocab(p.tp) / D.t if slot.loss else 0.0
    else:
        held = 0.0 if same_rank_next else b
    counted = b if slot.stage > 0 and not same_rank_prev and slot.layers and saves_its_input(sc, slot, D) else 0.0
    return held, counted


def saves_its_input(sc: Scenario, slot: StageSlot, D: Dims | None = None) -> bool:
    """Whether the stage's first layer keeps its input tensor itself for backward: a checkpointed layer (its input
    is what the checkpoint saves), or a norm that saves its compute-dtype input (a fused or compiled norm; the
    composite eager RMSNorm saves fp32 copies, which in fp32 training are the input itself)."""
    p = sc.plan
    D = D or dims(sc.model, sc.training, p)
    first = slot.layers[0]
    if D.e_norm == D.e or D.e == 4 or first in recomputed_layers(p, slot.layers):
        return True
    r = p.recompute
    return r.granularity == "selective" and any(
        mod == "op" or (mod.startswith("layer:") and r.every_nth_checkpoints(first)) for mod in r.modules)


def receive_buffer_bytes(sc: Scenario, slots: list[StageSlot], n_stages: int, n_microbatches: int) -> float:
    """Persistent receive buffers of a rank's stages: n microbatches x the boundary tensor for inputs on every stage
    but the first and for gradients on every stage but the last."""
    if not torch_pipeline(sc):
        return 0.0
    sides = sum((s.stage > 0) + (s.stage < n_stages - 1) for s in slots)
    return sides * n_microbatches * boundary_bytes(sc)


def kept_input_grad_bytes(sc: Scenario, slots: list[StageSlot], n_microbatches: int) -> float:
    """Up to torch 2.9 (`pipeline_runtime` "lockstep", the --pytorch releases before 2.10) `stage_backward` left each
    input's gradient on its receive buffer's `.grad` until the next step (torch PR #164329 clears it from 2.10): n
    gradients of the boundary tensor on every stage but the first, through the optimizer step."""
    if not torch_pipeline(sc) or sc.plan.pipeline_runtime != "lockstep":
        return 0.0
    return sum(s.stage > 0 for s in slots) * n_microbatches * boundary_bytes(sc)


def kept_output_bytes(sc: Scenario, slot: StageSlot, n_stages: int, same_rank_next: bool = False) -> float:
    """Bytes `output_chunks` keeps of one finished microbatch of `slot` (module docstring): its logits on the last
    stage (as held in flight), a boundary tensor on the others up to torch 2.7, nothing under
    return_outputs=False. Not where the next stage is on the same rank under the 2.10+ runtime: `set_local_fwd_input`
    makes the kept output that stage's receive buffer, counted with the buffers."""
    kept = sc.plan.pipeline_outputs_kept
    if not torch_pipeline(sc) or kept == "none":
        return 0.0
    if slot.stage == n_stages - 1:
        D = dims(sc.model, sc.training, sc.plan)
        return D.e * D.T * sc.model.padded_vocab(sc.plan.tp) / D.t if slot.loss else boundary_bytes(sc, D)
    if same_rank_next and sc.plan.pipeline_runtime == "actions":
        return 0.0
    return boundary_bytes(sc) if kept == "every_stage" else 0.0


def kept_output_weights(sc: Scenario, slots: Sequence[StageSlot]) -> dict[int, float]:
    """kept_output_bytes of every stage, by stage."""
    n = len(slots)
    return {s.stage: kept_output_bytes(sc, s, n, s.stage + 1 < n and slots[s.stage + 1].pp_rank == s.pp_rank)
            for s in slots}


def merge_copy_bytes(sc: Scenario, slots: list[StageSlot], n_stages: int, n_microbatches: int) -> float:
    """The last stage's `_merge_outputs` at the end of its step: one torch.cat of its n kept outputs, a second
    copy of them beside `output_chunks` (merge_chunks concatenates along the batch dimension)."""
    return sum(n_microbatches * kept_output_bytes(sc, s, n_stages) for s in slots if s.stage == n_stages - 1)


def finished_matrices(sc: Scenario) -> Matrices:
    """Per rank, the plan's schedule's finished-microbatch counts per stage after each compute action
    (schedule/inflight.py done_matrices), cached by the schedule's shape."""
    p = sc.plan
    return _finished(p.schedule, p.pp, schedule_microbatches(sc), p.vpp_, p.microbatch_group_size, p.schedule_style,
                     p.megatron_combined_1f1b)


@lru_cache(maxsize=256)
def _finished(name: str, pp: int, n_micro: int, vpp: int, group: int | None, style: Literal["megatron", "torch"],
              combined: bool) -> Matrices:
    from projection.schedule.inflight import done_matrices
    from projection.schedule.registry import build_schedule

    return done_matrices(build_schedule(name, pp, n_micro, vpp, microbatch_group_size=group, style=style,
                                        combined_1f1b=combined))
