"""Turn the ops of one action into `Item`s (projection/perf/action_time.py): which collective is exposed on the
compute stream, which overlaps what, and for how long.

Rules, after Megatron-LM / Transformer Engine:
- TP (and SP): the forward collectives (all-gather before a column-parallel GEMM, reduce-scatter or all-reduce after
  a row-parallel one) and the all-gather of the output gradient are waited for on the compute stream. The backward
  of a column-parallel linear overlaps by default (Megatron LinearWithGradAccumulationAndAsyncCommunication and TE
  `_Linear.backward`): the re-gather of the sequence-parallel input is launched before the dgrad GEMM and waited for
  before the wgrad GEMM; the reduce-scatter (all-reduce without SP) of the input gradient is launched after the dgrad
  GEMM and overlaps the next GEMM. With `overlap.tp_comm` (TE userbuffers, needs SP) the waited-for TP collectives
  are split into pieces pipelined with their GEMM, itself run as that many GEMMs of a share of the token rows
  (perf/tp_overlap.py; action_time.pipelined_exposed_s).
- CP ring attention (TE): each of the cp - 1 K/V exchanges overlaps one 1/cp chunk of the attention kernel, so the
  exposed time is (cp - 1) x max(0, step - attention / cp).
- EP all-to-all: waited for, unless `overlap.ep_comm` (Megatron's combined 1F1B all-to-all overlap): then launched
  and hidden behind the rest of the action's compute. Expert-TP collectives and the allgather dispatcher's
  collectives over the tensor-and-expert group are waited for (booked as ep).
- FSDP (zero_stage 3): one all-gather per unit (embedding, decoder layer, MTP depth, output) prefetched one unit
  ahead (FSDP2's implicit prefetch), again in the backward when resharded after forward, and one reduce-scatter per
  unit after its backward; dense units over the dp x cp shard group, experts over expert-dp, each group's gathers
  and reduce-scatters in order on one stream (FSDP_STREAMS). With HSDP each unit's reduced shard is then
  all-reduced over the replicas on a stream of its own.
- Offloaded activations (Megatron fine-grained activation offloading): each layer's copy to the host is launched
  after the layer's forward on the `d2h` stream; its reload is prefetched one layer ahead on the `h2d` stream and
  waited for before the layer's backward (category `offload`; projection/perf/pricing.py prices the copies).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from projection.perf.action_time import Item, blocking, launch, pipelined_exposed_s, run, sync, wait
from projection.perf.tp_overlap import split_gemm_s, splits
from projection.specs.plan import ParallelPlan
from projection.workload.ops import Op

GEMMS = ("gemm", "grouped_gemm")
# FSDP collectives of a unit's dense parameters and of its expert parameters: one stream per process group. FSDP2
# issues a group's all-gathers and reduce-scatters on one process group, whose NCCL communicator runs them one after
# another (ProcessGroupNCCL keeps one NCCL stream per device and group), so a unit's reduce-scatter and the next
# unit's prefetched all-gather queue behind each other; the expert shard group is another communicator.
FSDP_STREAMS = ("fsdp", "fsdp_expert")


@dataclass(frozen=True)
class Entry:
    """An op in an action sequence; `asynchronous` marks a column-parallel backward collective."""

    op: Op
    asynchronous: bool = False


@dataclass(frozen=True)
class Unit:
    """One FSDP unit (a component: embedding, layer, MTP depth, output) in an action: its all-gather /
    reduce-scatter seconds (dense + expert groups), its activation offload copy (forward, device to host) or reload
    (backward, host to device) seconds, and its ops."""

    entries: tuple[Entry, ...]
    gather_s: tuple[float, ...] = ()
    scatter_s: tuple[float, ...] = ()
    offload_s: float = 0.0
    reload_s: float = 0.0
    replicate_s: float = 0.0  # HSDP: the all-reduce of the unit's reduced shard over the replicas


def mark_async(bwd: Sequence[Op]) -> tuple[Entry, ...]:
    """Entries of one component's backward ops (execution order), marking the overlapped TP collectives."""
    out = []
    for k, op in enumerate(bwd):
        asyn = False
        if op.kind == "collective" and op.group == "tp":
            base = op.name.rsplit(".", 1)[0]
            if op.phase == "W" and op.coll == "all_gather":
                asyn = True
            elif op.phase == "I" and op.coll in ("reduce_scatter", "all_reduce") and k + 1 < len(bwd):
                nxt = bwd[k + 1]
                asyn = nxt.phase == "W" and nxt.kind in GEMMS and nxt.name == f"{base}.wgrad"
        out.append(Entry(op, asyn))
    return tuple(out)


class ItemBuilder:
    """Builds items for one plan. `compute_s(op)` prices a compute op; `coll_s(op)` one invocation of a collective
    op over its group's placement."""

    def __init__(self, plan: ParallelPlan, compute_s: Callable[[Op], float], coll_s: Callable[[Op], float],
                 sync_after: frozenset[str] = frozenset()) -> None:
        self.plan = plan
        self.compute_s = compute_s
        self.coll_s = coll_s
        self.sync_after = sync_after  # op names whose result the host reads (a synchronisation) before going on
        self.token = 0

    def _next(self) -> int:
        self.token += 1
        return self.token

    def items(self, units: Sequence[Unit], backward: bool) -> list[Item]:
        """Items of an action made of `units` in execution order. FSDP gathers and activation reloads are prefetched
        one unit ahead and waited for before their unit; reduce-scatters and activation offload copies are launched
        after their unit on their own streams (a reload and an offload copy use the two directions of the host
        link, `h2d` and `d2h`). Each launch names its unit by its position from the stage's last unit (the units of
        a backward come in backward order)."""
        out: list[Item] = []
        last = [j if backward else len(units) - 1 - j for j in range(len(units))]
        ahead = [self._prefetch(u, last[j]) for j, u in enumerate(units)]  # (launches, their tokens) per unit
        for j, unit in enumerate(units):
            if j == 0:
                out += ahead[0][0]
            if ahead[j][1]:
                out.append(wait(*ahead[j][1]))
            if j + 1 < len(units):
                out += ahead[j + 1][0]
            out += self._entries(unit.entries, backward)
            scatters, s_tokens = self._launch_all("dp", unit.scatter_s, FSDP_STREAMS, "reduce-scatter", last[j])
            out += scatters
            if unit.replicate_s > 0.0 and s_tokens:
                # FSDP2 foreach_reduce: the replica all-reduce of the reduce-scattered shard, on its own stream and
                # process group, once the unit's reduce-scatter has finished
                out.append(launch("dp", unit.replicate_s, self._next(), stream="fsdp_replicate", after=s_tokens,
                                  label="all-reduce", unit=last[j]))
            out += self._launch_all("offload", (unit.offload_s,), ("d2h",), "activation offload", last[j])[0]
        return out

    def _prefetch(self, unit: Unit, last: int) -> tuple[list[Item], tuple[int, ...]]:
        """What a unit waits for before its ops: its FSDP all-gathers and its activation reload."""
        gathers, g_tokens = self._launch_all("dp", unit.gather_s, FSDP_STREAMS, "all-gather", last)
        reload, r_tokens = self._launch_all("offload", (unit.reload_s,), ("h2d",), "activation reload", last)
        return gathers + reload, g_tokens + r_tokens

    def _launch_all(self, group: str, seconds: Sequence[float], streams: Sequence[str], label: str = "",
                    unit: int = -1) -> tuple[list[Item], tuple[int, ...]]:
        """Launch the k-th of `seconds` on the k-th of `streams` (the last stream for any beyond)."""
        items = [launch(group, s, self._next(), stream=streams[min(k, len(streams) - 1)], label=label, unit=unit)
                 for k, s in enumerate(seconds) if s > 0.0]
        return items, tuple(i.token for i in items)

    def _entries(self, entries: Sequence[Entry], backward: bool) -> list[Item]:
        out: list[Item] = []
        ops = [e.op for e in entries]
        split: dict[int, int] = {}  # position of a GEMM split with its overlapped TP collective -> pieces
        if self.plan.overlap.tp_comm and self.plan.sp_:
            for k, e in enumerate(entries):
                if e.op.kind == "collective" and (e.op.group or "dp") == "tp" and not e.asynchronous:
                    at = _pair_index(ops, k, forward=e.op.coll == "all_gather", kinds=GEMMS)
                    if at is not None:
                        split[at] = splits(self.plan, e.op.coll)
        after_next: list[int] = []  # tokens waited for after the next compute op
        before: dict[str, int] = {}  # wgrad op name -> token waited for before it
        for k, e in enumerate(entries):
            op = e.op
            if op.kind != "collective":
                if op.name in before:
                    out.append(wait(before.pop(op.name)))
                seconds = split_gemm_s(op, split[k], self.compute_s) if k in split else self.compute_s(op)
                out.append(run("recompute" if op.recompute else op.kind, seconds, op.count))
                if op.name in self.sync_after:
                    out.append(sync())
                if after_next:
                    out.append(wait(*after_next))
                    after_next = []
                continue
            one = self.coll_s(op)
            full = one * op.count
            group = op.group or "dp"
            if group == "tp" and e.asynchronous:
                tok = self._next()
                out.append(launch("tp", full, tok, op.count))
                base = op.name.rsplit(".", 1)[0]
                if op.coll == "all_gather" and f"{base}.wgrad" in {o.name for o in ops[k + 1:]}:
                    before[f"{base}.wgrad"] = tok
                else:
                    after_next.append(tok)
            elif group == "tp" and self.plan.overlap.tp_comm and self.plan.sp_:
                at = _pair_index(ops, k, forward=op.coll == "all_gather", kinds=GEMMS)
                pieces = splits(self.plan, op.coll)
                g = split_gemm_s(ops[at], pieces, self.compute_s) if at is not None else 0.0
                out.append(blocking("tp", pipelined_exposed_s(full, g, pieces), full, op.count))
            elif group in ("cp", "cp_a2a", "cp_ring"):
                attn = _pair(ops, k, forward=op.recompute or not backward, kinds=("attention",))
                # a ring step hides behind one of the ring's chunks of attention: cp of them, or the hierarchical
                # ring's cp / cp_a2a (ParallelPlan.cp_hierarchy)
                levels = self.plan.cp_levels
                steps = levels[1] if group == "cp_ring" and levels is not None else self.plan.cp
                a = self.compute_s(attn) / steps if attn is not None else 0.0
                if op.name.endswith(".exposed"):  # a last ring step nothing is left to hide
                    out.append(blocking("cp", full, full, op.count))
                elif op.coll == "send_recv":  # ring steps: each hides behind a chunk of attention
                    out.append(blocking("cp", op.count * max(0.0, one - a), full, op.count))
                elif op.name.endswith(".overlap"):  # torch's all-gather: behind the local chunk only
                    out.append(blocking("cp", max(0.0, full - a), full, op.count))
                else:  # TE's all-gather / reduce-scatter, the all-to-alls: exposed (workload/ops_attention.py)
                    out.append(blocking("cp", full, full, op.count))
            elif group == "ep" and self.plan.overlap.ep_comm:
                out.append(launch("ep", full, self._next(), op.count))
            else:
                out.append(blocking("ep" if group in ("etp", "etp_ep") else group, full, full, op.count))
        if after_next or before:
            out.append(wait(*after_next, *before.values()))
        return out


def _pair_index(ops: Sequence[Op], k: int, *, forward: bool, kinds: tuple[str, ...]) -> int | None:
    """Position of the nearest op of `kinds` after position k (forward=True) or before it, else on the other side."""
    after = next((i for i in range(k + 1, len(ops)) if ops[i].kind in kinds), None)
    before = next((i for i in range(k - 1, -1, -1) if ops[i].kind in kinds), None)
    return (after if after is not None else before) if forward else (before if before is not None else after)


def _pair(ops: Sequence[Op], k: int, *, forward: bool, kinds: tuple[str, ...]) -> Op | None:
    """The nearest op of `kinds` after position k (forward=True) or before it, else on the other side."""
    i = _pair_index(ops, k, forward=forward, kinds=kinds)
    return None if i is None else ops[i]
