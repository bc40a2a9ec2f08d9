"""What a TorchTitan block keeps under per-op selective checkpointing when its linears are torchao Float8Linear.

torchao's float8 linear multiplies `Float8Tensor`s with `torch.mm`; the tensor subclass turns that call into
`_scaled_mm`, but the checkpoint's policy (a TorchDispatchMode) sees the call first, as `aten.mm`: it counts it among
the block's mm calls and saves every second one's (high-precision) output, as for a bf16 linear. The amax reductions
the casts run are `aten.max` calls, which TorchTitan's save list keeps ("for low precision training"): one scalar a
cast. The block of tests/oracle/torchtitan_layers.py (Llama-style GQA) is converted with
`torchao.float8.convert_to_float8_training` and run forward in bf16 on the CPU under the same live-storage count as
tests/oracle/test_memory_torchtitan_layers.py; `projection.memory.activations.saved_layer_bytes` with torchao
tensorwise FP8 must agree within 1e-4 (the amax scalars, tens of bytes, are not counted).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

float8 = pytest.importorskip("torchao.float8", reason="torchao is not installed (pip install -e '.[test]')")

from projection.memory.activations import saved_layer_bytes  # noqa: E402
from projection.specs.plan import ParallelPlan, RecomputeSpec  # noqa: E402
from projection.specs.training import Fp8Spec, KernelSpec, TrainingSpec  # noqa: E402
from projection.workload.ops import layer_ops  # noqa: E402
from tests.oracle.test_memory_torchtitan_layers import LLAMA, MICRO_BATCH, SEQ, kept_after_forward  # noqa: E402
from tests.oracle.torchtitan_layers import OpSacBlock  # noqa: E402

FP8 = Fp8Spec(format="hybrid", recipe="tensorwise", library="torchao")


class _MmFlops(TorchDispatchMode):
    """FLOPs of every aten.mm call (float8's run inside autograd Functions, with grad mode off, forward and
    backward alike)."""

    def __init__(self) -> None:
        super().__init__()
        self.flop = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func == torch.ops.aten.mm.default:
            (m, k), n = args[0].shape, args[1].shape[1]
            self.flop += 2.0 * m * k * n
        return func(*args, **(kwargs or {}))


def _kept_bytes(convert: bool) -> tuple[int, float]:
    """(bytes the block keeps after its forward, mm FLOPs the checkpoint replays before its backward: the backward's
    mm FLOPs less the input and weight gradients', twice the forward's)."""
    torch.manual_seed(0)
    block = OpSacBlock(LLAMA, 0, SEQ).to(torch.bfloat16)
    if convert:
        float8.convert_to_float8_training(block)
    x = torch.randn(MICRO_BATCH, SEQ, LLAMA.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    forward = _MmFlops()
    with forward:
        kept, y = kept_after_forward(block, x)
    backward = _MmFlops()
    with backward:
        y.sum().backward()  # a real, differentiable block
    return kept, backward.flop - 2 * forward.flop


def _setup(fp8: Fp8Spec | None) -> tuple[TrainingSpec, ParallelPlan]:
    training = TrainingSpec(seq_length=SEQ, micro_batch_size=MICRO_BATCH, params_dtype="bf16", fp8=fp8,
                            attention_backend="flash", kernels=KernelSpec(transformer_impl="torchtitan"))
    plan = ParallelPlan(tp=1, pp=1, dp=1, recompute=RecomputeSpec(granularity="selective", modules=("op",)))
    return training, plan


def test_float8_linears_are_counted_and_saved_like_bf16_ones() -> None:
    got: dict[str, Any] = {"measured": _kept_bytes(True)[0], "unconverted": _kept_bytes(False)[0]}
    want = saved_layer_bytes(LLAMA, *_setup(FP8), 0, False)
    assert abs(want / got["measured"] - 1) <= 1e-4, (want, got)
    # the converted block keeps what the unconverted one keeps, but for the amax scalars
    assert abs(got["measured"] - got["unconverted"]) < 1024, got


def test_float8_recompute_replays_every_second_mm() -> None:
    """The GEMM FLOPs the op list re-runs before the block's backward equal the mm FLOPs the checkpoint replayed."""
    training, plan = _setup(FP8)
    projected = sum(o.flop for o in layer_ops(LLAMA, training, plan, 0) if o.recompute and o.kind == "gemm")
    measured = _kept_bytes(True)[1]
    assert measured > 0 and projected == pytest.approx(measured, rel=1e-9)


@torch.library.custom_op("projection_test::fp8_gemm", mutates_args=())
def _own_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A library's own GEMM op, as Primus-Turbo's linears call `primus_turbo::gemm_fp8_impl` (gemm_fp8.py)."""
    return x @ w.t()


@_own_gemm.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[0])


def _own_gemm_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, w = ctx.saved_tensors
    return grad @ w, grad.t() @ x


_own_gemm.register_autograd(_own_gemm_backward,
                            setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


class _OwnOpLinear(torch.nn.Module):
    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        self.weight = lin.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _own_gemm(x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], -1)


def test_a_librarys_own_gemm_op_is_neither_counted_nor_saved() -> None:
    """Primus-Turbo's fp8 linears call their own op: the per-op policy sees `primus_turbo::gemm_fp8_impl`, not
    aten.mm, so it saves none of their outputs (Fp8Spec.mm_dispatched is False). The block's linears swapped for a
    custom op standing in for it keep what the projection with Primus-Turbo FP8 keeps."""
    torch.manual_seed(0)
    block = OpSacBlock(LLAMA, 0, SEQ).to(torch.bfloat16)
    for parent in (block.block.attention, block.block.feed_forward):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, _OwnOpLinear(child))
    x = torch.randn(MICRO_BATCH, SEQ, LLAMA.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    measured, y = kept_after_forward(block, x)
    y.sum().backward()
    turbo = Fp8Spec(format="hybrid", recipe="tensorwise", library="primus_turbo")
    want = saved_layer_bytes(LLAMA, *_setup(turbo), 0, False)
    assert abs(want / measured - 1) <= 1e-4, (want, measured)
    assert measured < 0.5 * _kept_bytes(True)[0]  # torchao's block keeps its mm outputs
