"""Eager TorchTitan's elementwise chains (projection/workload/ops_eager.py) against the aten calls PyTorch makes.

Each chain is run the way TorchTitan's model code writes it, on the CPU at the scenario's shapes and dtype, forward
and backward, under a TorchDispatchMode that records every aten call that is not a view: one call is one kernel
(on a GPU too: the calls and their tensors do not depend on the device). A call reads its tensor inputs (a broadcast
input only its own storage, e.g. the RoPE table and the row statistics) and writes its outputs. nll_loss is the one
call whose kernel reads less than its inputs: it reads one log-probability per row and the labels, not the whole
log-probability matrix it is given (aten/src/ATen/native/cuda/Loss.cu), and its backward only the labels and
scalars. The projected ops of each chain must equal the recorded kernels in number and in bytes read and written,
in each direction. The norms run through `F.rms_norm`, whose CPU build is the composite chain PyTorch ran on CUDA
before 2.8 (and which TorchTitan's own RMSNorm of 2024 runs too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from projection import api  # noqa: E402
from projection.workload.ops import layer_ops, output_ops  # noqa: E402
from projection.workload.ops_base import Op  # noqa: E402

B, S, H, HEADS, KV, FFN, VOCAB = 2, 16, 64, 4, 2, 96, 80
HD = H // HEADS

CONFIG = """\
model: {{name: tiny, num_layers: 1, hidden_size: {h}, num_attention_heads: {heads}, num_kv_heads: {kv},
        ffn_hidden_size: {ffn}, vocab_size: {vocab}, norm: rmsnorm, gated_mlp: true, activation: silu,
        position_embedding: rope, tie_embeddings: false}}
training: {{seq_length: {s}, micro_batch_size: {b}, global_batch_size: {b}, params_dtype: {dtype},
           kernels: {{transformer_impl: torchtitan, rms_norm_kernel: composite}}}}
plan: {{tp: 1}}
cluster: {{hardware: h100-sxm, nodes: 1, gpus_per_node: 1}}
"""


class Kernels(TorchDispatchMode):
    """(aten call, bytes read, bytes written) of every call that is not a view."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        name = func.__name__.split(".")[0]
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if name == "nll_loss_forward":  # the labels and one log-probability a row (module docstring)
            read = inputs[1].nbytes + inputs[1].numel() * inputs[0].element_size()
        elif name == "nll_loss_backward":  # grad_output, the labels and total_weight; self gives the shape only
            read = sum(t.nbytes for i, t in enumerate(inputs) if i != 1)
        else:
            read = sum(min(t.nbytes, t.untyped_storage().nbytes()) for t in inputs)
        written = sum(t.nbytes for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        self.calls.append((name, read, written))
        return out


def _recorded(make: Callable[[], list[Any]], forward: Callable[..., Any],
              recorder: type[Kernels] = Kernels) -> dict[str, tuple[int, float, float]]:
    """{'F': (kernels, read, written), 'I': ...} of `forward` on the tensors `make` returns, then its backward."""
    leaves = make()
    with recorder() as fwd:
        out = forward(*leaves)
    seed = torch.ones_like(out)
    with recorder() as bwd:
        out.backward(seed)
    return {phase: (len(k.calls), float(sum(c[1] for c in k.calls)), float(sum(c[2] for c in k.calls)))
            for phase, k in (("F", fwd), ("I", bwd))}


def _projected(ops: list[Op]) -> dict[str, tuple[int, float, float]]:
    return {phase: (sum(o.count for o in ops if o.phase == phase),
                    sum(o.bytes_read * o.count for o in ops if o.phase == phase),
                    sum(o.bytes_written * o.count for o in ops if o.phase == phase)) for phase in ("F", "I")}


@pytest.fixture(params=["bf16", "fp32"])
def job(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[list[Op], torch.dtype]:
    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG.format(h=H, heads=HEADS, kv=KV, ffn=FFN, vocab=VOCAB, s=S, b=B, dtype=request.param),
                    encoding="utf-8")
    sc = api.load(path)
    ops = [*layer_ops(sc.model, sc.training, sc.plan, 0), *output_ops(sc.model, sc.training, sc.plan)]
    return ops, {"bf16": torch.bfloat16, "fp32": torch.float32}[request.param]


def _chain(ops: list[Op], prefix: str) -> list[Op]:
    return [o for o in ops if o.name.startswith(prefix + ".") and o.kind == "memory_bound"]


def _leaf(*shape: int, dtype: torch.dtype) -> Any:
    return torch.randn(*shape, dtype=dtype).requires_grad_()


def test_rms_norm_is_the_composite_chain(job: tuple[list[Op], torch.dtype]) -> None:
    ops, dt = job
    got = _recorded(lambda: [_leaf(B, S, H, dtype=dt), _leaf(H, dtype=dt)],
                    lambda x, w: F.rms_norm(x, (H,), w, 1e-6))
    assert _projected(_chain(ops, "attn.norm")) == got
    assert _projected(_chain(ops, "output.norm")) == got


def test_rope_is_torchtitans_complex_product(job: tuple[list[Op], torch.dtype]) -> None:
    ops, dt = job
    angles = torch.outer(torch.arange(S).float(), torch.rand(HD // 2))
    table = torch.polar(torch.ones_like(angles), angles).view(1, S, 1, HD // 2)  # freqs_cis, made once

    def rotate(x: Any) -> Any:
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * table).flatten(3).type_as(x)

    got = _recorded(lambda: [_leaf(B, S, HEADS, HD, dtype=dt), _leaf(B, S, KV, HD, dtype=dt)],
                    lambda q, k: torch.cat([rotate(q).flatten(), rotate(k).flatten()]))
    cat = B * S * (HEADS + KV) * HD * (2 if dt == torch.bfloat16 else 4)  # the test's own join, not TorchTitan's
    got = {"F": (got["F"][0] - 1, got["F"][1] - cat, got["F"][2] - cat), "I": got["I"]}
    assert _projected(_chain(ops, "attn.rope")) == got


def test_swiglu_and_the_separate_linears_input_gradients(job: tuple[list[Op], torch.dtype]) -> None:
    ops, dt = job
    got = _recorded(lambda: [_leaf(B * S, FFN, dtype=dt), _leaf(B * S, FFN, dtype=dt)],
                    lambda a, b: F.silu(a) * b)
    assert _projected(_chain(ops, "mlp.act")) == got
    # wq, wk, wv on one input: autograd sums the three input gradients (the adds among the backward's calls)
    wq, wk, wv = (torch.nn.Linear(H, n * HD, bias=False).to(dt) for n in (HEADS, KV, KV))
    x = _leaf(B * S, H, dtype=dt)
    out = torch.cat([wq(x), wk(x), wv(x)], dim=-1)
    with Kernels() as bwd:
        out.backward(torch.ones_like(out))
    adds = [c for c in bwd.calls if c[0] == "add"]
    assert _projected(_chain(ops, "attn.qkv"))["I"] == (len(adds), float(sum(c[1] for c in adds)),
                                                        float(sum(c[2] for c in adds))) and len(adds) == 2


def test_loss_is_cross_entropy_on_upcast_logits(job: tuple[list[Op], torch.dtype]) -> None:
    ops, dt = job
    labels = torch.randint(0, VOCAB, (B * S,))
    got = _recorded(lambda: [_leaf(B, S, VOCAB, dtype=dt)],
                    lambda logits: F.cross_entropy(logits.flatten(0, 1).float(), labels))
    assert _projected(_chain(ops, "output.loss")) == got


def test_compiled_blocks_keep_one_kernel_a_direction(tmp_path: Path) -> None:
    """torch.compile (KernelSpec.compiled) fuses the chains: one norm, RoPE and activation kernel a direction, no
    separate input-gradient adds."""
    path = tmp_path / "tiny.yaml"
    text = CONFIG.format(h=H, heads=HEADS, kv=KV, ffn=FFN, vocab=VOCAB, s=S, b=B, dtype="bf16")
    path.write_text(text.replace("rms_norm_kernel: composite", "rms_norm_kernel: composite, compiled: true"),
                    encoding="utf-8")
    sc = api.load(path)
    ops = list(layer_ops(sc.model, sc.training, sc.plan, 0))
    for prefix in ("attn.norm", "attn.rope", "mlp.act"):
        assert [o.phase for o in ops if o.name.split(".bwd")[0] == prefix] == ["F", "I"], prefix
    assert not [o for o in ops if ".dgrad_add" in o.name]


@pytest.mark.parametrize(("name", "decay"), [("adamw", 0.1), ("adam", 0.1), ("adamw", 0.0)])
def test_foreach_adam_passes_are_torch_optims(name: str, decay: float) -> None:
    """torch.optim's foreach Adam / AdamW (weight decay 0.1, TorchTitan's default, and 0) on fp32 parameters: every
    _foreach_* call on the parameters' device, its bytes read (every tensor of its input lists) and written (the lists
    it updates in place, or returns), and its number of tensor lists, against projection/perf/optimizer.foreach_adam.
    The step counts live on the host (capturable off), so their _foreach_add_ is not a device pass."""
    from projection.perf.optimizer import foreach_adam
    from projection.specs.training import OptimizerSpec

    n, size = 3, 1000
    params = [torch.nn.Parameter(torch.randn(size)) for _ in range(n)]
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    opt = cls(params, lr=1e-3, weight_decay=decay, foreach=True)
    passes: list[tuple[float, float, int]] = []

    class Passes(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
            if func.__name__.startswith("_foreach") and lists and lists[0][0].numel() == size:
                written = [a for a, spec in zip(args, func._schema.arguments, strict=False)
                           if spec.alias_info is not None and spec.alias_info.is_write]
                made = out if isinstance(out, (list, tuple)) else []
                passes.append((sum(t.nbytes for lst in lists for t in lst) / (n * size),
                               sum(t.nbytes for lst in [*written, made] for t in lst) / (n * size),
                               len(lists) + (1 if made else 0)))
            return out

    for p in params:
        p.grad = torch.randn(size)
    opt.step()  # the first step makes the state; the second is measured
    for p in params:
        p.grad = torch.randn(size)
    with Passes():
        opt.step()
    spec = OptimizerSpec(name=name, implementation="foreach", weight_decay=decay)
    got = [(r, w, k) for _, r, w, k in foreach_adam(spec, 4)]
    assert sorted(got) == sorted(passes) and len(got) == (8 if decay else 7)


def test_mla_rope_is_the_same_complex_chain(tmp_path: Path) -> None:
    """TorchTitan's DeepSeek-V3 rotates the queries' rotary parts and the one shared key part with the same chain as
    Llama's (apply_rotary_emb: upcast, complex product, cast): the MLA op list's eager `attn.rope` equals PyTorch's
    calls on those shapes."""
    rope_dim = 8
    text = CONFIG.format(h=H, heads=HEADS, kv=HEADS, ffn=FFN, vocab=VOCAB, s=S, b=B, dtype="bf16").replace(
        "position_embedding: rope,", "position_embedding: rope, mla: {q_lora_rank: 0, kv_lora_rank: 32, "
        f"qk_head_dim: 16, qk_rope_head_dim: {rope_dim}, v_head_dim: 16}},")
    path = tmp_path / "mla.yaml"
    path.write_text(text, encoding="utf-8")
    sc = api.load(path)
    ops = list(layer_ops(sc.model, sc.training, sc.plan, 0))
    angles = torch.outer(torch.arange(S).float(), torch.rand(rope_dim // 2))
    table = torch.polar(torch.ones_like(angles), angles).view(1, S, 1, rope_dim // 2)

    def rotate(x: Any) -> Any:
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * table).flatten(3).type_as(x)

    got = _recorded(lambda: [_leaf(B, S, HEADS, rope_dim, dtype=torch.bfloat16),
                             _leaf(B, S, 1, rope_dim, dtype=torch.bfloat16)],
                    lambda q, k: torch.cat([rotate(q).flatten(), rotate(k).flatten()]))
    cat = B * S * (HEADS + 1) * rope_dim * 2  # the test's own join
    got = {"F": (got["F"][0] - 1, got["F"][1] - cat, got["F"][2] - cat), "I": got["I"]}
    assert _projected(_chain(ops, "attn.rope")) == got


# ---- Megatron-Core's unfused RoPE (--no-rope-fusion: KernelSpec.rope_fusion False, ops_eager.megatron_rope), run
# through Megatron-Core's own apply_rotary_pos_emb on the CPU. slice_backward is one aten call but two GPU kernels
# (aten/src/ATen/native/TensorShape.cpp slice_backward: at::zeros, a fill, then copy_ of the gradient into the slice,
# no kernel when the gradient is empty): the recorder splits it so.

MCORE = """\
model: {{name: tiny, num_layers: 1, hidden_size: {h}, num_attention_heads: {heads}, num_kv_heads: {kv},
        ffn_hidden_size: {ffn}, vocab_size: {vocab}, norm: rmsnorm, gated_mlp: true, activation: silu,
        position_embedding: rope, tie_embeddings: false{mla}}}
training: {{seq_length: {s}, micro_batch_size: {b}, global_batch_size: {b}, params_dtype: {dtype},
           kernels: {{rope_fusion: false}}}}
plan: {{tp: 1}}
cluster: {{hardware: h100-sxm, nodes: 1, gpus_per_node: 1}}
"""
QK, RD, DV, KV_LORA = 8, 4, 6, 16  # the MLA case's head dims


class GpuKernels(Kernels):
    """Kernels, with slice_backward split into the fill and the copy a GPU runs."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.__name__.split(".")[0] != "slice_backward":
            return super().__torch_dispatch__(func, types, args, kwargs)
        out = func(*args, **(kwargs or {}))
        self.calls.append(("fill", 0, out.nbytes))
        if args[0].numel():
            self.calls.append(("copy", args[0].nbytes, args[0].nbytes))
        return out


def _mcore_rope() -> Any:
    pytest.importorskip("megatron.core")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
    return apply_rotary_pos_emb


def _mcore_job(tmp_path: Path, dt: str, mla: bool) -> list[Op]:
    extra = (f", mla: {{kv_lora_rank: {KV_LORA}, qk_head_dim: {QK}, qk_rope_head_dim: {RD}, v_head_dim: {DV}}}"
             if mla else "")
    path = tmp_path / "tiny.yaml"
    path.write_text(MCORE.format(h=H, heads=HEADS, kv=HEADS if mla else KV, ffn=FFN, vocab=VOCAB, s=S, b=B, dtype=dt,
                                 mla=extra), encoding="utf-8")
    sc = api.load(path)
    assert sc.training.kernels.transformer_impl == "transformer_engine" and not sc.training.kernels.rope_fusion
    return list(layer_ops(sc.model, sc.training, sc.plan, 0))


def _gpu_recorded(leaves: list[Any], forward: Callable[..., Any]) -> dict[str, tuple[int, float, float]]:
    return _recorded(lambda: leaves, forward, GpuKernels)


def _less_join(got: dict[str, tuple[int, float, float]], joined: int) -> dict[str, tuple[int, float, float]]:
    """Without the test's own final join of `joined` bytes (a forward cat, views in backward)."""
    return {"F": (got["F"][0] - 1, got["F"][1] - joined, got["F"][2] - joined), "I": got["I"]}


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
def test_megatron_unfused_rope_is_megatron_cores_chain(tmp_path: Path, dt: str) -> None:
    import types

    apply = _mcore_rope()
    ops = _mcore_job(tmp_path, dt, mla=False)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]
    config = types.SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=False, multi_latent_attention=False)
    freqs = torch.rand(S, 1, 1, HD)  # Megatron's RotaryEmbedding output: [s, 1, 1, rot_dim] fp32 angles

    def forward(q: Any, k: Any) -> Any:
        rot = [apply(x, freqs, config=config, cu_seqlens=None, mscale=1.0, cp_group=object()) for x in (q, k)]
        return torch.cat([rot[0].flatten(), rot[1].flatten()])

    got = _gpu_recorded([_leaf(S, B, HEADS, HD, dtype=dtype), _leaf(S, B, KV, HD, dtype=dtype)], forward)
    got = _less_join(got, S * B * (HEADS + KV) * HD * dtype.itemsize)
    chain = _chain(ops, "attn.rope")
    assert _projected(chain) == got
    assert got["F"][0] == (24 if dt == "bf16" else 20) and got["I"][0] == 14  # 12 (10) + 7 kernels a tensor


def test_megatron_unfused_mla_rope_and_joins(tmp_path: Path) -> None:
    """MLA's unfused branch (multi_latent_attention.py get_query_key_value_tensors, apply_rope_fusion off): split q
    and kv, RoPE on the query heads' and the shared key's rotary parts, join them back, copy V contiguous."""
    import types

    apply = _mcore_rope()
    ops = _mcore_job(tmp_path, "bf16", mla=True)
    config = types.SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=False, multi_latent_attention=True)
    freqs = torch.rand(S, 1, 1, RD)

    def forward(q: Any, kv: Any, k_pos: Any) -> Any:
        q_nope, q_pos = torch.split(q, [QK, RD], dim=-1)
        k_nope, value = torch.split(kv, [QK, DV], dim=-1)
        q_pos = apply(q_pos, freqs, config=config, cu_seqlens=None, mscale=1.0, cp_group=object())
        k_pos = apply(k_pos, freqs, config=config, cu_seqlens=None, mscale=1.0, cp_group=object())
        query = torch.cat([q_nope, q_pos], dim=-1)
        key = torch.cat([k_nope, k_pos.expand(-1, -1, HEADS, -1)], dim=-1)
        return torch.cat([query.contiguous().flatten(), key.contiguous().flatten(), value.contiguous().flatten()])

    bf = torch.bfloat16
    got = _gpu_recorded([_leaf(S, B, HEADS, QK + RD, dtype=bf), _leaf(S, B, HEADS, QK + DV, dtype=bf),
                         _leaf(S, B, 1, RD, dtype=bf)], forward)
    got = _less_join(got, S * B * HEADS * (2 * (QK + RD) + DV) * bf.itemsize)
    assert _projected(_chain(ops, "attn.rope") + _chain(ops, "attn.mla_join")) == got


def test_fused_rope_stays_one_kernel_a_direction(tmp_path: Path) -> None:
    ops = _mcore_job(tmp_path, "bf16", mla=False)
    path = tmp_path / "tiny.yaml"
    path.write_text(path.read_text(encoding="utf-8").replace("rope_fusion: false", "rope_fusion: true"),
                    encoding="utf-8")
    sc = api.load(path)
    fused = [o for o in layer_ops(sc.model, sc.training, sc.plan, 0) if o.name.startswith("attn.rope")]
    assert [o.phase for o in fused] == ["F", "I"] and len(_chain(ops, "attn.rope")) == 38


# ---- Megatron-Core's unfused bias-activation (--no-bias-gelu-fusion / --no-bias-swiglu-fusion:
# KernelSpec.bias_activation_fusion False, ops_eager.megatron_activation), run through Megatron-Core's own
# MLP.forward with its linears replaced by the test's tensors (fc1 returns the activation input and bias, fc2 passes
# its input on). The experts' bias_act_func (transformer/moe/experts.py) runs the same calls as MLP.forward with a
# per-token scale: the activation, then the product with the routing probabilities.

ACT = """\
model: {{name: tiny, num_layers: 1, hidden_size: {h}, num_attention_heads: {heads}, num_kv_heads: {heads},
        ffn_hidden_size: {ffn}, vocab_size: {vocab}, norm: layernorm, gated_mlp: {gated}, activation: {act},
        position_embedding: rope, tie_embeddings: false, add_bias_linear: {bias}{moe}}}
training: {{seq_length: {s}, micro_batch_size: {b}, global_batch_size: {b}, params_dtype: bf16,
           kernels: {{bias_activation_fusion: {fusion}}}}}
plan: {{tp: 1}}
cluster: {{hardware: h100-sxm, nodes: 1, gpus_per_node: 1}}
"""
EXPERTS, TOPK, EXPERT_FFN = 4, 2, 40


def _act_ops(tmp_path: Path, *, gated: bool, bias: bool, moe: bool, fusion: bool) -> list[Op]:
    extra = f", moe: {{num_experts: {EXPERTS}, top_k: {TOPK}, expert_ffn_hidden_size: {EXPERT_FFN}}}" if moe else ""
    path = tmp_path / "act.yaml"
    path.write_text(ACT.format(h=H, heads=HEADS, ffn=FFN, vocab=VOCAB, s=S, b=B, gated=str(gated).lower(),
                               act="silu" if gated else "gelu", bias=str(bias).lower(), moe=extra,
                               fusion=str(fusion).lower()), encoding="utf-8")
    sc = api.load(path)
    return list(layer_ops(sc.model, sc.training, sc.plan, 0))


@pytest.mark.parametrize(("gated", "bias", "moe", "fusion"), [
    (False, True, False, False),  # GeLU with the fc1 bias (Megatron-LM's default biases), fusion off
    (False, False, False, False),  # GeLU without biases: one kernel a direction, as fused
    (True, False, False, False),  # SwiGLU, no biases
    (True, True, False, False),  # SwiGLU with biases
    (False, False, True, True),  # GeLU experts: unfused even with the fusion on (Megatron-Core fuses SwiGLU only)
    (True, False, True, False),  # SwiGLU experts, fusion off
])
def test_megatron_unfused_activation_is_megatron_cores_mlp(tmp_path: Path, gated: bool, bias: bool, moe: bool,
                                                           fusion: bool) -> None:
    import types

    pytest.importorskip("megatron.core")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.mlp import MLP

    ops = _act_ops(tmp_path, gated=gated, bias=bias, moe=moe, fusion=fusion)
    fn = F.silu if gated else F.gelu
    rows, width = (B * S * TOPK, EXPERT_FFN) if moe else (B * S, FFN)
    branches = 2 if gated else 1
    config = types.SimpleNamespace(use_te_activation_func=False, bias_activation_fusion=False,
                                   gated_linear_unit=gated, activation_func=fn, activation_func_clamp_value=None,
                                   glu_linear_offset=0.0)
    bf = torch.bfloat16

    def forward(x: Any, *rest: Any) -> Any:
        b = rest[0] if bias else None
        probs = rest[-1] if moe else None
        me = types.SimpleNamespace(config=config, activation_func=fn, linear_fc1=lambda _: (x, b),
                                   linear_fc2=lambda y: (y, None))
        return MLP.forward(me, None, per_token_scale=probs)[0]

    leaves = [_leaf(rows, branches * width, dtype=bf), *([_leaf(branches * width, dtype=bf)] if bias else []),
              *([_leaf(rows, dtype=bf)] if moe else [])]
    got = _gpu_recorded(leaves, forward)
    assert _projected(_chain(ops, "moe.act" if moe else "mlp.act")) == got
