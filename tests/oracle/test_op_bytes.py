"""Bytes of the memory-bound ops of unfused attention against the tensors PyTorch's own kernels read and write.

The workload (projection/workload/ops_attention.py `_unfused`) prices softmax and attention dropout by the bytes they
move. The oracle runs the same kernels a framework runs on the GPU (aten `_softmax`, `native_dropout`, and in backward
`native_dropout_backward`, `_softmax_backward_data`) on a small tensor of the scenario's shape and dtype under a
TorchDispatchMode that sums the bytes of every tensor each aten call takes and returns; each priced op must equal its
kernel exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from projection import api  # noqa: E402
from projection.workload.ops import layer_ops  # noqa: E402

CONFIG = """\
model: {name: tiny, num_layers: 1, hidden_size: 64, num_attention_heads: 4, ffn_hidden_size: 128, vocab_size: 256,
        norm: layernorm, gated_mlp: false, activation: gelu, position_embedding: learned, max_position_embeddings: 32}
training: {seq_length: 32, micro_batch_size: 2, global_batch_size: 2, params_dtype: bf16,
           attention_backend: unfused, dropout: 0.1}
plan: {tp: 1}
cluster: {hardware: mi300x, nodes: 1, gpus_per_node: 1}
"""


class KernelBytes(TorchDispatchMode):
    """(aten op, bytes of tensor inputs, bytes of tensor outputs) of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        counted = self.read_bytes(name, inputs)
        if counted is not None:
            written = sum(t.nbytes for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
            self.calls.append((name, counted, written))
        return out

    def read_bytes(self, name: str, inputs: list[Any]) -> int | None:
        """Bytes the call reads (every input tensor's), or None where the call is not recorded."""
        return sum(t.nbytes for t in inputs)


def test_unfused_softmax_and_dropout_bytes_equal_the_aten_kernels(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    sc = api.load(path)
    ops = {(o.name, o.phase): o for o in layer_ops(sc.model, sc.training, sc.plan, 0) if o.kind == "memory_bound"}
    b, s, heads = sc.training.micro_batch_size, sc.training.seq_length, sc.model.num_attention_heads
    scores = torch.randn(b, heads, s, s, dtype=torch.bfloat16, requires_grad=True)
    with KernelBytes() as mode:
        probs = torch.softmax(scores, dim=-1)
        dropped, _mask = torch.native_dropout(probs, 0.1, True)
        dropped.backward(torch.randn_like(dropped))
    kernels = {name: (read, written) for name, read, written in mode.calls}
    expected = {("attn.core.softmax", "F"): kernels["_softmax"],
                ("attn.core.dropout", "F"): kernels["native_dropout"],
                ("attn.core.dropout.bwd", "I"): kernels["native_dropout_backward"],
                ("attn.core.softmax.bwd", "I"): kernels["_softmax_backward_data"]}
    for key, (read, written) in expected.items():
        op = ops[key]
        assert (op.bytes_read, op.bytes_written) == (read, written), key


def test_count_zeros_per_gradient_tensor_dispatches_three_aten_ops() -> None:
    """Megatron's --log-num-zeros-in-grad adds `numel - count_nonzero(grad)` into a running total per gradient
    tensor: PyTorch dispatches count_nonzero, rsub and add for it (seen here); on CUDA count_nonzero runs as a compare
    and a sum (ATen count_nonzero_cuda), hence projection.perf.optimizer.COUNT_ZEROS_KERNELS = 4 launches."""
    from projection.perf.optimizer import COUNT_ZEROS_KERNELS

    total = torch.zeros(1)
    grads = [torch.randn(64, 8), torch.zeros(8), torch.randn(3)]
    with KernelBytes() as seen:
        for g in grads:
            total = (g.numel() - torch.count_nonzero(g)) + total
    names = [name for name, _, _ in seen.calls]
    assert names == ["count_nonzero", "rsub", "add"] * len(grads)
    assert int(total.item()) == 8 and len(names) // len(grads) + 1 == COUNT_ZEROS_KERNELS


def test_nan_check_is_one_kernel_and_a_host_read() -> None:
    """Megatron's validate_result evaluates `if torch.isnan(loss)` (and isinf): one element-wise op, then the Python
    bool of the tensor, which reads it on the host (_local_scalar_dense: on CUDA a device-to-host copy and a wait);
    a bucket check first takes `grad_data.norm(p=2)`, one reduction. projection/perf/checks.py prices exactly these."""
    from projection.perf.action_time import run_items
    from projection.perf.checks import grad_check_items, scalar_check_items

    loss, bucket = torch.tensor(2.5), torch.randn(1000)
    with KernelBytes() as seen:
        norm = bucket.norm(p=2)
        for value in (loss, norm):
            for check in (torch.isnan, torch.isinf):
                assert not bool(check(value))
    names = [name for name, _, _ in seen.calls]
    assert names == ["linalg_vector_norm"] + ["isnan", "_local_scalar_dense", "isinf", "_local_scalar_dense"] * 2
    items = grad_check_items([4000.0], lambda op: 1e-6, "optimizer") + scalar_check_items("loss", lambda op: 1e-6)
    runs = [i for i in items if i.mode == "run"]
    reads = [i for i in items if i.mode == "sync"]
    assert len(runs) == names.count("linalg_vector_norm") + names.count("isnan") + names.count("isinf")
    assert len(reads) == names.count("_local_scalar_dense")
    assert run_items(items).kernels == len(runs) + len(reads)  # each host read issues its device-to-host copy
