"""CUDA-graph capture is read from every Megatron-family config and said in the performance notes, not modelled
(formats/megatron_kernels.cuda_graphs, perf/project._unmodelled)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from projection import api
from projection.perf import project

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT.parent / "shared" / "fixtures"
CASE = FIXTURES / "megatron" / "gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer" / "model_config.yaml"
BRIDGE = ROOT / "benchmarks" / "bridge_runs" / "perf_llama3_8b_8xh100_fp8cs.yaml"


def _notes(path: Path, overrides: list[str]) -> list[str]:
    sc = api.load(path, hardware="h100-sxm", gpus_per_node=8, overrides=overrides)
    return [n for n in project(sc).notes if n.startswith("CUDA graphs")]


@pytest.mark.skipif(not CASE.exists(), reason="../shared/fixtures is absent (a user's clone)")
@pytest.mark.parametrize(("overrides", "said"), [
    ([], None),
    (["cuda_graph_impl=transformer_engine", "cuda_graph_scope=attn mlp"],
     "CUDA graphs (transformer_engine, attn, mlp)"),
    (["enable_cuda_graph=true"], "CUDA graphs (local, whole layers)"),  # deprecated: Megatron-Core maps it to local
    (["external_cuda_graph=true"], "CUDA graphs (transformer_engine, whole layers)"),
    (["cuda_graph_impl=local", "cuda_graph_scope=full_iteration"], "CUDA graphs (local, full_iteration)"),
    (["cuda_graph_impl=local", "cuda_graph_scope=full"], "CUDA graphs (local, whole layers)"),
])
def test_megatron_flags(overrides: list[str], said: str | None) -> None:
    notes = _notes(CASE, overrides)
    assert (notes[0].split(" not modelled")[0] if notes else None) == said


def test_bridge_field() -> None:
    text = BRIDGE.read_text()
    assert "cuda_graph_impl: none" in text
    assert _notes(BRIDGE, []) == []
    graphed = _notes(BRIDGE, ["model.cuda_graph_impl=transformer_engine"])
    assert graphed and graphed[0].startswith("CUDA graphs (transformer_engine, whole layers) not modelled")


@pytest.mark.skipif(not CASE.exists(), reason="../shared/fixtures is absent (a user's clone)")
def test_an_unknown_implementation_is_refused_with_its_key() -> None:
    run = subprocess.run([sys.executable, "-m", "projection", "performance", "--config", str(CASE), "--hardware",
                          "h100-sxm", "--gpus-per-node", "8", "--set", "cuda_graph_impl=graphs"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "cuda_graph_impl" in run.stderr and "use none, local or transformer_engine" in run.stderr
