"""TorchTitan's float8 tensor-parallel plan (torchao Float8ColwiseParallel / Float8RowwiseParallel /
PrepareFloat8ModuleInput, `Fp8Spec.tp_float8`) at tp 2 on 2 gloo CPU processes, against the estimator and the op list.

Each rank (tests/oracle/torchtitan_tp_float8_worker.py) converts the llama block of test_memory_torchtitan_tp.py to
torchao Float8Linear (tensorwise, emulated GEMM), applies the float8 TP plan and runs forward and backward in bf16.
Measured per rank:
* the bytes kept for backward after forward: the fp8 copies of the gathered attention and feed-forward inputs and of
  the row-parallel inputs replace the bf16 ones (projection: `Fp8Spec.tp_float8` saves linear inputs at 1 B);
* every collective's element size and bytes: forward all-gathers in float8_e4m3fn, the backward all-gathers of the
  row-parallel output gradients in float8_e5m2, the reduce-scatters in bf16; against the op list's collective ops of
  the same layer (Op.coll_bytes: an all-gather's output, a reduce-scatter's input).
Without the float8 plan (v0.2.2's converter name) the same block gathers and saves bf16: test_memory_torchtitan_tp.py.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchao.float8", reason="torchao is not installed (pip install -e '.[test]')")
from tests.oracle.spawn import require_gloo  # noqa: E402

require_gloo()
try:
    from torch.distributed.tensor.parallel import parallelize_module  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the torch build
    pytest.skip(f"DTensor tensor parallelism is not available: {exc}", allow_module_level=True)

from projection.specs.plan import ParallelPlan  # noqa: E402
from projection.specs.training import Fp8Spec, KernelSpec, TrainingSpec  # noqa: E402
from projection.workload.ops import layer_ops  # noqa: E402
from tests.oracle.rank_probes import projected, run_ranks  # noqa: E402
from tests.oracle.test_memory_torchtitan_tp import LLAMA, MICRO_BATCH, SEQ, TP  # noqa: E402

pytestmark = pytest.mark.slow  # two spawned gloo processes

FP8 = Fp8Spec(format="hybrid", recipe="tensorwise", library="torchao", tp_float8=True)


def _setup(fp8: Fp8Spec | None = FP8) -> tuple[TrainingSpec, ParallelPlan]:
    training = TrainingSpec(seq_length=SEQ, micro_batch_size=MICRO_BATCH, params_dtype="bf16", fp8=fp8,
                            attention_backend="flash", kernels=KernelSpec(transformer_impl="torchtitan"))
    return training, ParallelPlan(tp=TP, pp=1, dp=1, sp=True, tp_style="dtensor")


@functools.cache
def _measured() -> list[dict[str, Any]]:
    from tests.oracle.torchtitan_tp_float8_worker import worker

    return [r[0] for r in run_ranks(worker, TP, [(LLAMA, False)], SEQ, MICRO_BATCH, "TorchTitan float8 TP block")]


@pytest.mark.parametrize("rank", range(TP))
def test_saved_bytes_per_rank(rank: int) -> None:
    m = _measured()[rank]
    terms, got = projected(LLAMA, *_setup())
    print(f"\nfloat8 TP rank {rank}: projected {got:.0f} B, measured {m['kept']} B, ratio {got / m['kept']:.4f}\n"
          "  projected: " + ", ".join(f"{k} {v:.0f}" for k, v in terms.items()) + "\n  alive: "
          + ", ".join(f"{op} {tuple(shape)} {dtype.removeprefix('torch.')} {n}"
                      for n, op, shape, dtype in sorted(m["storages"], key=lambda s: -s[0])))
    assert abs(got / m["kept"] - 1) <= 0.01
    assert projected(LLAMA, *_setup(None))[1] > 1.15 * m["kept"]  # the bf16 plan's estimate does not fit it


def _projected_collectives() -> dict[tuple[str, str], tuple[int, int]]:
    """(kind, F or B) -> (count, bytes) of the layer's collective ops (Op.coll_bytes: output of an all-gather,
    input of a reduce-scatter)."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for o in layer_ops(LLAMA, *_setup(), 0):
        if o.kind == "collective":
            key = (str(o.coll), "F" if o.phase == "F" else "B")
            n, b = out.get(key, (0, 0))
            out[key] = (n + o.count, b + o.coll_bytes * o.count)
    return out


@pytest.mark.parametrize("rank", range(TP))
def test_collective_bytes_per_rank(rank: int) -> None:
    m = _measured()[rank]
    measured: dict[tuple[str, str], tuple[int, int]] = {}
    for phase, seen in (("F", m["forward"]), ("B", m["backward"])):
        for kind, elem, nbytes in seen:
            # an all-gather's output is tp inputs; the element size says which dtype crossed the wire
            assert elem == (1 if kind == "all_gather" else 2), (phase, kind, elem)
            n, b = measured.get((kind, phase), (0, 0))
            measured[(kind, phase)] = (n + 1, b + nbytes * (TP if kind == "all_gather" else 1))
    print(f"\nrank {rank}: measured {measured}\n  projected {_projected_collectives()}")
    assert measured == _projected_collectives()
