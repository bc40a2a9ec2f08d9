"""Activation offloading in a native (or HF) scenario: its plan fields are Megatron-Core's two mechanisms, checked by
Megatron-Core's rules (specs/validate.py), and now applied as in a Megatron-family job instead of accepted and
ignored (memory/offload.py)."""

from __future__ import annotations

from pathlib import Path

from projection import api
from projection.memory.estimate import estimate_memory
from projection.perf import project

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3.1_70B-mi300x.yaml"
FLAT = ["plan.tp=8", "plan.pp=1", "plan.vpp=1", "plan.recompute.granularity=none"]


def _load(*extra: str) -> api.Scenario:
    return api.load(EXAMPLE, overrides=[*FLAT, *extra])


def test_offloading_lowers_the_gpu_peak_as_in_a_megatron_job() -> None:
    plain, layers = _load(), _load("plan.offload.activation_layers=40")
    modules = _load("plan.offload.activation_modules=[core_attn,qkv_linear]")
    base = estimate_memory(plain).ranks[0]
    for sc in (layers, modules):
        got = estimate_memory(sc).ranks[0]
        assert got.bytes["activations"] < base.bytes["activations"] and got.cpu_bytes > 0
        # the same bytes as the same plan labelled a Megatron-LM job
        as_megatron = estimate_memory(sc.model_copy(update={"framework": "megatron"})).ranks[0]
        assert got.terms["activations.dense_layers"] == as_megatron.terms["activations.dense_layers"]
    assert project(layers).breakdown_s["offload"] >= 0.0 and project(layers).comm_total_s.get("offload", 0.0) > 0.0


def test_torchtitan_has_no_activation_offloading() -> None:
    toml = Path(__file__).resolve().parents[2] / "benchmarks" / "torchtitan_runs" / "t1_llama31_8b_fsdp8.toml"
    sc = api.load(toml)
    plan = sc.plan.model_copy(update={"offload": sc.plan.offload.model_copy(update={"activation_layers": 4})})
    assert estimate_memory(sc.model_copy(update={"plan": plan})).ranks[0].cpu_bytes == \
        estimate_memory(sc).ranks[0].cpu_bytes
