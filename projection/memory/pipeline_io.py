"""What torch.distributed.pipelining holds on each pipeline stage besides the model's saved activations (TorchTitan's
pipelines, `ParallelPlan.schedule_style == "torch"`), read in torch 2.5-2.13 `torch/distributed/pipelining/stage.py`:

* receive buffers, allocated for every microbatch of the schedule the first time a stage runs and kept
  (`_prepare_forward_infra`: `args_recv_info[chunk]` for each of the n microbatches, a buffer from
  `_make_tensor_from_meta` each, on every stage but the first; `_prepare_backward_infra`: `grad_recv_info[mb]` the
  same on every stage but the last): n x the boundary tensor each way, persistent;
* the stage's output of each microbatch in flight (`fwd_cache[chunk] = (output_tuple, flatten_input_tensors)` from
  the forward until its backward, which passes the outputs to `stage_backward`): one boundary tensor per in-flight
  microbatch on every stage but the last, whose output (the logits) the loss keeps anyway;
* the received input of each microbatch in flight is one of those buffers: the model's saved activations count it
  again when the stage's first layer saves its input as it is (a norm saving its compute-dtype input, or an
  activation checkpoint saving the block's input), so that much per in-flight microbatch is taken back out of the
  activations; the composite eager RMSNorm saves fp32 copies instead (memory/activations.py `e_norm`), and then
  nothing is taken out.

The boundary tensor is the residual stream between two blocks: micro batch x sequence / cp x hidden in the compute
dtype, sequence-sharded by tp where TorchTitan's tensor parallelism keeps it so (its TP plan runs the residual as
Shard(1) local tensors).

Not counted: `output_chunks`, the outputs torch keeps until the step ends for the schedule to return them (every
stage up to torch 2.7, the last from 2.8, and not with `return_outputs=False` from 2.10): which torch release a job
runs is not known finely enough here (docs/performance.md).
"""

from __future__ import annotations

from projection.memory.activations import dims
from projection.specs.scenario import Scenario
from projection.workload.stages import StageSlot


def torch_pipeline(sc: Scenario) -> bool:
    """torch.distributed.pipelining runs this job's pipeline."""
    return sc.plan.schedule_style == "torch" and sc.plan.pp > 1


def boundary_bytes(sc: Scenario) -> float:
    """One microbatch's tensor across a pipeline boundary (module docstring)."""
    D = dims(sc.model, sc.training, sc.plan)
    return D.e * D.T * D.h * D.r


def in_flight_io_bytes(sc: Scenario, slot: StageSlot, n_stages: int) -> float:
    """Bytes per in-flight microbatch on `slot` beyond its saved activations: the output fwd_cache holds (not on the
    last stage), less the received input the activations already count (not on the first stage; where the first
    layer saves its input as it is). May be negative on the last stage."""
    if not torch_pipeline(sc):
        return 0.0
    b = boundary_bytes(sc)
    D = dims(sc.model, sc.training, sc.plan)
    saves_input = D.e_norm == D.e or sc.plan.recompute.granularity != "none"
    held = b if slot.stage < n_stages - 1 else 0.0
    counted = b if slot.stage > 0 and saves_input and slot.layers else 0.0
    return held - counted


def receive_buffer_bytes(sc: Scenario, slots: list[StageSlot], n_stages: int, n_microbatches: int) -> float:
    """Persistent receive buffers of a rank's stages: n microbatches x the boundary tensor for inputs on every stage
    but the first and for gradients on every stage but the last."""
    if not torch_pipeline(sc):
        return 0.0
    sides = sum((s.stage > 0) + (s.stage < n_stages - 1) for s in slots)
    return sides * n_microbatches * boundary_bytes(sc)
