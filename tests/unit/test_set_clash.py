"""Two --set keys that spell one quantity two ways and disagree are refused, naming both, whichever the loader
applies last. An audit ran a Bridge file with `--set plan.tp=8 --set model.tensor_model_parallel_size=2` and got tp 8
with no word of the other."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
BRIDGE = ROOT / "benchmarks" / "bridge_runs" / "perf_llama3_70b_64xh100_fp8cs.yaml"
MEGATRON = ROOT.parent / "shared/fixtures/megatron/gpt3_mcore_te_tp2_pp2_resume_torch_dist/model_config.yaml"


@pytest.mark.parametrize("path,own", [(BRIDGE, "model.tensor_model_parallel_size"),
                                      (MEGATRON, "tensor_model_parallel_size")])
def test_two_spellings_that_disagree_are_refused(path: Path, own: str) -> None:
    if not path.is_file():
        pytest.skip(f"{path} absent (the shared fixtures are not in a user's clone)")
    nodes = 8 if path == BRIDGE else 1
    with pytest.raises(ConfigError) as err:
        api.load(path, hardware="h100-sxm", nodes=nodes, overrides={own: 2, "plan.tp": 8})
    (clash,) = [p for p in err.value.problems if "both set plan.tp" in p.message]
    assert f"--set {own}=2" in clash.message and "--set plan.tp=8" in clash.message and clash.fix
    # the same value twice, or one of them, loads
    assert api.load(path, hardware="h100-sxm", nodes=nodes, overrides={own: 4, "plan.tp": 4}).plan.tp == 4
    assert api.load(path, hardware="h100-sxm", nodes=nodes, overrides={"plan.tp": 4}).plan.tp == 4
