"""The layout search's candidates for frameworks whose own rules follow the layout: each candidate is the config
loaded again with the framework's own keys for that layout (`Reload`), so its loader re-derives every rule.

TorchTitan derives sequence parallelism, the DTensor TP style, async TP, expert TP, FSDP and its resharding, the
pipeline stages, their layer split and the pipeline microbatch from its `[parallelism]` and `[training]` keys
(formats/torchtitan.py); Primus's pipeline patches pick the schedule and refuse layouts from the pipeline size
(formats/megatron.py `_zero_bubble_rules`). Re-deriving those rules beside the loaders would be a second, drifting
copy; loading the same file with `--set` is what a user would run, and what `tests/unit/test_search_layouts.py`
compares against.

Keys per candidate (`layout_overrides`), each only where the value differs from the config's own:
- TorchTitan: `parallelism.tensor_parallel_degree`, `.pipeline_parallel_degree`, `.context_parallel_degree`,
  `.expert_parallel_degree` (MoE models); the micro batch is `parallelism.pipeline_parallel_microbatch_size` with a
  pipeline and `training.local_batch_size` without one (TorchTitan's meaning of each); `training.global_batch_size`
  holds the config's global batch; `activation_checkpoint.mode` the recompute granularity (selective keeps the
  file's `selective_ac_option`). A file that fixes `data_parallel_shard_degree` keeps it (a layout it no longer
  fills is refused by the loader, saying so); its stages per rank follow the schedule and
  `pipeline_parallel_layers_per_stage`, so the vpp axis is not searched.
- Primus (Megatron argument names): `tensor_model_parallel_size`, `pipeline_model_parallel_size`,
  `context_parallel_size`, `expert_model_parallel_size`, `micro_batch_size`, `global_batch_size`; for another
  pipeline, `num_virtual_stages_per_pipeline_rank` (the other two vpp spellings and the first/last-stage layer counts
  cleared, as the native search drops a split fixed for another pp); recompute as `recompute_granularity`,
  `recompute_method`, `recompute_num_layers` (Megatron's defaults where the file has none: perf/search.py `_recompute`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from projection.errors import COMMAND_LINE, Problem
from projection.specs.plan import RecomputeSpec
from projection.specs.scenario import Scenario

Reload = Callable[[Mapping[str, Any]], Scenario]


def needs_reload(sc: Scenario) -> bool:
    """Whether the search builds this framework's candidates by loading the config again (module docstring)."""
    return "torchtitan" in sc.framework or sc.framework.startswith("primus")


def layout_overrides(sc: Scenario, tp: int, pp: int, vpp: int, cp: int, ep: int, mbs: int | None,
                     recompute: RecomputeSpec) -> dict[str, Any] | list[Problem]:
    """The framework's own keys that turn the config into this layout (module docstring), or why it cannot.
    mbs None: the micro batch the config gives that layout (not searched)."""
    base, gbs = sc.plan, sc.training.resolved_global_batch(sc.plan.dp_())
    if "torchtitan" in sc.framework:
        return _torchtitan(sc, tp, pp, vpp, cp, ep, mbs, recompute, gbs)
    out: dict[str, Any] = {"global_batch_size": gbs}
    for key, value, own in (("tensor_model_parallel_size", tp, base.tp), ("pipeline_model_parallel_size", pp, base.pp),
                            ("context_parallel_size", cp, base.cp), ("expert_model_parallel_size", ep, base.ep),
                            ("micro_batch_size", mbs, sc.training.micro_batch_size)):
        if value is not None and value != own:
            out[key] = value
    if (pp, vpp) != (base.pp, base.vpp_):
        out.update(num_virtual_stages_per_pipeline_rank=vpp if vpp > 1 else None,
                   num_layers_per_virtual_pipeline_stage=None, pipeline_model_parallel_layout=None,
                   decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None)
    if recompute != base.recompute:
        out.update(recompute_activations=False, recompute_granularity=None if recompute.granularity == "none"
                   else recompute.granularity, recompute_method=recompute.method,
                   recompute_num_layers=recompute.num_layers)
        if recompute.granularity == "selective":
            out["recompute_modules"] = list(recompute.modules)
    return out


def _torchtitan(sc: Scenario, tp: int, pp: int, vpp: int, cp: int, ep: int, mbs: int | None,
                recompute: RecomputeSpec, gbs: int) -> dict[str, Any] | list[Problem]:
    base, p = sc.plan, "parallelism"
    problems = []
    if vpp != base.vpp_:
        problems.append(Problem("TorchTitan derives the stages per rank from the schedule and "
                                "pipeline_parallel_layers_per_stage; the search keeps them", key="--vpp",
                                file=COMMAND_LINE, fix="search with the file's vpp, or change "
                                "parallelism.pipeline_parallel_layers_per_stage with --set"))
    if ep != base.ep and not sc.model.moe:
        problems.append(Problem(f"ep {ep} on a dense model: it has no experts", key="--ep", file=COMMAND_LINE,
                                fix="search ep on a MoE model only"))
    if problems:
        return problems
    out: dict[str, Any] = {"training.global_batch_size": gbs}
    for key, value, own in (("tensor_parallel_degree", tp, base.tp), ("pipeline_parallel_degree", pp, base.pp),
                            ("context_parallel_degree", cp, base.cp), ("expert_parallel_degree", ep, base.ep)):
        if value != own:
            out[f"{p}.{key}"] = value
    if mbs is not None:  # TorchTitan's micro batch: the pipeline microbatch with a pipeline, else the local batch
        out[f"{p}.pipeline_parallel_microbatch_size" if pp > 1 else "training.local_batch_size"] = mbs
    if recompute.granularity != base.recompute.granularity:
        out["activation_checkpoint.mode"] = recompute.granularity
    return out
