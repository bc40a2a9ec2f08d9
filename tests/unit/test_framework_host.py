"""The framework host factor (calibrations/framework_host.json, measured by benchmarks/bench_megatron_host.py):
what it is made of, where it applies, and that the priced host time scales by it exactly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from projection import api
from projection.perf import costmodel, default_cost_model
from projection.perf.pricing import price_stages
from projection.specs.scenario import Scenario

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "calibrations" / "framework_host.json"

# A tiny Megatron job (a file of flags, as Megatron-LM's own scripts pass them): every kernel is shorter than its
# host issue, so the forward and backward are host-bound.
FLAGS = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 "
         "--micro-batch-size 1 --global-batch-size 8 --vocab-size 128 --bf16\n")


def _tiny(tmp_path: Path, fmt: str = "megatron") -> Scenario:
    if fmt == "megatron":
        path = tmp_path / "args.txt"
        path.write_text(FLAGS)
    else:
        path = tmp_path / "exp.yaml"
        path.write_text("model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, ffn_hidden_size: 256, "
                        "vocab_size: 128, max_position_embeddings: 16}\n"
                        "training: {seq_length: 16, micro_batch_size: 1, global_batch_size: 8}\n")
    return api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=1)


def test_table_factors_are_its_measurements() -> None:
    """Factor = Megatron host seconds per modelled kernel / reference host seconds per kernel, from its own record."""
    t = json.loads(TABLE.read_text())
    m = t["measured"]
    per_kernel = m["reference_s_per_kernel"]
    assert per_kernel == pytest.approx(m["reference_layer_forward_s"] / m["reference_kernels_per_layer"])
    k = m["modelled_kernels_per_layer"]
    assert t["megatron"]["forward"] == pytest.approx(m["megatron_layer_forward_s"] / k["forward"] / per_kernel,
                                                     abs=1e-3)
    assert t["megatron"]["backward"] == pytest.approx(m["megatron_layer_backward_s"] / k["backward"] / per_kernel,
                                                      abs=1e-3)
    assert t["megatron"]["forward"] > 1.0 and t["megatron"]["backward"] > 1.0
    assert {"command", "date", "megatron_core", "transformers", "torch"} <= set(t["provenance"])


def test_recorded_kernel_counts_are_the_current_op_list() -> None:
    """The factor divides by the kernels projection's op list issues for the benchmark's layer; if the op list
    changes, the table must be measured again (python3 benchmarks/bench_megatron_host.py --out ...)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from bench_megatron_host import modelled_kernels
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    table = json.loads(TABLE.read_text())
    for moe, k in ((False, table["measured"]["modelled_kernels_per_layer"]),
                   (True, table["moe_check"]["modelled_kernels_per_layer"])):
        f1, b1 = modelled_kernels(1, moe=moe)
        f3, b3 = modelled_kernels(3, moe=moe)
        assert ((f3 - f1) / 2, (b3 - b1) / 2) == (k["forward"], k["backward"]), "MoE" if moe else "dense"


def test_factors_apply_to_megatron_jobs_priced_with_the_device_figure(tmp_path: Path) -> None:
    t = json.loads(TABLE.read_text())["megatron"]
    meg = _tiny(tmp_path)
    assert meg.framework == "megatron"
    f, b, note = costmodel.framework_host_factors(meg, "device h100-sxm")
    assert (f, b) == (t["forward"], t["backward"]) and "framework_host.json" in note
    # a calibration's own host rows (a trace of the job, or calibrate host) are used as they are
    assert costmodel.framework_host_factors(meg, "calibration mine.json")[:2] == (1.0, 1.0)
    native = _tiny(tmp_path, "native")
    assert costmodel.framework_host_factors(native, "device h100-sxm")[:2] == (1.0, 1.0)


def test_priced_host_time_scales_by_the_factor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host-bound actions: their overhead grows by exactly (factor - 1) x kernels x host seconds per kernel."""
    sc = _tiny(tmp_path)
    cm = default_cost_model(sc)
    with_factor = price_stages(sc, cm)
    ones = tmp_path / "ones.json"
    ones.write_text(json.dumps({"megatron": {"forward": 1.0, "backward": 1.0}}))
    monkeypatch.setattr(costmodel, "FRAMEWORK_HOST_FILE", ones)
    plain = price_stages(sc, cm)
    f, b = with_factor.host_factors
    assert plain.host_factors == (1.0, 1.0) and f > 1.0 and b > 1.0
    h = with_factor.host_kernel_issue_s
    for s1, s0 in zip(with_factor.stages, plain.stages, strict=True):
        assert s1.f.kernels == s0.f.kernels
        assert s1.f.seconds - s0.f.seconds == pytest.approx((f - 1.0) * s0.f.kernels * h, rel=1e-9)
        assert s1.b.seconds - s0.b.seconds == pytest.approx((b - 1.0) * s0.b.kernels * h, rel=1e-9)
