"""TorchTitan's FP8 / MX model converters -> training.fp8 (Fp8Spec), for TorchTitan TOMLs and Primus TorchTitan jobs.

FP8 is on only when a float8 or MX linear converter is listed in `model.converters` (config-formats.md trap §8.2 #12).
Which library runs it decides what is kept in memory (Fp8Spec docstring):
* torchao (TorchTitan): tensorwise / rowwise float8 or MXFP8 on every nn.Linear its `filter_fqns` does not name
  (defaults: float8 [], MX ["output"]); fp8 all-gather only for tensorwise under FSDP, and TorchTitan's float8
  converter asserts away a named `recipe_name` together with `enable_fsdp_float8_all_gather`;
* Primus-Turbo (Primus TorchTitan with `primus_turbo.enable_primus_turbo` and `use_turbo_float8_linear` /
  `use_turbo_mx_linear`, both on by default): its float8 converter is always tensorwise and filters ["gate",
  "output"] itself, ignores the fp8 all-gather flag and the recipe name; its "mx" converter is blockwise fp8
  (block 128) on every nn.Linear, the output layer included, not MXFP8;
* grouped-GEMM converters (`quantize.grouped_mm.float8|mx`) convert the routed experts only when their `fqns` name
  modules (default [] converts nothing).
"""

from __future__ import annotations

from typing import Any

from projection.formats.torchtitan_schema import (
    FLOAT8_LINEAR_CONVERTERS,
    GROUPED_CONVERTERS,
    KNOWN_CONVERTERS,
    MX_LINEAR_CONVERTERS,
    JobReader,
)


def _converters(job: JobReader) -> list[str] | None:
    converters = job.get("model.converters", [])
    if isinstance(converters, str):  # CLI form: comma-separated
        converters = [c.strip() for c in converters.split(",") if c.strip()]
    if not isinstance(converters, list) or not all(isinstance(c, str) for c in converters):
        job.problem("model.converters", f"expected a list of names, got {converters!r}", 'e.g. converters = ["float8"]')
        return None
    for name in converters:
        if name not in KNOWN_CONVERTERS:
            job.problem("model.converters", f"unknown model converter {name!r}",
                        "use one of: " + ", ".join(sorted(KNOWN_CONVERTERS)))
    return converters


def _torchao_float8(job: JobReader, fsdp: bool, mla: bool, tp: int) -> dict[str, Any] | None:
    sec = "quantize.linear.float8" if job.has("quantize.linear.float8") or not job.has("float8") else "float8"
    named = job.get(f"{sec}.recipe_name", None)
    recipe = "tensorwise" if named is None else named
    if recipe not in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        job.problem(f"{sec}.recipe_name", f"unknown float8 recipe {recipe!r}", "use tensorwise, rowwise or "
                    "rowwise_with_gw_hp")
        return None
    want_gather = job.flag(f"{sec}.enable_fsdp_float8_all_gather", False)
    if named is not None and want_gather:
        # torchtitan/components/quantization/float8.py asserts this pair away ("... is not supported")
        job.problem(f"{sec}.enable_fsdp_float8_all_gather", "fp8 all-gather together with a named recipe_name "
                    f"({named!r}): TorchTitan refuses the pair", "drop recipe_name (tensorwise is the default and the "
                    "one fp8 all-gather works with) or turn enable_fsdp_float8_all_gather off")
        return None
    # TorchTitan's models take the float8 TP plan for a tensorwise recipe when the legacy converter name "float8" is
    # listed (v0.1 parallelize_llama: `enable_float8_tensorwise_tp = "float8" in job_config.model.converters and not
    # rowwise`); v0.2.2 registers only "quantize.linear.float8". It covers the attention and dense feed-forward
    # blocks (workload/ops.py); DeepSeek-V3 (MLA) raises NotImplementedError for it under TP
    tp_float8 = recipe == "tensorwise" and "float8" in (_converters(job) or [])
    if tp_float8 and mla and tp > 1:
        job.problem("model.converters", "float8 tensorwise TP on an MLA model (DeepSeek-V3): TorchTitan raises "
                    "NotImplementedError ('float8 tensorwise TP is not tested for deepseekv3')",
                    "use tensor_parallel_degree 1, a rowwise recipe, or no float8 converter")
        return None
    # tensorwise = e4m3 forward / e5m2 gradients (hybrid); rowwise recipes cast everything to e4m3
    return {"format": "hybrid" if recipe == "tensorwise" else "e4m3",
            "recipe": "tensorwise" if recipe == "tensorwise" else "rowwise",
            "param_gather": recipe == "tensorwise" and fsdp and want_gather, "library": "torchao",
            "output_layer": "output" not in (job.get(f"{sec}.filter_fqns", []) or []), "tp_float8": tp_float8}


def _torchao_mx(job: JobReader) -> dict[str, Any] | None:
    sec = "quantize.linear.mx" if job.has("quantize.linear.mx") or not job.has("mx") else "mx"
    recipe = str(job.get(f"{sec}.recipe_name", "mxfp8_cublas"))
    if "mxfp8" not in recipe:
        job.problem(f"{sec}.recipe_name", f"MX recipe {recipe!r} is not MXFP8; only fp8 GEMMs can be projected",
                    "use an mxfp8 recipe (e.g. mxfp8_cublas) or remove the mx converter")
        return None
    # MX block scales, e4m3 elements; torchao's mxfp8 linear, like Float8Linear, saves the high-precision input
    # (torchao 0.18 prototype/moe_training/mxfp8_linear.py: ctx.save_for_backward(input_hp, weight_hp))
    return {"format": "e4m3", "recipe": "mxfp8", "param_gather": False, "library": "torchao",
            "output_layer": "output" not in (job.get(f"{sec}.filter_fqns", ["output"]) or [])}


def read_fp8(job: JobReader, fsdp: bool, mla: bool = False, tp: int = 1) -> dict[str, Any] | None:
    """The training.fp8 table of a TorchTitan job (None without an FP8 linear converter); problems go to `job`.
    `mla`, `tp`: whether the model uses MLA and the TP degree (TorchTitan's float8 TP plan refuses the pair)."""
    converters = _converters(job)
    if converters is None:
        return None
    names = set(converters)
    turbo = job.flag("primus_turbo.enable_primus_turbo", False)
    fp8: dict[str, Any] | None = None
    if FLOAT8_LINEAR_CONVERTERS & names:
        if turbo and job.flag("primus_turbo.use_turbo_float8_linear", True):
            fp8 = {"format": "hybrid", "recipe": "tensorwise", "param_gather": False, "library": "primus_turbo",
                   "output_layer": False}
        else:
            fp8 = _torchao_float8(job, fsdp, mla, tp)
    elif MX_LINEAR_CONVERTERS & names:
        if turbo and job.flag("primus_turbo.use_turbo_mx_linear", True):
            fp8 = {"format": "e4m3", "recipe": "blockwise", "param_gather": False, "library": "primus_turbo",
                   "output_layer": True}
        else:
            fp8 = _torchao_mx(job)
    grouped = [c for c in GROUPED_CONVERTERS & names
               if job.get(f"quantize.grouped_mm.{c.rsplit('.', 1)[-1]}.fqns", []) or c.startswith("quantize.moe")]
    if fp8 is not None:
        fp8["grouped_experts"] = bool(grouped)
    elif grouped:
        # experts in fp8 and every nn.Linear in bf16: Fp8Spec has no scope without the linears (training.py)
        job.problem("model.converters", f"{', '.join(sorted(grouped))} without a float8 or MX linear converter (the "
                    "routed experts' grouped GEMMs in fp8, the dense linears in bf16) is not modelled",
                    "add the matching linear converter (quantize.linear.float8 or quantize.linear.mx: projected "
                    "with fp8 linears and experts), or empty the grouped converter's fqns (projected in bf16, "
                    "which is what TorchTitan then runs)")
    return fp8
