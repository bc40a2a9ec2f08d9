"""Named memory-bound kernels (norms, activations, cross-entropy, softmax): the workload names them with their shapes,
`projection shapes` lists them, `projection calibrate memory --config` runs the PyTorch op each name stands for (the
profiler shows which aten kernels ran) and stores it on the job's byte axis, and the calibrated cost model prices
each op from its kernel's rows: exact at the measured size, by bytes/s outside, the generic curve without rows."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from projection import api  # noqa: E402
from projection.calibrate.bench_memory import KernelShape, kernel_callable  # noqa: E402
from projection.calibrate.calibration import Calibration, MemoryBoundRow, load_calibration  # noqa: E402
from projection.cost.calibrated import CalibratedCostModel  # noqa: E402
from projection.cost.roofline import RooflineCostModel  # noqa: E402
from projection.specs.hardware import load_device  # noqa: E402
from projection.workload.ops import Op, stage_ops  # noqa: E402
from projection.workload.ops_base import KERNEL_FNS  # noqa: E402
from projection.workload.shapes import step_shapes  # noqa: E402
from projection.workload.stages import split_stages  # noqa: E402
from tests.unit.test_bench_cpu import TINY, calibrate  # noqa: E402

CPU = torch.device("cpu")

# the aten ops each benchmark must run (names from torch's native_functions.yaml)
EXPECTED = {
    "layernorm": {"aten::native_layer_norm"},
    "layernorm.bwd": {"aten::native_layer_norm_backward"},
    "gelu": {"aten::gelu"},
    "gelu.bwd": {"aten::gelu_backward"},
    "silu_glu": {"aten::silu", "aten::mul"},
    "silu_glu.bwd": {"aten::silu_backward", "aten::mul"},
    "cross_entropy": {"aten::_log_softmax", "aten::nll_loss_forward"},
    "cross_entropy.bwd": {"aten::nll_loss_backward", "aten::_log_softmax_backward_data"},
    "softmax": {"aten::_softmax"},
    "softmax.bwd": {"aten::_softmax_backward_data"},
}


@pytest.mark.parametrize("op", sorted(EXPECTED))
def test_each_benchmark_runs_its_kernel(op: str) -> None:
    setup, call = kernel_callable(KernelShape(op, rows=8, width=32, dtype="fp32", size_bytes=1), CPU)
    setup()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    ran = {e.key for e in prof.key_averages()}
    assert EXPECTED[op] <= ran, (op, sorted(ran))


def test_every_kernel_name_has_a_benchmark() -> None:
    for fn in KERNEL_FNS:
        for op in (fn, f"{fn}.bwd"):
            setup, call = kernel_callable(KernelShape(op, rows=4, width=16, dtype="fp32", size_bytes=1), CPU)
            setup()
            call()


def test_workload_names_the_kernels_with_their_shapes(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY, encoding="utf-8")
    sc = api.load(config)
    ops = [o for s in split_stages(sc.model, sc.plan) for o in stage_ops(sc.model, sc.training, sc.plan, s)]
    named = {(o.name, o.kernel, o.m, o.n) for o in ops if o.fn}
    t, h, f, v = 32, 64, 96, 256  # tokens of one microbatch, hidden, ffn, vocab (TINY)
    assert ("attn.norm", "rmsnorm", t, h) in named and ("mlp.norm.bwd", "rmsnorm.bwd", t, h) in named
    assert ("mlp.act", "silu_glu", t, f) in named and ("mlp.act.bwd", "silu_glu.bwd", t, f) in named
    assert ("output.loss", "cross_entropy", t, v) in named and ("output.norm", "rmsnorm", t, h) in named
    # projection shapes lists exactly these kernels, keyed by their bytes
    rows = {(r.op, r.m, r.n, r.size_bytes) for r in step_shapes(sc) if r.kind == "memory_bound"}
    assert rows == {(o.kernel, o.m, o.n, int(o.bytes_read + o.bytes_written)) for o in ops if o.fn}
    # the calibration measures each of them once, on the job's byte axis
    out = tmp_path / "mem.json"
    assert calibrate("memory", "--config", str(config), "--sizes", "4096", "--device", "cpu", "--warmup", "1",
                     "--repeat", "2", "--quiet", "--out", str(out)) == 0
    measured = {(r.op, r.size_bytes) for r in load_calibration(out).memory_bound if r.op != "add"}
    assert measured == {(op, size) for op, _, _, size in rows}


def test_cost_model_prices_named_kernels_from_their_rows() -> None:
    generic = [MemoryBoundRow(op="add", size_bytes=s, time_s=s / 1e10) for s in (10**4, 10**8)]
    kernels = [MemoryBoundRow(op="gelu", size_bytes=10**6, time_s=4e-3, dtype="fp32"),
               MemoryBoundRow(op="gelu", size_bytes=10**7, time_s=2e-2, dtype="fp32"),
               MemoryBoundRow(op="gelu", size_bytes=10**6, time_s=1e-3, dtype="bf16"),
               MemoryBoundRow(op="gelu.bwd", size_bytes=10**6, time_s=9e-3, dtype="fp32")]
    cm = CalibratedCostModel(Calibration(memory_bound=(*generic, *kernels)), RooflineCostModel(load_device("mi300x")),
                             name="k")

    def op(fn: str, phase: str, size: float, dtype: str = "fp32") -> Op:
        return Op("x", "memory_bound", phase, dtype=dtype, bytes_read=size / 2, bytes_written=size / 2, fn=fn)  # type: ignore[arg-type]

    assert cm.op_seconds(op("gelu", "F", 10**6)) == pytest.approx(4e-3)  # exact at a measured point, own dtype
    assert cm.op_seconds(op("gelu", "F", 10**6, "bf16")) == pytest.approx(1e-3)
    assert cm.op_seconds(op("gelu", "I", 10**6)) == pytest.approx(9e-3)  # backward: its own row
    assert cm.provenance(op("gelu", "I", 10**6)) == "calibrated: k memory_bound gelu.bwd"
    mid = cm.op_seconds(op("gelu", "F", 10**6.5))
    assert 4e-3 < mid < 2e-2  # log-log between the two fp32 rows
    assert cm.op_seconds(op("gelu", "F", 10**8)) == pytest.approx(2e-2 * 10)  # outside: the end's bytes/s
    assert cm.provenance(op("gelu", "F", 10**8)).endswith("(scaled by bytes)")
    assert cm.op_seconds(op("gelu", "I", 4 * 10**6, "bf16")) == pytest.approx(4 * 9e-3)  # other dtype: any dtype
    # no rows for the kernel, or no kernel named: the generic curve, which the kernel rows do not enter
    assert cm.op_seconds(op("rmsnorm", "F", 10**6)) == pytest.approx(1e6 / 1e10)
    assert cm.op_seconds(op("", "F", 10**6)) == pytest.approx(1e6 / 1e10)
