"""The memory peak of TorchTitan's uncompiled loss, measured by PyTorch's memory tracker on a real CPU step.

TorchTitan's training step computes `pred = model(inputs)`, `loss = cross_entropy(pred.flatten(0, 1).float(),
labels.flatten(0, 1))`, deletes `pred` and runs `loss.backward()` ("need to free pred before bwd to avoid peaking
memory"). Autograd saves the fp32 log-softmax; in backward nll_loss_backward makes a zero-filled fp32 gradient and
log_softmax's backward a second one while the saved result lives. The output layer's input and weight are left out
(they are counted elsewhere): the logits come from a bf16 leaf. The estimate of that moment is
`loss_tensors(...)["loss.softmax"] + loss_working_set(...)` (projection/memory/activations.py); it must equal the
tracker's peak of activations and temporaries within 1 % (the labels and scalars).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

from projection.memory.activations import loss_tensors, loss_working_set  # noqa: E402
from projection.specs.model import ModelSpec  # noqa: E402
from projection.specs.plan import ParallelPlan  # noqa: E402
from projection.specs.training import KernelSpec, TrainingSpec  # noqa: E402

B, S, VOCAB = 2, 512, 4000
MODEL = ModelSpec(name="tt-loss", num_layers=1, hidden_size=256, num_attention_heads=8, ffn_hidden_size=704,
                  vocab_size=VOCAB, vocab_divisible_by=1)


def _peak() -> float:
    """Peak bytes the tracker counts over the loss forward and backward, less the logits themselves (a leaf here,
    kept alive by the test; the output layer's result in a model, freed by the step)."""
    pred = torch.randn(B, S, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (B, S))
    tracker = MemTracker()
    tracker.track_external(pred)
    with tracker:
        loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        logits = pred
        del pred  # TorchTitan's step frees its reference; autograd holds none (log_softmax saves its result)
        loss.backward()
    peak = tracker.get_tracker_snapshot("peak")
    by_kind = next(iter(peak.values()))
    # the leaf stays alive here (a model frees it with `del pred`); its gradient is made after the peak
    return float(by_kind["Total"]) - logits.untyped_storage().nbytes()


def test_eager_loss_peak_is_three_fp32_logits() -> None:
    training = TrainingSpec(seq_length=S, micro_batch_size=B, kernels=KernelSpec(transformer_impl="torchtitan"))
    plan = ParallelPlan(dp=1)
    want = loss_tensors(MODEL, training, plan)["loss.softmax"] + loss_working_set(MODEL, training, plan)
    got = _peak()
    print(f"\nprojected {want / 2**20:.2f} MiB, measured {got / 2**20:.2f} MiB ({got / (4 * B * S * VOCAB):.3f} fp32 "
          "logits)")
    assert want == pytest.approx(got, rel=0.01)
