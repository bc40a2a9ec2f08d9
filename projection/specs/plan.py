"""ParallelPlan: how one training job is laid out over ranks.

Dense grid: world = tp * cp * dp * pp. MoE grid (Megatron "parallel folding"): world = etp * ep * edp * pp.
`dp=None` means "whatever is left of the world" and is resolved against a cluster by `resolve_dp`.
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from projection.specs.base import Spec

ScheduleName = Literal["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zbv", "v_half", "v_min", "dualpipe",
                       "dualpipev"]


RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "layernorm", "mla_up_proj", "shared_experts", "op")


PipelineRuntime = Literal["actions", "lockstep", "megatron"]
# the schedules Megatron-LM's schedules.py runs (get_forward_backward_func): 1F1B, interleaved with a virtual pipeline
MEGATRON_SCHEDULES = ("1f1b", "interleaved_1f1b")


def torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch release as torch.__version__ prints it ("2.9", "2.7.0a0+git1963fc8",
    "2.10.0+rocm7.0"); None when the text is not a torch version."""
    m = re.fullmatch(r"v?(\d{1,3})\.(\d{1,3})(?:[.+a-z][0-9A-Za-z.+_-]*)?", version.strip())
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def torch_pipeline_runtime(version: str) -> PipelineRuntime | None:
    """How torch release `version` runs multi-stage pipeline schedules: "lockstep" up to 2.9
    (ScheduleInterleaved1F1B on PipelineScheduleMulti's time steps), "actions" from 2.10 (_PipelineScheduleRuntime);
    None when the text is not a torch version."""
    release = torch_release(version)
    if release is None:
        return None
    return "lockstep" if release < (2, 10) else "actions"


PipelineOutputsKept = Literal["every_stage", "last_stage", "none"]


def torch_pipeline_outputs_kept(version: str) -> PipelineOutputsKept | None:
    """Which stages of torch release `version` keep every microbatch's output in `output_chunks` until the next
    step (ParallelPlan.pipeline_outputs_kept): every stage up to 2.7 (`PipelineStage.forward_one_chunk` appends each
    output unconditionally), the last stage from 2.8 (`if self.is_last`); None when the text is not a version."""
    release = torch_release(version)
    if release is None:
        return None
    return "every_stage" if release < (2, 8) else "last_stage"


class RecomputeSpec(Spec):
    """Activation recomputation. granularity full: whole layers (method uniform/block with num_layers, or an explicit
    list of global layer ids). selective: only `modules` (Megatron names: core_attn, mlp, moe, moe_act, layernorm,
    mla_up_proj, shared_experts) or TorchTitan 'op' (per-op SAC) / every-Nth-layer ('layer:N')."""

    granularity: Literal["none", "full", "selective"] = "none"
    method: Literal["uniform", "block"] | None = None
    num_layers: int | None = Field(None, ge=0)
    layer_ids: tuple[int, ...] | None = None
    modules: tuple[str, ...] = ()
    distribute_saved_activations: bool = False

    @model_validator(mode="before")
    @classmethod
    def _selective_default(cls, data: Any) -> Any:
        """selective without modules recomputes Megatron's default `--recompute-modules`, core_attn (arguments.py),
        as a Megatron file resolves it; an empty list would recompute nothing, silently."""
        if isinstance(data, dict) and data.get("granularity") == "selective" and not data.get("modules"):
            return {**data, "modules": ("core_attn",)}
        return data

    @field_validator("modules")
    @classmethod
    def _known_modules(cls, modules: tuple[str, ...]) -> tuple[str, ...]:
        """Megatron's --recompute-modules choices (megatron/training/arguments.py), TorchTitan's 'op', or 'layer:N'
        with N >= 1 (TorchTitan selective_ac_option: every N-th block); anything else is refused, as Megatron does."""
        for m in modules:
            n = m[6:] if m.startswith("layer:") else None
            if m not in RECOMPUTE_MODULES and not (n is not None and n.isdecimal() and int(n) >= 1):
                raise ValueError(f"unknown recompute module {m!r}: use {', '.join(RECOMPUTE_MODULES)} or 'layer:N' "
                                 "(N >= 1)")
        return modules

    def every_nth_checkpoints(self, layer_index: int) -> bool:
        """Whether a 'layer:N' module checkpoints decoder layer `layer_index` whole: every N-th block, counted from 1
        as TorchTitan's apply_ac wrap counter does ((i + 1) % N == 0). The one place the memory estimate and the op
        list read this rule from."""
        return any((layer_index + 1) % int(m[6:]) == 0 for m in self.modules if m.startswith("layer:"))


class OffloadSpec(Spec):
    """CPU offload. optimizer_fraction: share of the optimizer state and master params kept on the CPU."""

    optimizer: bool = False
    optimizer_fraction: float = Field(1.0, ge=0.0, le=1.0)
    activation_layers: int = Field(0, ge=0)
    fsdp_params: bool = Field(False, description="TorchTitan enable_cpu_offload: params, grads and optimizer state")
    activation_modules: tuple[str, ...] = Field((), description="Megatron --fine-grained-activation-offloading "
                                                "--offload-modules: module inputs/outputs moved to the CPU")


class OverlapSpec(Spec):
    grad_reduce: bool = False
    align_grad_reduce: bool = True
    """Megatron's align_grad_reduce (on unless --no-align-grad-reduce): under the interleaved schedule a model chunk's
    gradient reduction is launched whole, from the backward of virtual microbatch (its last + pp rank), so that the
    ranks launch together (schedules.py backward_step_helper_postprocess, config.grad_sync_func)."""
    param_gather: bool = False
    tp_comm: bool = False
    ep_comm: bool = False
    p2p_comm: bool = True


class ShardingSpec(Spec):
    """Data-parallel sharding. zero_stage: 0 plain DDP, 1 optimizer state (Megatron distributed optimizer),
    2 + gradients, 3 + parameters (FSDP full shard). fsdp names the implementation when zero_stage is 3."""

    zero_stage: Literal[0, 1, 2, 3] = 0
    fsdp: Literal["none", "torch_fsdp2", "megatron_fsdp"] = "none"
    reshard_after_forward: bool = True
    dp_replicate: int = Field(1, gt=0, description="HSDP replicas: shards live inside dp / dp_replicate ranks")
    distributed_optimizer_instances: int = Field(1, gt=0)


def schedule_run(pp: int, schedule: str) -> str:
    """The schedule a job with `pp` pipeline ranks runs when `schedule` is named: without a pipeline (pp 1) every
    framework runs the microbatches one after another (Megatron's forward_backward_no_pipelining; TorchTitan builds
    no pipeline schedule), i.e. 1f1b whatever the name. The one place this rule lives."""
    return "1f1b" if pp == 1 else schedule


class ParallelPlan(Spec):
    tp: int = Field(1, gt=0)
    sp: bool = False
    pp: int = Field(1, gt=0)
    vpp: int | None = Field(None, gt=0, description="virtual chunks per pipeline rank (None = 1)")
    pipeline_layout: str | None = Field(None, description="Megatron --pipeline-model-parallel-layout")
    first_stage_layers: int | None = Field(None, ge=0)
    last_stage_layers: int | None = Field(None, ge=0)
    stage_layers: tuple[int, ...] | None = Field(None, description="explicit decoder layers per pipeline stage "
                                                 "(pp*vpp entries, stage-major: chunk 0 of every rank first)")
    account_for_embedding: bool = False
    account_for_loss: bool = False
    dp: int | None = Field(None, gt=0)
    cp: int = Field(1, gt=0)
    cp_comm: str = Field("p2p", description="how context parallelism exchanges K/V: Megatron's --cp-comm-type "
                         "(p2p, all_gather, a2a, a2a+p2p; in a native scenario one per decoder layer, "
                         "space-separated, when it differs by layer: Megatron-Core cannot run a list), TorchTitan's "
                         "context_parallel_rotate_method (allgather -> all_gather; alltoall -> p2p, a ring of "
                         "all-to-all steps); each priced as it runs (workload/ops_attention.py)")
    cp_hierarchy: tuple[Annotated[int, Field(gt=0)], ...] | None = Field(
        None, description="Megatron's --hierarchical-context-parallel-sizes: the cp group split into levels, the "
        "first the all-to-all group (consecutive cp ranks), the second the p2p ring, for cp_comm a2a+p2p")
    ep: int = Field(1, gt=0)
    etp: int | None = Field(None, gt=0, description="None = tp (Megatron default)")
    sharding: ShardingSpec = ShardingSpec()
    recompute: RecomputeSpec = RecomputeSpec()
    offload: OffloadSpec = OffloadSpec()
    overlap: OverlapSpec = OverlapSpec()
    schedule: ScheduleName = "1f1b"
    microbatch_group_size: int | None = Field(None, gt=0)
    schedule_style: Literal["megatron", "torch"] = "megatron"
    """Whose pipeline ordering and rules the schedule follows: Megatron-LM's (and Primus's), or
    torch.distributed.pipelining's (TorchTitan): interleaved 1F1B rounds and their microbatch rules differ."""
    pipeline_runtime: PipelineRuntime = "actions"
    """How torch.distributed.pipelining runs a multi-stage schedule (schedule_style "torch": interleaved_1f1b, zbv,
    gpipe with vpp > 1):
    "actions", torch 2.10+ (`_PipelineScheduleRuntime`: each receive waited for just before the pass that needs it);
    "lockstep", torch up to 2.9 (`PipelineScheduleMulti._step_microbatches`: every time step ends in a blocking batch
    of sends and receives with the neighbours, sim/lockstep.py). The CLI's --pytorch VERSION sets it.
    "megatron": Megatron-LM's own schedules.py (the Megatron, Primus and Bridge loaders set it with a pipeline, except
    under Primus's pipeline patches): 1F1B, and interleaved 1F1B without overlap.p2p_comm, make blocking batched p2p
    calls; with overlap.p2p_comm the interleaved steady state posts its sends and receives and waits each receive
    just before the pass that needs it (megatron_pipeline, schedule/megatron_calls.py, sim/p2p_walk.py)."""
    pipeline_outputs_kept: PipelineOutputsKept = "last_stage"
    """What torch.distributed.pipelining (schedule_style "torch") keeps in `output_chunks`, every microbatch's
    stage output from its forward until the next step begins, so that `step()` can return the last stage's outputs
    merged (one torch.cat of them, made at the step's end): "every_stage" up to torch 2.7, "last_stage" (its logits)
    from 2.8 (the CLI's --pytorch VERSION sets the two), "none" where the trainer calls `step(...,
    return_outputs=False)` (torch 2.10+; TorchTitan's TOML-era trainers do not), memory/pipeline_io.py."""
    p2p_scatter_gather: bool = False
    """Megatron-LM before Megatron-Core (2021-22 code: `--scatter-gather-tensors-in-pipeline`, its default, off with
    sequence parallelism; Narayanan et al. 2021 §4.1): with tp > 1 each pipeline p2p tensor is split into tp chunks,
    each TP rank sends one over its own link, and the receiver all-gathers them over TP. Megatron-Core dropped it (the
    argument is still parsed and unused), so no loader sets it."""
    rank_order: Literal["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"] = "tp-cp-ep-dp-pp"
    """Megatron's rank order, innermost first: tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping (megatron/training/
    initialize.py), which puts the pipeline inside data parallelism (and so DP, not PP, across nodes first)."""
    tp_style: Literal["megatron", "dtensor"] = "megatron"
    """How sequence-parallel TP feeds a column-parallel linear. megatron: the linear saves its sequence-sharded input
    and re-gathers it for the weight gradient (Korthikanti et al. 2022 §4.2.2). dtensor (TorchTitan:
    PrepareModuleInput Shard(1) -> Replicate before ColwiseParallel): the gathered, full-sequence input is what
    autograd saves, and backward needs no re-gather."""

    @model_validator(mode="before")
    @classmethod
    def _no_pipeline_no_schedule(cls, data: Any) -> Any:
        """The named schedule as it runs (schedule_run): 1f1b at pp 1."""
        if isinstance(data, dict) and data.get("schedule") in typing.get_args(ScheduleName):  # unknown: refused
            return {**data, "schedule": schedule_run(data.get("pp", 1), data["schedule"])}
        return data

    def runs_as(self, schedule: str) -> str:
        """The schedule `schedule` runs as on this plan's pipeline (schedule_run)."""
        return schedule_run(self.pp, schedule)

    @property
    def pipelined_fsdp(self) -> bool:
        """FSDP2 inside torch.distributed.pipelining stages (TorchTitan with pp > 1): the stage turns gradient sync
        and reshard-after-backward off for every backward but the step's last (`backward_maybe_with_nosync`), then
        runs every unit's post-backward (reduce-scatter, reshard) once; without reshard after forward (TorchTitan's
        default under PP) each unit is all-gathered once, by its first forward."""
        return self.sharding.zero_stage == 3 and self.sharding.fsdp == "torch_fsdp2" and self.pp > 1 \
            and self.schedule_style == "torch"

    @property
    def lockstep_pipeline(self) -> bool:
        """A multi-stage schedule as torch up to 2.9 runs it, in lock-step time steps (pipeline_runtime):
        interleaved 1F1B, looped breadth-first (gpipe with vpp > 1) and ZB-V (schedule/timesteps.py)."""
        return self.schedule_style == "torch" and self.pipeline_runtime == "lockstep" and self.pp > 1 and (
            self.schedule in ("interleaved_1f1b", "zbv") or (self.schedule == "gpipe" and self.vpp_ > 1))

    @property
    def megatron_pipeline(self) -> bool:
        """Megatron-LM's schedules.py runs the pipeline (pipeline_runtime "megatron"): 1F1B, or interleaved 1F1B with
        its p2p overlapped or not (`megatron_p2p_overlap`)."""
        return self.pipeline_runtime == "megatron" and self.schedule_style == "megatron" and self.pp > 1 and \
            self.schedule in MEGATRON_SCHEDULES

    @property
    def megatron_lacks_schedule(self) -> bool:
        """Megatron-LM's runtime would run a pipeline schedule its schedules.py does not have (refused at load,
        specs/validate_schedule.py)."""
        return self.pipeline_runtime == "megatron" and self.pp > 1 and self.schedule not in MEGATRON_SCHEDULES

    @property
    def megatron_p2p_overlap(self) -> bool:
        """--overlap-p2p-communication in effect: the interleaved schedule with a virtual pipeline only (Megatron
        refuses it for 1F1B, and its loader drops it without a virtual pipeline)."""
        return self.overlap.p2p_comm and self.schedule == "interleaved_1f1b" and self.vpp_ > 1

    @property
    def megatron_combined_1f1b(self) -> bool:
        """Megatron-Core's combined 1F1B: its interleaved schedule (schedules.py, not Primus's own pipeline) under the
        expert-parallel overlap (overlap_moe_expert_parallel_comm), one more warm-up forward per rank."""
        return self.overlap.ep_comm and self.megatron_pipeline and self.vpp_ > 1 and self.schedule == "interleaved_1f1b"

    @property
    def torch_1f1b_pipeline(self) -> bool:
        """torch.distributed.pipelining's Schedule1F1B (one stage per rank, every torch release): its p2p batches
        are waited, fused around each backward (schedule/torch_calls.py, sim/p2p_walk.py)."""
        return self.schedule_style == "torch" and self.schedule == "1f1b" and self.pp > 1

    @property
    def p2p_scattered(self) -> bool:
        """Pipeline p2p tensors sent as tp chunks and all-gathered over TP (p2p_scatter_gather; not with SP, whose
        tensor is already split)."""
        return self.p2p_scatter_gather and self.tp > 1 and not self.sp_

    @model_validator(mode="after")
    def _check(self) -> ParallelPlan:
        given = [x for x in (self.pipeline_layout, self.stage_layers) if x is not None]
        if len(given) > 1:
            raise ValueError("give at most one of pipeline_layout and stage_layers")
        return self

    @property
    def cp_levels(self) -> tuple[int, int] | None:
        """The hierarchical cp split (all-to-all group, ring) where it is one: two levels whose product is cp (the
        layout rules refuse any other, specs/validate_kernels.py); None without one."""
        h = self.cp_hierarchy
        return (h[0], h[1]) if h is not None and len(h) == 2 and h[0] * h[1] == self.cp else None

    @property
    def vpp_(self) -> int:
        return self.vpp or 1

    @property
    def etp_(self) -> int:
        return self.etp or self.tp

    @property
    def sp_(self) -> bool:
        """Megatron turns sequence parallelism off silently at TP = 1."""
        return self.sp and self.tp > 1

    @property
    def model_parallel(self) -> int:
        return self.tp * self.cp * self.pp

    def dp_(self) -> int:
        if self.dp is None:
            raise ValueError("dp is not resolved: call resolve_dp(plan, world_size) first")
        return self.dp

    def edp(self) -> int:
        """Expert-data-parallel size: world / (etp * ep * pp)."""
        return (self.tp * self.cp * self.dp_()) // (self.etp_ * self.ep)
