"""Saved-activation bytes of full-size decoder layers, measured without allocating, against `layer_tensors`.

A layer of tests/oracle/memory_models.py is built and run forward under
`torch._subclasses.fake_tensor.FakeTensorMode` (tensors carry shapes, dtypes and storages but no data) while
`torch.autograd.graph.saved_tensors_hooks` sees every tensor autograd saves for backward. Saved tensors are
deduplicated by storage (a view saves its whole base storage, once), parameters and buffers left out; the sum is
what one microbatch keeps for that layer, the quantity `projection.memory.activations.layer_tensors` inventories.

Layers (bf16, micro batch 1, sequence 4096, flash attention, no dropout, no recompute, tp = 1): one Llama-3-8B
layer (models/llama3_8B.yaml: h 4096, 32 heads / 8 KV heads, FFN 14336) and one DeepSeek-V3 MoE layer
(models/deepseek_v3.yaml: h 7168, MLA with q/kv latents 1536/512, 256 experts top-8 with expert FFN 2048 and one
shared expert, balanced routing). Must agree within 0.5 % (measured: 0.01 % dense, 0.06 % MoE).

The first two tests pin down the attention kernels the layers use: what the CPU flash kernel behind
`F.scaled_dot_product_attention` saves, and that `_FlashAttnFn` saves the same.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from projection.formats.native import preset_model_fields  # noqa: E402
from projection.memory.activations import layer_tensors  # noqa: E402
from projection.paths import MODELS_DIR  # noqa: E402
from projection.specs.model import ModelSpec  # noqa: E402
from projection.specs.plan import ParallelPlan  # noqa: E402
from projection.specs.scenario import RawScenario  # noqa: E402
from projection.specs.training import TrainingSpec  # noqa: E402
from tests.oracle.memory_models import Layer, _FlashAttnFn  # noqa: E402

SEQ = 4096


def preset(name: str) -> ModelSpec:
    path = Path(MODELS_DIR) / f"{name}.yaml"
    raw = RawScenario(source=str(path), framework="preset")
    for key, value, origin in preset_model_fields(path)[0]:
        raw.set(key, value, origin)
    return ModelSpec.model_validate(raw.get("model"))


def saved_storages(run: Callable[[], Any], exclude: Collection[int] = ()) -> dict[int, tuple[int, str]]:
    """Storages autograd saves while `run()` executes: {storage id: (bytes, 'shape dtype' of the first view)}."""
    found: dict[int, tuple[int, str]] = {}

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        key = st._cdata
        if key not in exclude and key not in found:
            found[key] = (st.nbytes(), f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}")
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return found


def _storage_keys(*tensors: Any) -> set[int]:
    return {t.untyped_storage()._cdata for t in tensors}


def test_cpu_sdpa_saves_flash_tensors() -> None:
    """CPU `scaled_dot_product_attention` (causal, GQA) runs the flash kernel and saves exactly q, k, v (KV width),
    its output and an fp32 (b, heads, s) log-sum-exp; the output is (b, s, heads, d)-contiguous."""
    b, a, g, s, d = 2, 8, 2, 128, 32
    q = torch.randn(b, s, a, d, requires_grad=True).transpose(1, 2)
    k = torch.randn(b, s, g, d, requires_grad=True).transpose(1, 2)
    v = torch.randn(b, s, g, d, requires_grad=True).transpose(1, 2)
    out: list[Any] = []
    saved = saved_storages(lambda: out.append(F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                 enable_gqa=True)))
    o = out[0]
    assert type(o.grad_fn).__name__ == "ScaledDotProductFlashAttentionForCpuBackward0"
    assert o.transpose(1, 2).is_contiguous()
    lse = {key: desc for key, (n, desc) in saved.items() if key not in _storage_keys(q, k, v, o)}
    assert list(lse.values()) == [f"{(b, a, s)} float32"]
    assert set(saved) == _storage_keys(q, k, v, o) | set(lse)
    assert sum(n for n, _ in saved.values()) == 4 * (2 * b * s * a * d + 2 * b * s * g * d + b * a * s)


def test_flash_fn_saves_what_cpu_sdpa_saves() -> None:
    """`_FlashAttnFn` saves the same tensors (shapes, dtypes, bytes) as the CPU flash kernel, with the same output
    layout, and computes the same output and gradients."""
    torch.manual_seed(0)
    b, a, g, s, d = 1, 4, 2, 96, 16
    base = [torch.randn(b, s, n, d, dtype=torch.float64) for n in (a, g, g)]
    results = []
    for use_fn in (False, True):
        q, k, v = (x.clone().requires_grad_() for x in base)
        out: list[Any] = []

        def run(q: Any = q, k: Any = k, v: Any = v, out: list[Any] = out, use_fn: bool = use_fn) -> None:
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            out.append(_FlashAttnFn.apply(qt, kt, vt) if use_fn
                       else F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True))

        saved = saved_storages(run)
        o = out[0]
        o.backward(torch.ones_like(o))
        results.append((sorted(saved.values()), o.transpose(1, 2).is_contiguous(), o.detach(),
                        [t.grad for t in (q, k, v)]))
    (sdpa_saved, sdpa_layout, sdpa_out, sdpa_grads), (fn_saved, fn_layout, fn_out, fn_grads) = results
    assert fn_saved == sdpa_saved
    assert fn_layout and sdpa_layout
    torch.testing.assert_close(fn_out, sdpa_out)
    for x, y in zip(fn_grads, sdpa_grads, strict=True):
        torch.testing.assert_close(x, y)


def _layer_saved_bytes(model: ModelSpec, i: int) -> tuple[int, dict[int, tuple[int, str]]]:
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.bfloat16)  # bf16 parameters (Module.to() cannot swap fake parameters)
        with FakeTensorMode():
            layer = Layer(model, i, SEQ, attention="flash_fn", balanced_routing=True)
            x = torch.randn(1, SEQ, model.hidden_size, requires_grad=True)
            fixed = _storage_keys(*layer.parameters(), *layer.buffers())
            saved = saved_storages(lambda: layer(x), exclude=fixed)
    finally:
        torch.set_default_dtype(default)
    return sum(n for n, _ in saved.values()), saved


def _compare(name: str, model: ModelSpec, i: int) -> None:
    training = TrainingSpec(seq_length=SEQ, micro_batch_size=1, params_dtype="bf16", attention_backend="flash")
    inventory = layer_tensors(model, training, ParallelPlan(tp=1, pp=1, dp=1), i)
    projected = sum(inventory.values())
    measured, saved = _layer_saved_bytes(model, i)
    print(f"\n{name} layer {i} (seq {SEQ}, bf16): projected {projected / 2**20:.1f} MiB, measured "
          f"{measured / 2**20:.1f} MiB, ratio {projected / measured:.4f}")
    print("  projected: " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in inventory.items()))
    big = sorted(saved.values(), reverse=True)
    print("  measured (largest saved storages, MiB): " + ", ".join(f"{desc} {n / 2**20:.1f}" for n, desc in big[:12])
          + f", ... {len(big)} storages")
    assert abs(projected / measured - 1) <= 0.005  # measured 2026-11-30: within 0.01 % (dense) and 0.06 % (MoE)


def test_llama3_8b_layer_saved_bytes() -> None:
    model = preset("llama3_8B")
    assert (model.hidden_size, model.num_attention_heads, model.kv_heads, model.ffn_hidden_size) == \
        (4096, 32, 8, 14336)
    _compare("Llama-3-8B", model, 0)


def test_deepseek_v3_moe_layer_saved_bytes() -> None:
    model = preset("deepseek_v3")
    assert model.moe is not None and model.mla is not None
    assert (model.hidden_size, model.moe.num_experts, model.moe.top_k, model.moe.expert_ffn_hidden_size,
            model.moe.shared_expert_ffn_hidden_size) == (7168, 256, 8, 2048, 2048)
    i = model.moe.first_k_dense if model.moe.layer_pattern is None else model.moe.layer_pattern.index(1)
    assert model.is_moe_layer(i)
    _compare("DeepSeek-V3 MoE", model, i)
