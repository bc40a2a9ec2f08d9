"""MemoryReport: per-rank byte breakdown, allocated and reserved peaks, and the verdict against HBM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from projection.frozen import frozen_fields
from projection.memory.allocator import EXPANDABLE_PAGE_BYTES, FRAGMENTATION_OF_ACTIVATIONS
from projection.specs.scenario import Scenario

GiB = 2**30
# Verdict thresholds: "fits" leaves at least AT_RISK_HEADROOM of HBM free after the reserved peak; "at risk" when the
# reserved peak eats into that margin or exceeds HBM while the allocated peak still fits; "out of memory" when the
# allocated peak alone exceeds HBM. The 5 % margin covers the CUDA/HIP context and NCCL/RCCL internal buffers that
# live outside the caching allocator (assumption, stated).
AT_RISK_HEADROOM = 0.05
Verdict = Literal["fits", "at risk", "out of memory"]
CATEGORIES = ("weights", "gradients", "optimizer", "activations", "buffers", "other")


@dataclass(frozen=True)
class RankMemory:
    pp_rank: int
    bytes: dict[str, int]
    terms: dict[str, int]
    peak_bytes: int
    reserved_bytes: int
    cpu_bytes: int
    inflight: dict[int, int] = field(default_factory=dict)  # virtual stage -> microbatches live at the peak
    layers: int = 0
    # virtual stage -> the activations one microbatch leaves saved on it between its forward and backward
    microbatch_activation_bytes: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:  # a result cannot be changed in place (a notebook's edit would go unnoticed)
        frozen_fields(self, "bytes", "terms", "inflight", "microbatch_activation_bytes")


@dataclass(frozen=True)
class MemoryReport:
    scenario: Scenario
    ranks: tuple[RankMemory, ...]
    peak_bytes: int
    reserved_bytes: int
    capacity_bytes: int
    verdict: Verdict
    headroom_bytes: int
    peak_rank: int

    @property
    def allocator(self) -> str:
        """The caching allocator's mode the reserved peak assumes (memory/allocator.py)."""
        if self.scenario.training.kernels.expandable_segments:
            return f"expandable segments: {EXPANDABLE_PAGE_BYTES // 2**20} MiB pages, no fragmentation allowance"
        return f"default caching allocator: + {FRAGMENTATION_OF_ACTIVATIONS:.0%} of activations for fragmentation"

    @property
    def notes(self) -> tuple[str, ...]:
        """What the job runs that the estimate prices as something else (the table's and JSON's notes)."""
        from projection.schedule.registry import SPLIT_BACKWARD
        from projection.specs.validate import FP8_WITHOUT_AMP, torchtitan_fp8_without_amp

        sc = self.scenario
        out = [FP8_WITHOUT_AMP] if torchtitan_fp8_without_amp(sc.framework, sc.plan, sc.training) else []
        if sc.plan.schedule in SPLIT_BACKWARD and sc.plan.pp > 1:
            out.append(f"{sc.plan.schedule} splits each backward into an input-gradient pass and a deferred "
                       "weight-gradient pass: what a microbatch keeps between the two (each linear's input, "
                       "recomputed under activation recompute, and its output gradient) is not counted, so the "
                       "activation peak can be higher than shown (schedule/inflight.py counts those microbatches; "
                       "their bytes are not modelled)")
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        sc = self.scenario
        return {
            "source": sc.source, "device": sc.cluster.device.name, "world_size": sc.world_size,
            "peak_bytes": self.peak_bytes, "reserved_bytes": self.reserved_bytes,
            "capacity_bytes": self.capacity_bytes, "verdict": self.verdict, "headroom_bytes": self.headroom_bytes,
            "peak_rank": self.peak_rank,
            "allocator": "expandable_segments" if sc.training.kernels.expandable_segments else "default",
            "ranks": [{"pp_rank": r.pp_rank, "peak_bytes": r.peak_bytes, "reserved_bytes": r.reserved_bytes,
                       "cpu_bytes": r.cpu_bytes, "bytes": dict(r.bytes), "terms": dict(r.terms),
                       "inflight_microbatches": {str(k): v for k, v in r.inflight.items()}, "layers": r.layers}
                      for r in self.ranks],
            "notes": list(self.notes),
        }

    def to_table(self) -> str:
        sc = self.scenario
        head = (f"Memory per GPU: {sc.source} on {sc.world_size} x {sc.cluster.device.name} "
                f"({self.capacity_bytes / GiB:.2f} GiB HBM)")
        cols = ["pp_rank", "layers", "inflight", *CATEGORIES, "peak", "reserved"]
        rows = [cols]
        for r in self.ranks:
            rows.append([str(r.pp_rank), str(r.layers), str(sum(r.inflight.values())),
                         *[f"{r.bytes[c] / GiB:.2f}" for c in CATEGORIES], f"{r.peak_bytes / GiB:.2f}",
                         f"{r.reserved_bytes / GiB:.2f}"])
        widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
        # with model chunks (vpp > 1) a microbatch holds one activation set per chunk it is in: counted per chunk
        what = ("(microbatch, model chunk) activation sets live at the rank's peak, each one chunk's layers"
                if sc.plan.vpp_ > 1 else "microbatches whose activations are live at the rank's peak")
        lines = [head, f"(GiB; inflight = {what})", ""]
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
        cpu = max(r.cpu_bytes for r in self.ranks)
        lines += ["", f"Peak allocated {self.peak_bytes / GiB:.2f} GiB on pp_rank {self.peak_rank}; reserved "
                      f"{self.reserved_bytes / GiB:.2f} GiB ({self.allocator}); headroom "
                      f"{self.headroom_bytes / GiB:.2f} GiB -> {self.verdict.upper()}"]
        if self.headroom_bytes < 0 and self.verdict == "at risk":
            lines.append("(the reserved peak exceeds HBM: the allocated peak fits only if the caching allocator frees "
                         "its cached blocks and retries, slowly, or with expandable segments)")
        if cpu:
            lines.append(f"CPU (offloaded optimizer state and activations, pinned host memory) per rank: "
                         f"{cpu / GiB:.2f} GiB")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def verdict(sc: Scenario, ranks: list[RankMemory]) -> MemoryReport:
    cap = sc.cluster.device.hbm_bytes
    worst = max(ranks, key=lambda r: r.reserved_bytes)
    peak = max(r.peak_bytes for r in ranks)
    reserved = worst.reserved_bytes
    if peak > cap:
        v: Verdict = "out of memory"
    elif reserved > cap * (1 - AT_RISK_HEADROOM):
        v = "at risk"
    else:
        v = "fits"
    return MemoryReport(scenario=sc, ranks=tuple(ranks), peak_bytes=peak, reserved_bytes=reserved,
                        capacity_bytes=cap, verdict=v, headroom_bytes=cap - reserved,
                        peak_rank=max(ranks, key=lambda r: r.peak_bytes).pp_rank)
