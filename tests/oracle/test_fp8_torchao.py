"""FP8 under torchao (TorchTitan's float8 converter) against a real torchao step on the CPU: memory and casts.

Transformer Engine caches an fp8 copy and transpose of every GEMM weight for the whole step and saves linear inputs in
fp8; torchao's `Float8Linear` does neither: it casts in every forward and backward and saves the high-precision input
and weight (`matmul_with_hp_or_float8_args`: `ctx.save_for_backward(input_hp, weight_hp_t)`). The estimator's
`Fp8Spec(library="torchao")` must therefore project what torch measures here:

* saved activations: the bytes of the distinct storages autograd saves in forward (parameters excluded), with the
  decoder layers converted by `torchao.float8.convert_to_float8_training` against the same model unconverted. The
  projected ratio (torchao fp8 / no fp8, `activations.*` terms of `estimate_memory`) must equal the measured one.
* nothing cached: the tensors alive after backward besides parameters and gradients, measured by MemTracker, are the
  same with and without the conversion, and the projected weights equal the projected bf16 weights.
* the casts: every fp8 tensor aten produces in one Float8Linear forward and backward (its bytes) against the fp8
  cast ops of the op list's `linear` (projection/workload/ops_base.py `_fp8_casts`).

Needs torchao (a test dependency in pyproject.toml); skipped, saying so, where it is not installed.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
float8 = pytest.importorskip("torchao.float8", reason="torchao is not installed (pip install -e '.[test]')")

from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

from projection.memory.estimate import estimate_memory  # noqa: E402
from projection.memory.model_states import model_state_bytes  # noqa: E402
from projection.specs.scenario import Scenario  # noqa: E402
from projection.specs.training import Fp8Spec  # noqa: E402
from projection.workload.params import per_rank_params  # noqa: E402
from tests.oracle.memory_models import Decoder  # noqa: E402
from tests.oracle.test_memory_vs_memtracker import LLAMA, MICRO_BATCH, SEQ, Case, scenario  # noqa: E402

pytestmark = pytest.mark.slow  # real forward and backward passes

CASE = Case(LLAMA, "flash", 0.0, "none")


def _scenario(fp8: bool) -> Scenario:
    sc = scenario(CASE)
    spec = Fp8Spec(format="hybrid", recipe="tensorwise", library="torchao") if fp8 else None
    training = sc.training.model_copy(update={"params_dtype": "bf16", "fp8": spec})
    return sc.model_copy(update={"training": training})


def _model(fp8: bool) -> Any:
    torch.manual_seed(0)
    model = Decoder(LLAMA, SEQ).to(torch.bfloat16)
    if fp8:
        float8.convert_to_float8_training(model.layers)  # the output layer is F.linear, never converted
        # fused qkv, the attention projection, fused gate/up fc1 and fc2 of every layer
        assert sum(type(m).__name__ == "Float8Linear" for m in model.modules()) == 4 * LLAMA.num_layers
    model.train()
    return model


def _batch() -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, LLAMA.vocab_size, (MICRO_BATCH, SEQ), generator=g),
            torch.randint(0, LLAMA.vocab_size, (MICRO_BATCH, SEQ), generator=g))


def saved_bytes(fp8: bool) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one forward."""
    model = _model(fp8)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    ids, labels = _batch()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids, labels)
    loss.backward()
    return sum(seen.values())


def left_after_backward(fp8: bool) -> int:
    """Bytes MemTracker still files as activations or temporaries after backward (what a cache would hold)."""
    model = _model(fp8)
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        ids, labels = _batch()
        model(ids, labels).backward()
        del ids, labels
        snap = tracker.get_tracker_snapshot()
    return sum(v for dev in snap.values() if isinstance(dev, dict) for k, v in dev.items()
               if str(k) in ("_MemRefType.ACT", "_MemRefType.TEMP", "Activation", "Temp"))


def _projected_saved(fp8: bool) -> int:
    (r,) = estimate_memory(_scenario(fp8)).ranks
    return sum(v for k, v in r.terms.items() if k.startswith("activations."))


def _projected_weights(fp8: bool) -> int:
    sc = _scenario(fp8)
    (rank,) = per_rank_params(sc.model, sc.plan)
    return model_state_bytes(sc.model, sc.training, sc.plan, rank).weights


def test_saved_activations_ratio_matches_torchao() -> None:
    measured = saved_bytes(True) / saved_bytes(False)
    projected = _projected_saved(True) / _projected_saved(False)
    print(f"\nsaved activations fp8/bf16: measured {measured:.4f}, projected {projected:.4f}")
    assert projected == pytest.approx(measured, abs=0.005)


def test_nothing_cached_across_the_step() -> None:
    with_fp8, without = left_after_backward(True), left_after_backward(False)
    print(f"\nalive after backward (bytes): fp8 {with_fp8}, bf16 {without}")
    assert with_fp8 == without
    assert _projected_weights(True) == _projected_weights(False)


# ---- the casts torchao dispatches, against the op list ----------------------------------------------------------

FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")


def _fp8_writes(tokens: int, n_out: int, k_in: int) -> tuple[list[int], list[int]]:
    """Bytes of every fp8 tensor aten produces in one Float8Linear forward, then backward (the casts)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Casts(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.out: list[int] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            result = func(*args, **(kwargs or {}))
            for t in tree_flatten(result)[0]:
                if isinstance(t, torch.Tensor) and str(t.dtype).replace("torch.", "") in FP8_DTYPES:
                    self.out.append(t.numel() * t.element_size())
            return result

    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(k_in, n_out, bias=False)).to(torch.bfloat16)
    float8.convert_to_float8_training(lin)
    x = torch.randn(tokens, k_in, dtype=torch.bfloat16, requires_grad=True)
    with Casts() as fwd:
        y = lin(x)
    dy = torch.randn_like(y)
    with Casts() as bwd:
        y.backward(dy)
    return fwd.out, bwd.out


def test_fp8_casts_equal_the_dispatched_ones() -> None:
    from projection.workload.ops_base import dims, linear

    tokens, n_out, k_in = 64, 512, 256
    got_f, got_b = _fp8_writes(tokens, n_out, k_in)
    sc = _scenario(True)
    piece = linear("fc", dims(sc.model, sc.training, sc.plan), tokens, n_out, k_in)
    casts_f = sorted(int(o.bytes_written) for o in piece.fwd if o.dtype == "fp8" and o.kind == "memory_bound")
    casts_b = sorted(int(o.bytes_written) for o in piece.bwd if o.dtype == "fp8" and o.kind == "memory_bound")
    print(f"\nfp8 casts forward {sorted(got_f)} / {casts_f}, backward {sorted(got_b)} / {casts_b} (torchao / op list)")
    assert casts_f == sorted(got_f)
    assert casts_b == sorted(got_b)
