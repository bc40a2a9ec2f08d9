"""Saved-activation bytes of compiled TorchTitan blocks and of the compiled loss, measured on a real CPU forward
under torch.compile, against the estimator's compiled inventory (KernelSpec.compiled, training.fused_loss).

TorchTitan compiles each TransformerBlock (`[compile] enable`, component "model") and the loss (component "loss").
What a compiled graph keeps for backward is chosen by AOTAutograd's min-cut partitioner, the same code for every
device; the `aot_eager_decomp_partition` backend runs it with Inductor's decompositions and partitioner
(`min_cut_rematerialization_partition(compiler="inductor")`) and executes the graphs eagerly, so no C++ compiler is
needed. The saved tensors are caught where the compiled function saves them for backward (`saved_tensors_hooks`),
parameters and buffers left out. The block is tests/oracle/torchtitan_layers.py's, with F.rms_norm for the norms
(under compile it is decomposed on a GPU too, so the fused kernel's saved set does not apply) and real SDPA.

Measured (2026-11-30, torch 2.13 CPU): a compiled dense block saves the eager inventory less the SwiGLU's SiLU output,
which the partitioner recomputes from the saved w1 output; the only other difference is the norms' fp32 per-row
statistics, which the estimator leaves out (as in test_memory_torchtitan_layers.py: within 0.5 %). A compiled MoE
block (bf16, grouped_mm) saves other tensors of about the same total (+0.5 % over the eager inventory), so MoE
experts keep the eager inventory. The compiled loss keeps the bf16 logits (2 B per logit) where the eager loss keeps
the fp32 log-softmax (4 B): the fused-loss inventory.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from projection.memory.activations import layer_tensors, loss_tensors, saved_layer_bytes  # noqa: E402
from projection.specs.model import ModelSpec  # noqa: E402
from projection.specs.plan import ParallelPlan, RecomputeSpec  # noqa: E402
from projection.specs.training import KernelSpec, TrainingSpec  # noqa: E402
from tests.oracle import torchtitan_layers as tl  # noqa: E402
from tests.oracle.test_memory_torchtitan_layers import LLAMA, MICRO_BATCH, QWEN3, SEQ  # noqa: E402

TOLERANCE = 0.005  # the norms' fp32 statistics (module docstring)


class _Norm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, 1e-6)


class _GqaNativeAttention(tl.Attention):
    """Primus-Turbo's Llama attention: no repeat_kv, the kernel takes K and V with their own heads (SDPA's
    enable_gqa stands in for the turbo flash kernel; both save q, k, v, the output and the log-sum-exp)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        xq = self.wq(x).view(b, s, -1, self.d)
        xk = self.wk(x).view(b, s, -1, self.d)
        xv = self.wv(x).view(b, s, -1, self.d)
        xq, xk = tl._rotate(self.q_norm(xq), self.freqs_cis), tl._rotate(self.k_norm(xk), self.freqs_cis)
        o = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                           is_causal=True, enable_gqa=True)
        return self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))


def _saved_bytes(fn: Any, *inputs: torch.Tensor, skip: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    """Bytes of the distinct storages `fn` saves for backward (runs the backward too, to prove it is real)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    out.float().sum().backward()
    return sum(seen.values())


@functools.cache
def _block_bytes(spec: ModelSpec, gqa_native: bool) -> int:
    torch.manual_seed(0)
    block = tl.Block(spec, 0, SEQ, sdpa=True)
    if gqa_native:
        native = _GqaNativeAttention(spec, SEQ, True)
        native.load_state_dict(block.attention.state_dict())
        block.attention = native
    return _compiled_block_bytes(block, spec, fullgraph=True)


def _compiled_block_bytes(block: nn.Module, spec: ModelSpec, *, fullgraph: bool) -> int:
    """What `block` saves for backward compiled with Inductor's partitioner, its norms F.rms_norm (decomposed under
    compile, as on a GPU), parameters and buffers left out."""
    for module in list(block.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, tl.RMSNorm):
                setattr(module, name, _Norm(child.weight.shape[0]))
    skip = {t.untyped_storage().data_ptr() for t in (*block.parameters(), *block.buffers())}
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="aot_eager_decomp_partition", fullgraph=fullgraph)
    return _saved_bytes(compiled, torch.randn(MICRO_BATCH, SEQ, spec.hidden_size, requires_grad=True), skip=skip)


def _training(compiled: bool, gqa_native: bool = False) -> TrainingSpec:
    return TrainingSpec(seq_length=SEQ, micro_batch_size=MICRO_BATCH, params_dtype="fp32", attention_backend="flash",
                        kernels=KernelSpec(transformer_impl="torchtitan", compiled=compiled,
                                           gqa_native_attention=gqa_native))


@pytest.mark.parametrize(("spec", "gqa_native"), [(LLAMA, False), (QWEN3, False), (LLAMA, True)],
                         ids=["llama-gqa", "qwen3", "llama-gqa-native"])
def test_compiled_block_saved_bytes(spec: ModelSpec, gqa_native: bool) -> None:
    measured = _block_bytes(spec, gqa_native)
    plan = ParallelPlan(dp=1)
    compiled = layer_tensors(spec, _training(True, gqa_native), plan, 0)
    eager = sum(layer_tensors(spec, _training(False, gqa_native), plan, 0).values())
    got = sum(compiled.values())
    print(f"\n{spec.name}{' gqa-native' if gqa_native else ''}: projected {got / 2**20:.3f} MiB (eager inventory "
          f"{eager / 2**20:.3f}), measured {measured / 2**20:.3f} MiB, ratio {got / measured:.4f}")
    assert got == pytest.approx(measured, rel=TOLERANCE)
    assert abs(eager / measured - 1) > 2 * TOLERANCE  # the eager inventory would not pass: compile changes it


def test_compiled_loss_keeps_the_16_bit_logits() -> None:
    """TorchTitan's loss, F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1)), compiled: the logits
    are saved in bf16 (2 B each) with per-row statistics, not the fp32 log-softmax (4 B) eager autograd keeps."""
    b, s, vocab = MICRO_BATCH, 128, 1000

    def loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    labels = torch.randint(0, vocab, (b, s))
    measured = {}
    for name, fn in (("eager", loss), ("compiled", torch.compile(loss, backend="aot_eager_decomp_partition"))):
        torch._dynamo.reset()
        pred = torch.randn(b, s, vocab, dtype=torch.bfloat16, requires_grad=True)
        measured[name] = _saved_bytes(fn, pred, labels)
    model = LLAMA.model_copy(update={"vocab_size": vocab, "vocab_divisible_by": 1})
    for fused, name in ((True, "compiled"), (False, "eager")):
        training = TrainingSpec(seq_length=s, micro_batch_size=b, fused_loss=fused,
                                kernels=KernelSpec(transformer_impl="torchtitan"))
        want = loss_tensors(model, training, ParallelPlan(dp=1))["loss.softmax"]
        print(f"\n{name} loss: projected {want:.0f} B, measured {measured[name]} B")
        assert want == pytest.approx(measured[name], rel=0.02)  # + labels and per-row statistics: 0.8 %


def test_compiled_op_sac_keeps_only_what_backward_reads() -> None:
    """TorchTitan's per-op selective checkpointing under torch.compile (checkpoint_wrapper, then compile): the policy's
    saved mm outputs that backward never reads are dropped by the partitioner. In a Llama block that is w2's output
    (the 7th mm, saved by the policy in eager mode), which only feeds the residual add."""
    torch.manual_seed(0)
    # not fullgraph: dynamo runs the checkpoint's context_fn policy around its graph
    measured = _compiled_block_bytes(tl.OpSacBlock(LLAMA, 0, SEQ), LLAMA, fullgraph=False)
    plan = ParallelPlan(dp=1, recompute=RecomputeSpec(granularity="selective", modules=("op",)))
    got = saved_layer_bytes(LLAMA, _training(True), plan, 0, False)
    eager = saved_layer_bytes(LLAMA, _training(False), plan, 0, False)
    print(f"\nop SAC compiled: projected {got:.0f} B (eager {eager:.0f}), measured {measured} B")
    assert got == pytest.approx(measured, rel=1e-4) and eager > measured * 1.1
