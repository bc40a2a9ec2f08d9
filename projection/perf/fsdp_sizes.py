"""The seconds of FSDP's per-unit collectives (zero_stage 3): each unit's parameter all-gather, gradient
reduce-scatter and, with HSDP, the replica all-reduce, on the shard groups' placements (perf/placement.py), and the
cost source of each (`sources`, what `projection performance` prints as cost sources).

FSDP2 (`torch_fsdp2`) copies around its collectives (torch 2.6 and 2.13 `_fsdp_collectives.py`, the same kernels;
oracle: tests/oracle/test_fsdp2_copies_cpu.py):
* all-gather copy-in, on its own stream before the all-gather: each shard cast to the gather dtype (where it differs)
  and copied into one flat buffer (`fsdp.all_gather_copy_in`) - added to the gather (`copy_in_op`);
* all-gather copy-out, on the compute stream when the unit is waited for (`wait_for_unshard`): the gathered buffer
  split into the unsharded parameters (`fsdp.split_with_sizes_copy`: reads and writes the gathered bytes) - a
  memory-bound op before the unit's compute (`unit_copies`);
* reduce-scatter copy-in, on the compute stream after the unit's backward (`foreach_reduce` runs it before switching
  to the reduce-scatter stream): the unsharded gradients, in the compute dtype, into one buffer of the reduce dtype
  (`fsdp.chunk_cat`) - a memory-bound op at the end of the unit's backward;
* after the reduce-scatter, on its stream, the reduced shard cast back to the sharded parameter's dtype where the
  reduce dtype differs (`_to_dtype_if_needed`) - added to the reduce-scatter. Neither version divides fp32 or bf16
  gradients with a kernel of its own (NCCL's average), and a gradient accumulated onto an earlier microbatch's
  (`+=` on the shard) is not priced.
Not priced under pipelined FSDP2 (ParallelPlan.pipelined_fsdp), whose gathers and reductions run once a step."""

from __future__ import annotations

from collections.abc import Sequence

from projection.cost.collectives import GroupPlacement
from projection.cost.model import CostModel, priced_collective
from projection.perf.placement import expert_shard_placements, shard_placements
from projection.perf.stage_params import StageParams, gather_bytes
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.specs.training import DTYPE_BYTES
from projection.workload.ops_base import Op, mem


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
        self.fsdp2 = self.on and plan.sharding.fsdp == "torch_fsdp2" and not plan.pipelined_fsdp
        # per unit of the last unit_seconds: FSDP2's compute-stream copies (copy-outs, reduce-scatter copy-ins)
        self.copies: list[tuple[tuple[Op, ...], tuple[Op, ...]]] = []

    def unit_seconds(self, params: StageParams, names: Sequence[str]
                     ) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]], list[float]]:
        """Per unit: all-gather seconds, reduce-scatter seconds (dense, then expert group) and, with HSDP, the
        seconds of the replica all-reduce of its reduced dense shard."""
        self.labels = {}
        if not self.on:
            self.copies = [((), ())] * len(names)
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
        self.copies = []
        for name, (dense, expert), (dense_b, expert_b) in zip(names, per, wire, strict=True):
            g, r = [self._gather(dense, dense_b, self.dense)], [self._scatter(dense, self.dense)]
            groups = [(dense, dense_b)]
            if expert and self.expert is not None:
                g.append(self._gather(expert, expert_b, self.expert))
                r.append(self._scatter(expert, self.expert))
                groups.append((expert, expert_b))
            self.copies.append(self._unit_copies(name, groups))
            gathers.append(tuple(g))
            scatters.append(tuple(r))
            shard = dense / max(1, self.dense.n_ranks) * self.grad_b
            ar = self._s("all_reduce", shard, self.replicate) if self.replicate and dense else 0.0
            if expert and self.expert is not None and self.expert_replicate is not None:
                ar += self._s("all_reduce", expert / max(1, self.expert.n_ranks) * self.grad_b, self.expert_replicate)
            replicas.append(ar)
        return gathers, scatters, replicas

    def _gather(self, elements: float, nbytes: float, group: GroupPlacement) -> float:
        s = self._s("all_gather", nbytes, group) + self._copy(elements, self.shard_b, group)
        if self.fsdp2 and elements:
            s += self._mem("all_gather", copy_in_op(elements, nbytes, self.shard_b, group.n_ranks))
        return s

    def _scatter(self, elements: float, group: GroupPlacement) -> float:
        s = self._s("reduce_scatter", elements * self.grad_b, group) + self._copy(elements, self.grad_b, group)
        cast = reduce_cast_op(elements, self.grad_b, self.shard_b, group.n_ranks) if self.fsdp2 else None
        return s + (self._mem("reduce_scatter", cast) if cast is not None else 0.0)

    def _unit_copies(self, name: str, groups: Sequence[tuple[float, float]]) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
        """FSDP2's compute-stream copies of one unit, per (elements, gathered bytes) of its groups: the all-gather
        copy-outs (each gathered buffer read and written into the parameters) and the reduce-scatter copy-ins (the
        compute-dtype gradients read, the reduce-dtype buffer written)."""
        if not self.fsdp2:
            return (), ()
        outs = tuple(copy_out_op(name, b) for e, b in groups if e)
        ins = tuple(chunk_cat_op(name, e, self.param_b, self.grad_b) for e, _ in groups if e)
        return outs, ins

    def _mem(self, kind: str, op: Op) -> float:
        """Seconds of a copy that runs on a collective's stream, booked under that collective's cost sources."""
        seconds = self.cost_model.op_seconds(op)
        label = self.cost_model.provenance(op)
        labels = self.labels.setdefault(kind, {})
        labels[label] = labels.get(label, 0.0) + seconds
        return seconds

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


def copy_in_op(elements: float, gathered_bytes: float, shard_b: int, n_ranks: int) -> Op:
    """FSDP2's all-gather copy-in of a unit of `elements` gathered as `gathered_bytes`, the rank's shard held at
    `shard_b` bytes an element: where the gather dtype differs (mixed precision, an fp8 gather) the shard is first
    cast into a buffer of the gather dtype (`_get_param_all_gather_inputs`' foreach copy, or the fp8 pre-all-gather),
    then copied into the gather buffer (`fsdp.all_gather_copy_in`): two kernels, priced as one."""
    n = max(1, n_ranks)
    shard, part = elements / n * shard_b, gathered_bytes / n
    cast = abs(shard - part) > 0.5
    return mem("fsdp.all_gather_copy_in", "F", shard + (part if cast else 0.0), part * (2 if cast else 1))


def copy_out_op(name: str, gathered_bytes: float) -> Op:
    """FSDP2's all-gather copy-out of unit `name`: the gathered buffer read and split into the parameters."""
    return mem(f"{name}.fsdp_copy_out", "F", gathered_bytes, gathered_bytes)


def chunk_cat_op(name: str, elements: float, param_b: int, reduce_b: int) -> Op:
    """FSDP2's reduce-scatter copy-in of unit `name`: its gradients (compute dtype) read, the reduce-dtype buffer
    written."""
    return mem(f"{name}.fsdp_chunk_cat", "W", elements * param_b, elements * reduce_b)


def reduce_cast_op(elements: float, reduce_b: int, shard_b: int, n_ranks: int) -> Op | None:
    """The reduced shard cast to the sharded parameter's dtype; None where the reduce dtype is that dtype."""
    if not elements or reduce_b == shard_b:
        return None
    shard = elements / max(1, n_ranks)
    return mem("fsdp.reduce_output_cast", "W", shard * reduce_b, shard * shard_b)
