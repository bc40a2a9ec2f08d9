"""The seconds of FSDP's per-unit collectives (zero_stage 3): each unit's parameter all-gather, gradient
reduce-scatter and, with HSDP, the replica all-reduce, on the shard groups' placements (perf/placement.py), and the
cost source of each (`sources`, what `projection performance` prints as cost sources)."""

from __future__ import annotations

from collections.abc import Sequence

from projection.cost.collectives import GroupPlacement
from projection.cost.model import CostModel, priced_collective
from projection.perf.placement import expert_shard_placements, shard_placements
from projection.perf.stage_params import StageParams, gather_bytes
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.specs.training import DTYPE_BYTES


class FsdpSizes:
    """Seconds of the FSDP all-gather and reduce-scatter of each unit (zero_stage 3), else nothing. With TorchTitan's
    CPU offload (FSDP2 CPUOffloadPolicy, `offload.fsdp_params`) the sharded parameters live on the host: each
    all-gather first copies the rank's shard (the fp32 master with mixed precision) to the device, and each
    reduce-scatter's output shard is copied back, on the same stream over the host link."""

    def __init__(self, scenario: Scenario, cost_model: CostModel) -> None:
        plan, training = scenario.plan, scenario.training
        self.on = plan.sharding.zero_stage == 3
        self.cost_model = cost_model
        self.replicate: GroupPlacement | None = None
        self.expert: GroupPlacement | None = None
        self.expert_replicate: GroupPlacement | None = None
        if self.on:
            self.dense, self.replicate = shard_placements(scenario.cluster, plan)
            if scenario.model.moe is not None:
                self.expert, self.expert_replicate = expert_shard_placements(scenario.cluster, plan)
        self.training, self.num_layers = training, scenario.model.num_layers
        self.labels: dict[str, dict[str, float]] = {}  # kind -> cost source -> seconds, since the last unit_seconds
        self.param_b = DTYPE_BYTES[training.params_dtype]
        self.grad_b = DTYPE_BYTES[training.optimizer.main_grads_dtype]
        self.link = scenario.cluster.device.host_link_bytes_per_s if plan.offload.fsdp_params else None
        mixed = training.params_dtype != "fp32"
        self.shard_b = DTYPE_BYTES[training.optimizer.main_params_dtype] if mixed else self.param_b

    def unit_seconds(self, params: StageParams, names: Sequence[str]
                     ) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]], list[float]]:
        """Per unit: all-gather seconds, reduce-scatter seconds (dense, then expert group) and, with HSDP, the
        seconds of the replica all-reduce of its reduced dense shard."""
        self.labels = {}
        if not self.on:
            return [()] * len(names), [()] * len(names), [0.0] * len(names)
        sizes = {name: (d, e) for name, d, e in params.components}
        per = [sizes.pop(n, (0, 0)) for n in names]
        # all-gather bytes of each unit (fp8 all-gather: 1 B per converted GEMM weight, stage_params.gather_bytes)
        wire = [gather_bytes(self.training, self.num_layers, n, d, e) for n, (d, e) in zip(names, per, strict=True)]
        if sizes and per:  # params without an op component of their own (an MTP stage's embedding)
            d0, e0 = per[0]
            per[0] = (d0 + sum(d for d, _ in sizes.values()), e0 + sum(e for _, e in sizes.values()))
            extra = [gather_bytes(self.training, self.num_layers, n, d, e) for n, (d, e) in sizes.items()]
            wire[0] = (wire[0][0] + sum(b for b, _ in extra), wire[0][1] + sum(b for _, b in extra))
        gathers, scatters, replicas = [], [], []
        for (dense, expert), (dense_b, expert_b) in zip(per, wire, strict=True):
            g, r = [self._gather(dense, dense_b, self.dense)], [self._scatter(dense, self.dense)]
            if expert and self.expert is not None:
                g.append(self._gather(expert, expert_b, self.expert))
                r.append(self._scatter(expert, self.expert))
            gathers.append(tuple(g))
            scatters.append(tuple(r))
            shard = dense / max(1, self.dense.n_ranks) * self.grad_b
            ar = self._s("all_reduce", shard, self.replicate) if self.replicate and dense else 0.0
            if expert and self.expert is not None and self.expert_replicate is not None:
                ar += self._s("all_reduce", expert / max(1, self.expert.n_ranks) * self.grad_b, self.expert_replicate)
            replicas.append(ar)
        return gathers, scatters, replicas

    def _gather(self, elements: float, nbytes: float, group: GroupPlacement) -> float:
        return self._s("all_gather", nbytes, group) + self._copy(elements, self.shard_b, group)

    def _scatter(self, elements: float, group: GroupPlacement) -> float:
        return self._s("reduce_scatter", elements * self.grad_b, group) + self._copy(elements, self.grad_b, group)

    def _copy(self, elements: float, nbytes: int, group: GroupPlacement) -> float:
        """Host-link seconds of the rank's shard of a unit (CPU offload only)."""
        return elements / max(1, group.n_ranks) * nbytes / self.link if self.link else 0.0

    def _s(self, kind: str, size: float, group: GroupPlacement) -> float:
        return priced_collective(self.cost_model, kind, size, group,  # type: ignore[arg-type]
                                 self.labels.setdefault(kind, {}))

    def sources(self, plan: ParallelPlan, microbatches: int) -> dict[str, float]:
        """The seconds of the last unit_seconds' collectives by cost source, per microbatch as they run: gathered
        in forward (not under pipelined FSDP2) and again in backward where resharded after forward, once a step
        where pipelined FSDP2 keeps the units whole; reduced each microbatch, or once a step when pipelined."""
        once = 1.0 / max(1, microbatches)
        gathers = (0.0 if plan.pipelined_fsdp else 1.0) + (1.0 if plan.sharding.reshard_after_forward else 0.0)
        gathers = gathers or once
        out: dict[str, float] = {}
        for kind, labels in self.labels.items():
            times = gathers if kind == "all_gather" else once if plan.pipelined_fsdp else 1.0
            for label, seconds in labels.items():
                out[label] = out.get(label, 0.0) + seconds * times
        return out
