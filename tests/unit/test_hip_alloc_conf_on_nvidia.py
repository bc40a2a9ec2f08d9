"""PYTORCH_HIP_ALLOC_CONF is read by ROCm builds of PyTorch only (c10's CUDA allocator config reads it under
USE_ROCM): on an NVIDIA device a file's is ignored, as PyTorch ignores it, and `--set env.` of it is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.errors import ProjectionError

CASE = (Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "megatron" /
        "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading" / "model_config.yaml")
pytestmark = pytest.mark.skipif(not CASE.exists(), reason="../shared/fixtures is absent (a user's clone)")


def test_set_of_the_hip_variable_on_nvidia_is_refused_and_read_on_amd() -> None:
    hip = ["env.PYTORCH_HIP_ALLOC_CONF=expandable_segments:False"]
    with pytest.raises(ProjectionError, match="does not read PYTORCH_HIP_ALLOC_CONF") as err:
        api.load(CASE, hardware="h100-sxm", gpus_per_node=8, overrides=hip)
    assert err.value.problems[0].key == "--set env.PYTORCH_HIP_ALLOC_CONF"
    amd = api.load(CASE, hardware="mi300x", gpus_per_node=8, overrides=hip)
    assert amd.training.kernels.expandable_segments is False  # it states the allocator there


def test_a_files_hip_variable_is_ignored_on_nvidia(tmp_path: Path) -> None:
    text = CASE.read_text()
    assert "PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True" in text
    both = tmp_path / "model_config.yaml"
    both.write_text(text.replace("PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True",
                                 "PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True\n"
                                 "  PYTORCH_HIP_ALLOC_CONF: expandable_segments:False"))
    nvidia = api.load(both, hardware="h100-sxm", gpus_per_node=8)
    assert nvidia.training.kernels.expandable_segments is True
    with pytest.raises(ProjectionError, match="disagree on expandable segments"):
        api.load(both, hardware="mi300x", gpus_per_node=8)  # a ROCm build reads both
