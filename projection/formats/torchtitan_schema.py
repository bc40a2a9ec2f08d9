"""TorchTitan JobConfig schema: the known sections and keys, schedule and converter names, and a typed reader of a
nested job config that collects problems with their file/line/key instead of raising one at a time.

Sources: pytorch/torchtitan @v0.2.2 `torchtitan/config/job_config.py` and v0.1.0 `torchtitan/config_manager.py`, as
summarised in shared/reference/config-formats.md §3.1-§3.2.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from projection.errors import Problem
from projection.specs.scenario import Origin

# Top-level sections of JobConfig (v0.2.2 torchtitan/config/job_config.py, v0.1 config_manager.py) plus Primus's
# `primus_turbo` (config-formats.md §3.6). Only the sections in STRICT_KEYS have their keys checked.
KNOWN_SECTIONS = frozenset({
    "job", "profiling", "metrics", "model", "optimizer", "lr_scheduler", "training", "parallelism", "checkpoint",
    "activation_checkpoint", "compile", "quantize", "float8", "mx", "comm", "memory_estimation", "fault_tolerance",
    "experimental", "validation", "debug", "primus_turbo",
})
STRICT_KEYS: dict[str, frozenset[str]] = {
    "model": frozenset({"name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion",
                        "norm_type"}),
    "training": frozenset({
        "dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
        "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq", "gc_debug",
        "dataloader",
        "compile", "seed", "deterministic",  # v0.1
        "mock_data",  # Primus extension (config-formats.md §3.6)
    }),
    "parallelism": frozenset({
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
        "tensor_parallel_degree", "disable_loss_parallel", "enable_async_tensor_parallel", "pipeline_parallel_degree",
        "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
        "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
        "pipeline_parallel_expert_parallel_overlap", "context_parallel_degree", "context_parallel_rotate_method",
        "context_parallel_load_balancer", "expert_parallel_degree", "expert_tensor_parallel_degree",
        "expert_parallel_comm_backend",
        "pipeline_parallel_split_points", "enable_compiled_autograd",  # v0.1
    }),
    "activation_checkpoint": frozenset({
        "mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop", "memory_budget",
        "visualize_memory_budget_pareto", "preserve_rng_state", "determinism_check", "debug",
    }),
    "optimizer": frozenset({"name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation",
                            "early_step_in_backward",
                            "fused"}),  # 2024 releases
}
# torch.distributed.pipelining schedule names (matched case-insensitively, as get_schedule_class does) ->
# (canonical schedule, multi-stage). LoopedBFS (breadth-first looped) is gpipe with vpp = stages per rank.
# InterleavedZeroBubble (input/weight gradients split over a looped placement) has no canonical schedule: zb_h1/zb_h2
# run one stage per rank; the loader refuses it by name (UNMODELLED_SCHEDULES).
SCHEDULES: dict[str, tuple[str, bool]] = {
    "gpipe": ("gpipe", False), "1f1b": ("1f1b", False), "interleaved1f1b": ("interleaved_1f1b", True),
    "loopedbfs": ("gpipe", True), "zbvzerobubble": ("zbv", True), "dualpipev": ("dualpipev", True),
}
UNMODELLED_SCHEDULES = {"interleavedzerobubble": "InterleavedZeroBubble"}
# projection's schedule names -> TorchTitan's pipeline_parallel_schedule value (`--schedule NAME` on a TorchTitan job
# is that key: the loader then derives the stages per rank the schedule runs, as TorchTitan does)
TORCHTITAN_SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B",
                             "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
FLOAT8_LINEAR_CONVERTERS = frozenset({"float8", "quantize.linear.float8", "quantize.dense.float8"})
MX_LINEAR_CONVERTERS = frozenset({"mx", "quantize.linear.mx", "quantize.dense.mx"})
# MoE grouped-GEMM quantization: projected with a linear converter (Fp8Spec.grouped_experts); alone with modules in
# its fqns it leaves the dense linears in bf16, which Fp8Spec has no scope for (refused, torchtitan_fp8.read_fp8);
# with empty fqns it converts nothing. Primus's kernel-swap converter changes no dtype.
GROUPED_CONVERTERS = frozenset({"quantize.grouped_mm.float8", "quantize.grouped_mm.mx", "quantize.moe.float8",
                                "quantize.moe.mx"})
OTHER_CONVERTERS = GROUPED_CONVERTERS | {"primus_turbo"}
KNOWN_CONVERTERS = FLOAT8_LINEAR_CONVERTERS | MX_LINEAR_CONVERTERS | OTHER_CONVERTERS
_MISSING = object()


JOB_CONFIG_DEFAULT = "default (TorchTitan JobConfig)"

class JobReader:
    """Typed access to a nested job config; every problem is collected (never raised one at a time)."""

    def __init__(self, cfg: Mapping[str, Any], origins: Mapping[str, Origin], source: str):
        self.cfg, self.origins, self.source = cfg, origins, source
        self.problems: list[Problem] = []

    def get(self, key: str, default: Any = None) -> Any:
        """Value at dotted `key`; `default` when absent or null (YAML null = TorchTitan's default)."""
        node: Any = self.cfg
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return default if node is None else node

    def has(self, key: str) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def origin(self, key: str) -> Origin:
        """Where `key` was written; for a table, its first line; for an absent key, TorchTitan's JobConfig default
        (as Megatron's argparse defaults are labelled)."""
        if key in self.origins:
            return self.origins[key]
        below = [o for k, o in self.origins.items() if k.startswith(key + ".")]
        if below:
            first = min(below, key=lambda o: (o.line is None, o.line or 0))
            return Origin(first.file, first.line, key)
        return Origin(JOB_CONFIG_DEFAULT, None, key)

    def problem(self, key: str, message: str, fix: str) -> None:
        o = self.origin(key)
        file = self.source if o.file == JOB_CONFIG_DEFAULT else o.file  # an absent key: the file it belongs in
        self.problems.append(Problem(message, key=key, file=file, line=o.line, fix=fix))

    def integer(self, key: str, default: int, *, minimum: int = 1, also: tuple[int, ...] = ()) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or (value < minimum and value not in also):
            want = f"an integer >= {minimum}" + "".join(f" or {a}" for a in also)
            self.problem(key, f"expected {want}, got {value!r}", f"set {key} to {want}")
            return default
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.get(key, default)
        if value not in choices:
            self.problem(key, f"{value!r} is not one of {', '.join(map(repr, choices))}",
                         f"set {key} to one of: {', '.join(choices)}")
            return default
        return str(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.problem(key, f"expected true or false, got {value!r}", f"set {key} to true or false")
            return default
        return value


def _did_you_mean(word: str, options: frozenset[str]) -> str:
    close = difflib.get_close_matches(word, sorted(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_schema(job: JobReader) -> None:
    """Unknown top-level sections, non-table sections, and unknown keys in the modelled sections."""
    for section, body in job.cfg.items():
        if section not in KNOWN_SECTIONS:
            job.problem(section, f"unknown section [{section}]{_did_you_mean(section, KNOWN_SECTIONS)}",
                        "remove it or fix its spelling; TorchTitan sections: " + ", ".join(sorted(KNOWN_SECTIONS)))
        elif not isinstance(body, Mapping):
            job.problem(section, f"[{section}] must be a table of keys, got {body!r}",
                        f"write it as a [{section}] table")
        elif section in STRICT_KEYS:
            known = STRICT_KEYS[section]
            for key in body:
                if key not in known:
                    job.problem(f"{section}.{key}", f"unknown key in [{section}]{_did_you_mean(key, known)}",
                                f"remove it or fix its spelling; known keys: {', '.join(sorted(known))}")
