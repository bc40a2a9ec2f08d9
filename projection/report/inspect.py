"""`projection inspect`: the resolved scenario with the origin of every value, and parameter counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from projection.specs.scenario import Scenario, origin_of
from projection.workload.params import RankParams, activated_params, model_params, per_rank_params


@dataclass(frozen=True)
class InspectReport:
    scenario: Scenario
    resolved: tuple[tuple[str, Any, str], ...]  # (dotted key, value, origin)
    derived: dict[str, Any]
    params_total: int
    params_by_component: dict[str, int]
    params_activated: int
    per_rank: tuple[RankParams, ...]

    def to_dict(self) -> dict[str, Any]:
        sc = self.scenario
        return {
            "source": sc.source,
            "framework": sc.framework,
            "model": sc.model.model_dump(mode="json"),
            "training": sc.training.model_dump(mode="json"),
            "plan": sc.plan.model_dump(mode="json"),
            "cluster": {"hardware": sc.cluster.device.name, "nodes": sc.cluster.nodes,
                        "gpus_per_node": sc.cluster.gpus_per_node, "world_size": sc.world_size,
                        "inter_node_topology": sc.cluster.inter_node_topology,
                        "oversubscription": sc.cluster.oversubscription,
                        "device_edits": {k[len("cluster.device."):]: v for k, v, _ in self.resolved
                                         if k.startswith("cluster.device.")}},
            "origins": {k: o for k, _, o in self.resolved},
            "derived": self.derived,
            "params": {
                "total": self.params_total,
                "by_component": self.params_by_component,
                "activated_per_token": self.params_activated,
                "per_rank": [{"pp_rank": r.pp_rank, "params": r.params, "by_component": r.by_component,
                              "layers": [r.layers[0], r.layers[-1]] if r.layers else [],
                              "num_layers": len(r.layers)} for r in self.per_rank],
            },
        }

    def to_table(self) -> str:
        lines = [f"Scenario: {self.scenario.source} ({self.scenario.framework})", ""]
        width = max(len(k) for k, _, _ in self.resolved)
        section = ""
        for key, value, origin in self.resolved:
            top = key.split(".")[0]
            if top != section:
                section = top
                lines.append(f"[{section}]")
            lines.append(f"  {key:<{width}}  {_fmt(value):<24}  {origin}")
        lines += ["", "[derived]"]
        lines += [f"  {k:<28} {_fmt(v)}" for k, v in self.derived.items()]
        lines += ["", "Parameters (whole model)", f"  {'total':<16} {_count(self.params_total)}"]
        lines += [f"  {k:<16} {_count(v)}" for k, v in self.params_by_component.items() if v]
        if self.scenario.model.moe is not None:
            lines.append(f"  {'activated/token':<16} {_count(self.params_activated)}")
        lines += ["", "Parameters per rank (after PP/VPP split and TP/EP/ETP sharding)",
                  f"  {'pp_rank':>7}  {'layers':>12}  {'params':>16}"]
        for r in self.per_rank:
            span = f"{r.layers[0]}-{r.layers[-1]}" if r.layers else "-"
            if r.layers and len(r.layers) != r.layers[-1] - r.layers[0] + 1:
                span = f"{len(r.layers)} layers"
            lines.append(f"  {r.pp_rank:>7}  {span:>12}  {_count(r.params):>16}")
        return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, tuple | list) and len(v) > 8:
        return f"[{len(v)} entries]"
    return str(v)


def _count(n: int) -> str:
    return f"{n:,} ({n / 1e9:.3f} B)"


def _flatten(prefix: str, value: Any, out: list[tuple[str, Any]]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out.append((prefix, value))


def _device_value(sc: Scenario, dotted: str) -> Any:
    """The value of field `cluster.device.<path>` of the scenario's (edited) device."""
    node: Any = sc.cluster.device.model_dump()
    for part in dotted.split(".")[2:]:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def build_inspect_report(sc: Scenario) -> InspectReport:
    flat: list[tuple[str, Any]] = []
    for name in ("model", "training", "plan"):
        _flatten(name, getattr(sc, name).model_dump(), flat)
    flat += [("cluster.hardware", sc.cluster.device.name), ("cluster.nodes", sc.cluster.nodes),
             ("cluster.gpus_per_node", sc.cluster.gpus_per_node),
             ("cluster.inter_node_topology", sc.cluster.inter_node_topology),
             ("cluster.oversubscription", sc.cluster.oversubscription)]
    # what-if edits of the device (--set cluster.device.*): each edited field as the projection uses it
    flat += [(k, _device_value(sc, k)) for k in sorted(sc.origins) if k.startswith("cluster.device.")]
    resolved = tuple((k, v, origin_of(sc, k)) for k, v in flat)
    m, p, t = sc.model, sc.plan, sc.training
    dp = p.dp_()
    derived: dict[str, Any] = {
        "world_size": sc.world_size, "dp": dp, "attention": m.attention_kind,
        "head_dim": m.head_dim_ if m.mla is None else m.mla.qk_head_dim + m.mla.qk_rope_head_dim,
        "kv_heads": m.kv_heads, "padded_vocab": m.padded_vocab(p.tp), "sequence_parallel": p.sp_,
        "global_batch": t.resolved_global_batch(dp), "microbatches_per_step": t.num_microbatches(dp),
        "pipeline_stages": p.pp * p.vpp_,
    }
    if m.moe is not None:
        derived.update({"moe_layers": m.num_moe_layers, "dense_layers": m.num_layers - m.num_moe_layers,
                        "edp": p.edp(), "experts_per_ep_rank": m.moe.num_experts // p.ep, "etp": p.etp_})
    by_comp = model_params(m, vocab_tp=p.tp)
    return InspectReport(
        scenario=sc, resolved=resolved, derived=derived, params_total=sum(by_comp.values()),
        params_by_component=by_comp, params_activated=activated_params(m, vocab_tp=p.tp),
        per_rank=tuple(per_rank_params(m, p)))
