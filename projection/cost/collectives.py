"""Collective cost model: alpha-beta over hierarchical fabric tiers; rings, and tree or hierarchical all-reduce.

Tiers. `intra_node`: the GPU-to-GPU fabric of a node (xGMI mesh: one link per peer, so a group of r ranks on a node
reaches (r-1)/links of the per-GPU bandwidth; NVLink switch: the full per-GPU bandwidth for any group).
`inter_node`: the NICs (per GPU: NICs per node x NIC bandwidth x `nic.efficiency` / GPUs per node), rail-optimised
(traffic between GPUs of the same local index stays on its rail) or fat-tree; an oversubscribed upper tier divides the
bandwidth of traffic that crosses it (all inter-node traffic on a fat-tree; cross-rail traffic on a rail-optimised
fabric).
Each tier has an alpha (seconds per algorithm step across it) and a beta (bytes/s per GPU, one direction).

Algorithms, for S bytes (nccl-tests size convention, see `bus_factor`) over n ranks, r per node, m nodes:
* ring: steps(kind, n) x alpha + bus_factor(kind, n) x S / B, B = min(intra bandwidth of r ranks, r x NIC
  bandwidth) -- a flat ring over nodes uses the r NICs of a node in parallel (one channel per NIC);
  all_to_all sends (r-1)/n S over the intra-node links and (n-r)/n S over its own NIC, concurrently.
* tree (all_reduce only): ceil(log2 n) steps each way, twice the bytes of a single pass per rank (a pipelined
  double binary tree): 2 S / B.
* hierarchical (all_reduce only, m > 1 and r > 1): intra-node reduce-scatter, inter-node all-reduce of S / r per
  rail over m nodes, intra-node all-gather -- NCCL's tree seen per NIC (reduce inside the node, all-reduce across
  nodes, broadcast inside, one head GPU per NIC: NVIDIA/nccl #530) and its NVLS-tree.
NCCL has no tree or hierarchical algorithm for all_gather, reduce_scatter, broadcast or reduce (NVIDIA/nccl #1473:
"the Tree algorithm ... doesn't apply to allgather/reducescatter"; #1594: those run Ring, or NVLS / CollNet, which
need NVLink SHARP or an in-network reduction fabric), and RCCL follows NCCL: those kinds are priced as the flat ring.
Not priced: PAT (NCCL >= 2.23; RCCL opt-in with NCCL_PAT_ENABLE, ROCm/rccl #1756), a log2 n-step schedule for one
GPU per node that the tuners take for small messages only (RCCL: up to 0.5-32 MB by node count, ROCm/rocm-systems
#3756; "not yet as low-latency as the Tree allreduce", #1473): a data-parallel bucket of tens of MB is a ring.
`auto` takes the fastest, as NCCL's tuner does with its own per-algorithm latency and bandwidth model.

Calibration. A `MeasuredCurve` (from `projection.calibrate.fit`) holds piecewise alpha-beta segments fitted to a
measured bus-bandwidth curve at one placement; a group of the same tier and kind is priced from it, with latency
scaled by the ratio of ring step counts and bandwidth by the ratio of analytic bus bandwidths of the two placements.
At its own placement a curve the tuner chose freely is the price; one measured with a forced algorithm (NCCL_ALGO) is
one candidate of the tuner's (`_scaled_segment_time_s`). Plain arithmetic only, so a caller may loop over many sizes
cheaply. `projection.cost.calibrated` never prices a group below a measured placement inside it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from projection.errors import PlanError, Problem
from projection.specs.hardware import ClusterSpec, DeviceSpec

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast", "reduce"]
COLLECTIVE_KINDS: tuple[CollectiveKind, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                "send_recv", "broadcast", "reduce")
Algorithm = Literal["auto", "ring", "tree", "hierarchical"]
Tier = Literal["intra_node", "inter_node"]
TIERS: tuple[Tier, ...] = ("intra_node", "inter_node")
AXES = ("tp", "cp", "ep", "dp", "pp")  # Megatron's default rank order, innermost (fastest-varying) first


def bus_factor(kind: str, n_ranks: int) -> float:
    """nccl-tests bus-bandwidth factor (hardware.md §0): busbw = algbw x factor; all_reduce 2(n-1)/n; all_gather,
    reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send_recv 1."""
    n = max(n_ranks, 1)
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def ring_steps(kind: str, n_ranks: int) -> int:
    """Latency steps of the ring algorithm: all_reduce 2(n-1); send_recv 1; the others n-1."""
    if kind == "send_recv":
        return 1
    return (2 if kind == "all_reduce" else 1) * max(n_ranks - 1, 0)


@dataclass(frozen=True)
class GroupPlacement:
    """Where a communicator's ranks sit: n_ranks in all, at most ranks_per_node on one node, over n_nodes nodes.
    rail_aligned: every node holds the same local GPU indices of the group (its inter-node peers share rails)."""

    n_ranks: int
    ranks_per_node: int
    n_nodes: int
    rail_aligned: bool = True

    def __post_init__(self) -> None:
        if min(self.n_ranks, self.ranks_per_node, self.n_nodes) < 1 or self.ranks_per_node > self.n_ranks \
                or self.ranks_per_node * self.n_nodes < self.n_ranks or self.n_nodes > self.n_ranks:
            raise ValueError(f"inconsistent placement: {self}")

    @property
    def tier(self) -> Tier:
        """The widest tier the group crosses."""
        return "intra_node" if self.n_nodes == 1 else "inter_node"


def group_placement(cluster: ClusterSpec, tp: int, cp: int, ep: int, dp: int, pp: int, axis: str,
                    order: str = "tp-cp-ep-dp-pp", cp_level: tuple[int, int] | None = None) -> GroupPlacement:
    """Placement of the communicators along `axis` ('tp', 'dp', ... or a combined group such as 'dp-cp' or 'tp-cp')
    for Megatron's rank order tp-cp-ep-dp-pp (tp innermost): rank = tp_i + tp (cp_i + cp (ep_i + ep (dp_i + dp pp_i))),
    node = rank // gpus_per_node (`order`: another order of the five axes, innermost first, e.g. tp-cp-ep-pp-dp with
    Megatron's --use-tp-pp-dp-mapping). For the expert grid pass tp=etp, cp=1, ep=ep, dp=expert dp. Of all the
    groups along the axis the one spanning the most nodes (then the fewest ranks per node) is returned: the slowest
    sets the pace. `cp_level` = (a, level) with axis 'cp': one level of a cp group split into an all-to-all group of
    a and a ring (Megatron-Core create_hierarchical_groups: level 0 groups a consecutive cp ranks, level 1 the ranks
    of stride a)."""
    sizes = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
    names = [a for a in axis.replace("_", "-").split("-") if a]
    problems = [Problem(f"{name} = {size} must be >= 1", key=name) for name, size in sizes.items() if size < 1]
    problems += [Problem(f"unknown parallel axis {a!r}", key="axis", fix=f"use one or more of {', '.join(AXES)} "
                         "joined by '-'") for a in names if a not in sizes]
    if not names:
        problems.append(Problem("empty axis", key="axis", fix=f"use one of {', '.join(AXES)}"))
    world = math.prod(sizes.values())
    if not problems and world != cluster.world_size:
        problems.append(Problem(f"tp*cp*ep*dp*pp = {world} but the cluster has {cluster.world_size} GPUs "
                                f"({cluster.nodes} nodes x {cluster.gpus_per_node})", key="plan",
                                fix="make the product of the parallel sizes equal the number of GPUs"))
    if problems:
        raise PlanError(problems)
    axes = order.split("-")
    if sorted(axes) != sorted(AXES):
        raise PlanError(Problem(f"rank order {order!r} is not an order of {', '.join(AXES)}", key="rank_order"))
    strides = dict(zip(axes, [math.prod([sizes[a] for a in axes[:i]]) for i in range(len(axes))], strict=True))
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank in range(world):
        key = tuple((rank // strides[a]) % sizes[a] for a in axes if a not in names)
        if cp_level is not None and names == ["cp"]:  # one level of the cp group: cp_i = a2a index + a x ring index
            cp_i = (rank // strides["cp"]) % cp
            key += (cp_i // cp_level[0],) if cp_level[1] == 0 else (cp_i % cp_level[0],)
        groups.setdefault(key, []).append(rank)
    worst: tuple[int, int] = (0, 0)
    aligned = True
    gpn = cluster.gpus_per_node
    for ranks in groups.values():
        per_node = Counter(r // gpn for r in ranks)
        locals_by_node = {node: frozenset(r % gpn for r in ranks if r // gpn == node) for node in per_node}
        aligned = aligned and len(set(locals_by_node.values())) == 1
        candidate = (len(per_node), -max(per_node.values()))
        worst = max(worst, candidate)
    n_ranks = len(next(iter(groups.values())))
    return GroupPlacement(n_ranks=n_ranks, ranks_per_node=-worst[1], n_nodes=worst[0], rail_aligned=aligned)


@dataclass(frozen=True)
class TierParams:
    """alpha_s: latency of one algorithm step across the tier; beta_bytes_per_s: bandwidth per GPU, one direction."""

    alpha_s: float
    beta_bytes_per_s: float


@dataclass(frozen=True)
class CurveSegment:
    """From min_bytes up (to the next segment): time = alpha_s + bus_factor x size / busbw_bytes_per_s.
    first_bytes / last_bytes: the measured sizes it was fitted to span (0: not recorded)."""

    min_bytes: int
    alpha_s: float
    busbw_bytes_per_s: float
    first_bytes: int = 0
    last_bytes: int = 0


@dataclass(frozen=True)
class MeasuredCurve:
    """A fitted bus-bandwidth curve of one collective kind, measured at one placement. algorithm: the one the library
    was forced to run (NCCL_ALGO, lower case: "ring", "tree", ...); None: its tuner chose."""

    kind: CollectiveKind
    n_ranks: int
    ranks_per_node: int
    n_nodes: int
    segments: tuple[CurveSegment, ...]
    algorithm: str | None = None

    @property
    def placement(self) -> GroupPlacement:
        return GroupPlacement(self.n_ranks, self.ranks_per_node, self.n_nodes)

    def measured_at(self, group: GroupPlacement) -> bool:
        return (self.n_ranks, self.ranks_per_node, self.n_nodes) == (group.n_ranks, group.ranks_per_node, group.n_nodes)

    def stands_at(self, group: GroupPlacement, size_bytes: float | None = None) -> bool:
        """Measured at this placement with the tuner free to choose: the price there (a forced algorithm's is not),
        from its smallest measured size up (below it the fit's intercept is no measurement: `covers`)."""
        return self.algorithm is None and self.measured_at(group) and (size_bytes is None or self.covers(size_bytes))

    def covers(self, size_bytes: float) -> bool:
        """Whether size_bytes is at or above the smallest size the curve was fitted to (True when not recorded)."""
        first = self.segments[0].first_bytes if self.segments else 0
        return not first or size_bytes >= first * (1.0 - 1e-9)

    def time_s(self, size_bytes: float) -> float:
        """Seconds at the measured placement."""
        return self.priced(size_bytes, lambda seg, s: seg.alpha_s + bus_factor(self.kind, self.n_ranks) * s
                           / seg.busbw_bytes_per_s)

    def priced(self, size_bytes: float, price: Callable[[CurveSegment, float], float]) -> float:
        """price(segment, size) with the segment holding size_bytes, continuous across segments: between the largest
        measured size of one segment and the smallest of the next, where nothing was measured, the time is
        interpolated log-log between the two segments' own times at those sizes (each segment's line jumping to the
        next at a boundary made a larger message cheaper than a smaller one)."""
        segs = self.segments
        i = max(k for k, seg in enumerate(segs) if k == 0 or size_bytes >= seg.min_bytes)
        # never below where a lower segment ended: a segment fitted to a noisy latency-bound sweep can start lower
        # than the one before it ended, and a larger message would be cheaper than a smaller one
        floor = max((price(seg, float(seg.last_bytes or segs[k + 1].min_bytes)) for k, seg in enumerate(segs[:i])),
                    default=0.0)
        for lo_seg, hi_seg in [(segs[k], segs[k + 1]) for k in (i - 1, i) if 0 <= k < len(segs) - 1]:
            if not (lo_seg.last_bytes and hi_seg.first_bytes):
                continue
            lo, hi = float(lo_seg.last_bytes), float(hi_seg.first_bytes)
            if lo < size_bytes < hi:
                t_lo, t_hi = price(lo_seg, lo), price(hi_seg, hi)
                w = math.log(size_bytes / lo) / math.log(hi / lo)
                return max(floor, t_lo, math.exp((1.0 - w) * math.log(t_lo) + w * math.log(t_hi)))
        return max(floor, price(segs[i], size_bytes))


@dataclass(frozen=True)
class Fabric:
    """The tiers of one cluster, analytic (from specs) unless overridden by fitted values (`with_fit`)."""

    gpus_per_node: int
    intra: TierParams
    inter: TierParams
    intra_topology: Literal["mesh", "switch"] = "switch"
    intra_links_per_gpu: int = 1
    inter_topology: Literal["rail_optimized", "fat_tree"] = "rail_optimized"
    oversubscription: float = 1.0
    curves: tuple[MeasuredCurve, ...] = ()
    intra_line_rate_bytes_per_s: float | None = None  # the datasheet link rate (a ring cannot beat it); None: unknown
    # the fabric the curves were measured on, where it differs from this one (a shipped calibration priced for a
    # cluster with other NICs or links: `projection.cost.calibrated`); None: measured on this one
    measured_on: Fabric | None = None

    @classmethod
    def from_specs(cls, device: DeviceSpec, cluster: ClusterSpec, *, efficiency: float = 1.0,
                   nic_gpus: int | None = None) -> Fabric:
        """Tiers from the datasheet links: intra = the device's link bandwidth x the bus-bandwidth fraction a ring
        reaches on it (`intra_node.efficiency`, line rate when absent) and its latency; inter = NICs per node x NIC
        bandwidth x the bus-bandwidth fraction the NIC reaches (`nic.efficiency`, line rate when absent) / the GPUs
        sharing them, NIC latency. Those GPUs are the device's own node (`nic_gpus` None): a cluster of another
        number of GPUs per node keeps each GPU's NIC share (rail-optimised nodes give each GPU its NIC), unless the
        NIC count itself is stated for the cluster's node (`nic_gpus` = its GPUs). efficiency (0-1] further scales
        both bandwidths (1.0 = the tiers as just described)."""
        if not 0 < efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
        link, nic = device.intra_node, device.nic
        achieved = nic.bandwidth_bytes_per_s * (nic.efficiency if nic.efficiency is not None else 1.0)
        per_gpu_nic = nic.count_per_node * achieved / (nic_gpus or device.gpus_per_node)
        ring = link.bandwidth_per_direction_bytes_per_s * (link.efficiency if link.efficiency is not None else 1.0)
        return cls(gpus_per_node=cluster.gpus_per_node,
                   intra_line_rate_bytes_per_s=link.bandwidth_per_direction_bytes_per_s,
                   intra=TierParams(link.latency_s, ring * efficiency),
                   inter=TierParams(nic.latency_s, per_gpu_nic * efficiency),
                   intra_topology=link.topology, intra_links_per_gpu=link.links_per_gpu,
                   inter_topology=cluster.inter_node_topology, oversubscription=cluster.oversubscription)

    def with_fit(self, tiers: Mapping[str, TierParams] | None = None, curves: Sequence[MeasuredCurve] = ()) -> Fabric:
        """A copy with fitted tier parameters and measured curves (replacing curves of the same kind and placement)."""
        tiers = tiers or {}
        unknown = set(tiers) - set(TIERS)
        if unknown:
            raise ValueError(f"unknown tiers {sorted(unknown)}; expected {TIERS}")
        keys = {(c.kind, c.n_ranks, c.n_nodes) for c in curves}
        kept = tuple(c for c in self.curves if (c.kind, c.n_ranks, c.n_nodes) not in keys)
        return replace(self, intra=tiers.get("intra_node", self.intra), inter=tiers.get("inter_node", self.inter),
                       curves=kept + tuple(curves))

    def curve_for(self, kind: str, group: GroupPlacement) -> MeasuredCurve | None:
        """The measured curve of this kind on the group's tier closest to its placement, or None."""
        same = [c for c in self.curves if c.kind == kind and c.placement.tier == group.tier]
        if not same:
            return None
        return min(same, key=lambda c: (abs(math.log(c.n_ranks / group.n_ranks)) + abs(math.log(c.n_nodes /
                   group.n_nodes)) + abs(math.log(c.ranks_per_node / group.ranks_per_node))))

    def intra_bandwidth(self, ranks_on_node: int) -> float:
        """Bytes/s one GPU can send to the other ranks_on_node - 1 group members on its node (inf if alone)."""
        if ranks_on_node <= 1:
            return math.inf
        if self.intra_topology == "switch":
            return self.intra.beta_bytes_per_s
        return self.intra.beta_bytes_per_s * min(ranks_on_node - 1, self.intra_links_per_gpu) / self.intra_links_per_gpu

    def pair_bandwidth(self, same_node: bool) -> float:
        """Bytes/s between two GPUs: one link of a mesh, the full port of a switch, or one GPU's NIC share."""
        if not same_node:
            return self.nic_bandwidth(rail_aligned=True)
        return self.intra.beta_bytes_per_s / (self.intra_links_per_gpu if self.intra_topology == "mesh" else 1)

    def nic_bandwidth(self, rail_aligned: bool) -> float:
        """Bytes/s per GPU across nodes; divided by the oversubscription when the traffic crosses the upper tier."""
        crosses_spine = self.inter_topology == "fat_tree" or not rail_aligned
        return self.inter.beta_bytes_per_s / (self.oversubscription if crosses_spine else 1.0)


def algorithm_times_s(kind: CollectiveKind, size_bytes: float, group: GroupPlacement,
                      fabric: Fabric) -> dict[str, float]:
    """Seconds of each algorithm that applies to this kind and placement (analytic model, tier parameters only)."""
    n, r, m = group.n_ranks, group.ranks_per_node, group.n_nodes
    if n < 2 or size_bytes <= 0:
        return {"ring": 0.0}
    alpha = fabric.inter.alpha_s if m > 1 else fabric.intra.alpha_s
    if kind == "send_recv":
        return {"ring": alpha + size_bytes / fabric.pair_bandwidth(same_node=m == 1)}
    out = {"ring": ring_steps(kind, n) * alpha + bus_factor(kind, n) * size_bytes / _flat_bus_bandwidth(kind, group,
                                                                                                        fabric)}
    if kind == "all_reduce":  # the only kind NCCL / RCCL run other than as a ring (module docstring)
        out["tree"] = 2 * math.ceil(math.log2(n)) * alpha + 2.0 * size_bytes / _flat_ring_bandwidth(group, fabric)
        if m > 1 and r > 1:
            out["hierarchical"] = _hierarchical_all_reduce_s(size_bytes, r, m, fabric)
    return out


def collective_time_s(kind: CollectiveKind, size_bytes: float, group: GroupPlacement, fabric: Fabric,
                      algorithm: Algorithm = "auto") -> float:
    """Seconds for one collective of `size_bytes` (nccl-tests size convention) over `group` on `fabric`.

    auto: from the measured curve of this kind on the group's tier if the fabric holds one, else the fastest
    analytic algorithm. An explicit algorithm always uses the analytic model (ValueError if it does not apply)."""
    if group.n_ranks < 2 or size_bytes <= 0:
        return 0.0
    if algorithm == "auto":
        curve = fabric.curve_for(kind, group)
        if curve is not None:
            return curve_time_s(curve, size_bytes, group, fabric)
        return min(algorithm_times_s(kind, size_bytes, group, fabric).values())
    times = algorithm_times_s(kind, size_bytes, group, fabric)
    if algorithm not in times:
        raise ValueError(f"algorithm {algorithm!r} does not apply to {kind} over {group}; choose from {sorted(times)}")
    return times[algorithm]


def flat_bus_bandwidth(kind: str, group: GroupPlacement, fabric: Fabric) -> float:
    """Analytic bus bandwidth (bytes/s) of the flat ring (direct exchange for all_to_all, one hop for send_recv)."""
    if kind == "send_recv":
        return fabric.pair_bandwidth(same_node=group.n_nodes == 1)
    return _flat_bus_bandwidth(kind, group, fabric)


def _flat_ring_bandwidth(group: GroupPlacement, fabric: Fabric) -> float:
    """Slowest hop of a ring over the group: intra-node links of r ranks, or the r NICs of a node together."""
    bw = fabric.intra_bandwidth(group.ranks_per_node)
    if group.n_nodes > 1:
        bw = min(bw, group.ranks_per_node * fabric.nic_bandwidth(group.rail_aligned))
    return bw


def _flat_bus_bandwidth(kind: str, group: GroupPlacement, fabric: Fabric) -> float:
    if kind != "all_to_all":
        return _flat_ring_bandwidth(group, fabric)
    n, r = group.n_ranks, group.ranks_per_node
    intra_s = (r - 1) / n / fabric.intra_bandwidth(r) if r > 1 else 0.0  # seconds per byte of S, concurrent
    inter_s = (n - r) / n / fabric.nic_bandwidth(group.rail_aligned) if group.n_nodes > 1 else 0.0
    return bus_factor(kind, n) / max(intra_s, inter_s)


def _hierarchical_all_reduce_s(size: float, r: int, m: int, fabric: Fabric) -> float:
    """Intra-node reduce-scatter and all-gather over r ranks around an inter-node all-reduce of size / r per rail
    over m nodes."""
    a_i, b_i = fabric.intra.alpha_s, fabric.intra_bandwidth(r)
    a_e, b_e = fabric.inter.alpha_s, fabric.nic_bandwidth(rail_aligned=True)
    intra_half = (r - 1) * a_i + (r - 1) / r * size / b_i  # one reduce-scatter or all-gather inside the node
    return 2 * intra_half + 2 * (m - 1) * a_e + 2 * (m - 1) / m * (size / r) / b_e


def curve_time_s(curve: MeasuredCurve, size: float, group: GroupPlacement, fabric: Fabric,
                 as_measured: bool = False) -> float:
    """Seconds of `size` over `group` priced from `curve` (what collective_time_s does with the curve it picks);
    as_measured: of the curve's own algorithm alone, not the fastest of the tuner's."""
    return curve.priced(size, lambda seg, s: _scaled_segment_time_s(curve, seg, s, group, fabric, as_measured))


def _scaled_segment_time_s(curve: MeasuredCurve, seg: CurveSegment, size: float, group: GroupPlacement,
                           fabric: Fabric, as_measured: bool = False) -> float:
    ref = curve.placement
    n = group.n_ranks
    # A sweep is taken on a few nodes under one leaf switch: its bandwidth carries no oversubscription of the upper
    # tier, which the cluster's own oversubscription then divides wherever the group's traffic crosses that tier.
    # Measured on another fabric (other NICs or links than this cluster's), its bandwidth scales by the ratio of the
    # two fabrics' analytic bandwidths at the measured placement and this one.
    measured_on = fabric.measured_on or fabric
    if measured_on.oversubscription != 1.0:
        measured_on = replace(measured_on, oversubscription=1.0)
    here = curve.stands_at(group, size) or (as_measured and curve.measured_at(group))
    if here and measured_on is fabric:
        return seg.alpha_s + bus_factor(curve.kind, n) * size / seg.busbw_bytes_per_s
    latency_scale = ring_steps(curve.kind, n) / max(ring_steps(curve.kind, ref.n_ranks), 1)
    # another cluster's latency (a what-if of the device): each of the ring's steps across the tier the group
    # crosses takes the difference of the two clusters' per-step latencies on top of what was measured
    tier, then = (fabric.intra, measured_on.intra) if group.n_nodes == 1 else (fabric.inter, measured_on.inter)
    added_s = ring_steps(curve.kind, n) * (tier.alpha_s - then.alpha_s)
    ref_busbw = flat_bus_bandwidth(curve.kind, ref, measured_on)
    bandwidth_scale = flat_bus_bandwidth(curve.kind, group, fabric) / ref_busbw
    ring = max(0.0, seg.alpha_s * latency_scale + added_s) \
        + bus_factor(curve.kind, n) * size / (seg.busbw_bytes_per_s * bandwidth_scale)
    if here or as_measured:  # the measured algorithm: only the upper tier's oversubscription slows it at its placement
        return ring
    # Away from the measured placement NCCL's tuner may pick another algorithm (tree, hierarchical: far fewer latency
    # steps on large groups), and at it too where the sweep forced one: NCCL_ALGO zeroes the others' bandwidth, the
    # tuner takes the least time over every algorithm (NVIDIA/nccl src/graph/tuning.cc ncclTopoTuneModel,
    # ncclTopoGetAlgoTime). The curve prices its own algorithm (the ring when the tuner chose; the scaling above is a
    # ring's), the others are priced analytically on tiers derated by the curve's measured efficiency: each time is
    # latency + bytes / bandwidth, so every bandwidth times eff is size / eff bytes on the fabric's own tiers.
    eff = min(1.0, seg.busbw_bytes_per_s / ref_busbw)
    measured = curve.algorithm or "ring"
    others = [t for name, t in algorithm_times_s(curve.kind, size / eff, group, fabric).items() if name != measured]
    return min([ring, *others])
