"""`Projection`: what `project` returns, and the per-rank breakdown of the step.

Conventions, stated once:
- step_time_s: the simulated pipeline (compute, pipeline p2p, data-parallel gradient tails on the comm streams) plus
  the slowest rank's optimizer step and exposed parameter all-gather (ranks wait for each other at the
  gradient-norm all-reduce).
- tokens_per_s_per_gpu = global batch x seq length / step time / world size.
- model FLOPs: Megatron-LM's model-FLOPs formula (num_floating_point_operations: every GEMM three times at 2 FLOP
  per multiply-accumulate, attention over the full s x s matrix, logits, no recompute), generalised per layer by
  projection.workload.model_flops.model_flops_per_step (GQA, gated MLP, MoE top-k + shared experts, MLA, MTP); for
  GPT it is F72 = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) of validation-public.md §0.2.
- MFU = model FLOPs / (step time x world x peak), peak = the device's dense datasheet FLOP/s for the params dtype
  (bf16 / fp16; fp32: TF32 where the device has it, else FP32), the fp8 peak when fp8 is on.
- hardware FLOPs = model FLOPs + the recomputed forward FLOPs (activation recomputation, attention counted like the
  formula), HFU likewise (Korthikanti et al. 2022).
- breakdown_s: one pipeline rank's step (the busiest; `breakdown_rank`), summing to step_time_s: compute by op class
  (compute.gemm, compute.grouped_gemm, compute.attention, compute.memory_bound), recompute, exposed communication by
  group (comm.tp, comm.cp, comm.ep incl. expert-TP, comm.pp, comm.dp incl. FSDP and the parameter all-gather),
  offload (exposed host-link copies of offloaded activations), bubble (idle, including waiting for slower ranks),
  optimizer and overhead (GPU idle while the host issues kernels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from projection.errors import count_of
from projection.frozen import frozen_fields
from projection.memory.report import MemoryReport
from projection.perf.dp import DPComm
from projection.perf.pricing import PricedStages
from projection.sim.result import SimResult
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.workload.model_flops import model_flops_per_step

BREAKDOWN_KEYS = ("compute.gemm", "compute.grouped_gemm", "compute.attention", "compute.memory_bound", "recompute",
                  "comm.tp", "comm.cp", "comm.ep", "comm.pp", "comm.dp", "offload", "bubble", "optimizer", "overhead")
COMM_GROUPS = ("tp", "cp", "ep", "pp", "dp")
_CATEGORY = {"gemm": "compute.gemm", "grouped_gemm": "compute.grouped_gemm", "attention": "compute.attention",
             "memory_bound": "compute.memory_bound", "recompute": "recompute", "overhead": "overhead",
             "offload": "offload",
             **{g: f"comm.{g}" for g in COMM_GROUPS}}


@dataclass(frozen=True)
class Projection:
    """The projected step of one scenario under one schedule. Seconds, FLOP, FLOP/s unless named otherwise."""

    scenario: Scenario = field(repr=False)
    schedule: str
    engine: str
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_flops_per_step: float
    model_tflops_per_gpu: float
    mfu: float
    hardware_flops_per_step: float
    hardware_tflops_per_gpu: float
    hfu: float
    peak_flop_per_s: float
    peak_dtype: str
    world_size: int
    n_microbatches: int
    breakdown_s: Mapping[str, float]
    breakdown_rank: int
    comm_total_s: Mapping[str, float]
    critical_path: tuple[str, ...]
    sim: SimResult = field(repr=False)
    memory: MemoryReport | None = field(repr=False)
    provenance: Mapping[str, float]
    optimizer_s: tuple[float, ...]
    param_gather_exposed_s: tuple[float, ...]
    priced: PricedStages = field(repr=False)
    dp: DPComm = field(repr=False)
    notes: tuple[str, ...] = ()
    rounds: int = 1  # back-to-back runs of `sim` in one step (TorchTitan gradient accumulation under pp: perf/rounds)

    def __post_init__(self) -> None:  # a result cannot be changed in place (a notebook's edit would go unnoticed)
        frozen_fields(self, "breakdown_s", "comm_total_s", "provenance")

    @property
    def model_tflops_per_gpu_causal(self) -> float:
        """Model TFLOP/s/GPU with the attention scores and weighted values counted over the causal half, as
        Megatron-LM's num_floating_point_operations does since 2025 (what a current Megatron log prints); the
        published tables, and `model_tflops_per_gpu`, count the full s x s."""
        sc = self.scenario
        flops = model_flops_per_step(sc.model, sc.training, sc.plan, causal=True)
        return flops / self.step_time_s / self.world_size / 1e12 if self.step_time_s > 0 else 0.0

    @property
    def exposed_comm_s(self) -> float:
        """Exposed communication of the breakdown rank (seconds) over the tp, cp, ep, pp and dp groups (the host-link
        copies of offloading are the breakdown's `offload`, not in it)."""
        return sum(self.breakdown_s[f"comm.{g}"] for g in COMM_GROUPS)

    @property
    def compute_s(self) -> float:
        """Compute-stream seconds of the breakdown rank: op classes, recompute and exposed in-action communication
        and overhead (the simulator's busy time)."""
        return self.sim.busy_s[self.breakdown_rank]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        mem = self.memory
        return {
            "source": self.scenario.source, "device": self.scenario.cluster.device.name,
            "schedule": self.schedule, "engine": self.engine, "world_size": self.world_size,
            "nodes": self.scenario.cluster.nodes, "n_microbatches": self.n_microbatches,
            "plan": plan_dict(self.scenario),
            "rounds": self.rounds,
            "step_time_s": self.step_time_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu, "mfu": self.mfu,
            "model_tflops_per_gpu_causal": self.model_tflops_per_gpu_causal,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu, "hfu": self.hfu,
            "model_flops_per_step": self.model_flops_per_step, "hardware_flops_per_step": self.hardware_flops_per_step,
            "peak_flop_per_s": self.peak_flop_per_s, "peak_dtype": self.peak_dtype,
            "breakdown_s": dict(self.breakdown_s), "breakdown_rank": self.breakdown_rank,
            "exposed_comm_s": self.exposed_comm_s, "comm_total_s": dict(self.comm_total_s),
            "bubble_ratio": self.sim.bubble_ratio, "bubble_s_per_rank": list(self.sim.bubble_s),
            "critical_path": list(self.critical_path),
            "optimizer_s": list(self.optimizer_s), "param_gather_exposed_s": list(self.param_gather_exposed_s),
            # what the simulation runs: I and W actions where the schedule splits the backward (each priced on its
            # own: I + W exceeds B, whose reduce-scatter hides behind the wgrad), else B with I = B - W
            "stages": [{"stage": s.stage, "pp_rank": s.pp_rank, "chunk": s.chunk, "f_s": s.f_s,
                        "i_s": s.i_s if self.priced.split_backward else s.b_s - min(s.w_s, s.b_s),
                        "w_s": s.w_s if self.priced.split_backward else min(s.w_s, s.b_s), "b_s": s.b_s,
                        "p2p_fwd_s": self.priced.p2p_fwd_s[s.stage]
                        if s.stage < len(self.priced.p2p_fwd_s) else 0.0} for s in self.priced.stages],
            "memory": None if mem is None else {"verdict": mem.verdict, "peak_bytes": mem.peak_bytes,
                                                "reserved_bytes": mem.reserved_bytes,
                                                "capacity_bytes": mem.capacity_bytes,
                                                "headroom_bytes": mem.headroom_bytes, "peak_rank": mem.peak_rank},
            "provenance": dict(self.provenance), "host_kernel_issue_s": self.priced.host_kernel_issue_s,
            "host_issue_source": self.priced.host_source,
            "host_framework_factor": dict(zip(("forward", "backward"), self.priced.host_factors, strict=True)),
            "notes": list(self.notes),
        }

    def _ratio_split(self) -> str:
        """The bubble ratio's two parts where the second is not nil: the ranks' idle time and their waits on exposed
        communication outside the actions (pipeline p2p, the data-parallel tail), which Primus's ratio also counts."""
        sim = self.sim
        if sim.step_time_s <= 0.0 or not sim.n_ranks:
            return ""
        idle = sum(sim.bubble_s) / (sim.n_ranks * sim.step_time_s)
        waits = sim.bubble_ratio - idle
        return f"\n                       = {100 * idle:.1f}% idle + {100 * waits:.1f}% waiting on exposed p2p / " \
               "data-parallel communication" if waits >= 0.0005 else ""

    def to_table(self) -> str:
        sc = self.scenario
        p = sc.plan
        lines = [f"Performance: {sc.source} on {self.world_size} x {sc.cluster.device.name} "
                 f"({count_of(sc.cluster.nodes, 'node')}), schedule {self.schedule}, engine {self.engine}",
                 f"plan: tp {p.tp}{' sp' if p.sp_ else ''}, pp {p.pp}, vpp {p.vpp_}, cp {p.cp}, ep {p.ep}, "
                 f"dp {p.dp_()}{_hsdp(p)}, zero {p.sharding.zero_stage}, microbatches {self.n_microbatches}, "
                 f"global batch {sc.training.resolved_global_batch(p.dp_())} x {sc.training.seq_length} tokens", "",
                 f"step time            {self.step_time_s:.4f} s",
                 f"tokens/s/GPU         {self.tokens_per_s_per_gpu:,.1f}",
                 f"model TFLOP/s/GPU    {self.model_tflops_per_gpu:.1f}   MFU {100 * self.mfu:.1f}% "
                 f"(vs {self.peak_flop_per_s / 1e12:.1f} TFLOP/s {self.peak_dtype} dense peak; Megatron's "
                 "model-FLOPs formula, attention over the full s x s)",
                 f"  causal count       {self.model_tflops_per_gpu_causal:.1f}   (attention over the causal half, "
                 "as Megatron-LM's logs count it since 2025)",
                 f"hardware TFLOP/s/GPU {self.hardware_tflops_per_gpu:.1f}   HFU {100 * self.hfu:.1f}% "
                 "(recompute counted, same convention)",
                 f"bubble ratio         {100 * self.sim.bubble_ratio:.1f}%   (mean over pp ranks, Primus pp_vis: "
                 "the share of the simulated pipeline, optimizer excluded, outside F/B/W actions; in-layer "
                 "communication counts as busy)" + self._ratio_split(),
                 f"  idle per pp rank   {min(self.sim.bubble_s, default=0.0):.4f} - "
                 f"{max(self.sim.bubble_s, default=0.0):.4f} s   (JSON bubble_s_per_rank: the simulated pipeline's, "
                 "before the optimizer; the breakdown's bubble adds its rank's wait for the slowest optimizer step "
                 "and parameter all-gather" + (f"; both of one of the step's {self.rounds} pipeline rounds)"
                                               if self.rounds > 1 else ")"), "",
                 f"breakdown (pp rank {self.breakdown_rank}, seconds per step)"]
        for k in BREAKDOWN_KEYS:
            v = self.breakdown_s[k]
            if v > 0.0:
                lines.append(f"  {k:22s} {v:10.4f}  {100 * v / self.step_time_s:5.1f}%")
        lines.append(f"  {'total':22s} {sum(self.breakdown_s.values()):10.4f}")
        comm = ", ".join(f"{g} {v:.4f}" for g, v in self.comm_total_s.items() if v > 0)
        lines += ["", f"communication (all, overlapped or not, s): {comm or 'none'}"]
        if self.memory is not None:
            m = self.memory
            lines.append(f"memory: peak {m.peak_bytes / 2**30:.2f} GiB, reserved {m.reserved_bytes / 2**30:.2f} GiB of "
                         f"{m.capacity_bytes / 2**30:.1f} GiB -> {m.verdict.upper()}")
        prov = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(self.provenance.items(), key=lambda kv: -kv[1]))
        lines.append(f"cost sources (share of priced seconds): {prov}")
        lines.append(f"host issue per kernel: {self.priced.host_kernel_issue_s * 1e6:.1f} us "
                     f"({self.priced.host_source or 'not modelled'})")
        path = self.critical_path
        shown = " ".join(path) if len(path) <= 10 else " ".join(path[:6]) + " ... " + " ".join(path[-4:])
        lines.append(f"critical path ({len(path)}): {shown}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def category_key(category: str) -> str | None:
    """Breakdown key of an action-time category (None for categories outside the step breakdown)."""
    return _CATEGORY.get(category)


def plan_dict(sc: Scenario) -> dict[str, Any]:
    """The layout and batch the table's `plan:` line prints, as JSON (the job --target-nodes projects)."""
    p, t = sc.plan, sc.training
    return {"tp": p.tp, "sp": p.sp_, "pp": p.pp, "vpp": p.vpp_, "cp": p.cp, "ep": p.ep, "etp": p.etp_,
            "dp": p.dp_(), "dp_replicate": p.sharding.dp_replicate, "zero_stage": p.sharding.zero_stage,
            "micro_batch_size": t.micro_batch_size, "global_batch_size": t.resolved_global_batch(p.dp_()),
            "seq_length": t.seq_length}


def _hsdp(plan: ParallelPlan) -> str:
    """' (R replicas x S shards)' under HSDP, else ''."""
    rep = plan.sharding.dp_replicate
    return f" ({rep} replicas x {plan.dp_() // rep} shards)" if rep > 1 else ""
