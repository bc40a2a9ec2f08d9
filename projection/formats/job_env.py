"""The job's environment variables that change what projection computes, wherever they are written: a Megatron
functional test's `ENV_VARS:`, the assignments and exports of a launch script, or `--set env.NAME=VALUE` in any format
(the environment of the machine running projection is never read: it is not the training job's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from projection.errors import Problem
from projection.specs.scenario import Origin
from projection.units import ALLOC_CONF_VARS, alloc_conf_expandable_segments, parse_cublas_workspace_config

# the names read, and what each sets
READ = {"CUBLAS_WORKSPACE_CONFIG": "training.kernels.gemm_workspace_bytes",
        **{name: "training.kernels.expandable_segments" for name in ALLOC_CONF_VARS}}


def job_environment(variables: Mapping[str, tuple[str, Origin]], problems: list[Problem]
                    ) -> dict[str, tuple[Any, Origin]]:
    """The job environment variables projection reads (name -> (value, where it was set)) -> canonical keys:
    CUBLAS_WORKSPACE_CONFIG -> training.kernels.gemm_workspace_bytes; expandable_segments of the first of
    PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF, PYTORCH_HIP_ALLOC_CONF that is set ->
    training.kernels.expandable_segments. A value PyTorch would refuse is a problem."""
    out: dict[str, tuple[Any, Origin]] = {}
    ws = variables.get("CUBLAS_WORKSPACE_CONFIG")
    if ws is not None and parse_cublas_workspace_config(ws[0]) is not None:
        out["training.kernels.gemm_workspace_bytes"] = (parse_cublas_workspace_config(ws[0]), ws[1])
    for name in ALLOC_CONF_VARS:
        if name not in variables:
            continue
        value, origin = variables[name]
        try:
            expandable = alloc_conf_expandable_segments(value)
        except ValueError as e:
            problems.append(Problem(f"{name}: {e}", key=origin.key or name, file=origin.file, line=origin.line,
                                    fix="write expandable_segments:True or expandable_segments:False"))
            break
        if expandable is not None:
            out["training.kernels.expandable_segments"] = (expandable, origin)
        break  # PyTorch reads the first of them that is set, and only that one
    return out
