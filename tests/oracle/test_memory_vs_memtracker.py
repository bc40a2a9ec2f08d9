"""The memory estimator against PyTorch's own memory tracker on one real CPU training step.

Each configuration builds a plain-PyTorch decoder (tests/oracle/memory_models.py) from the same `ModelSpec` the
estimator gets, and runs forward, cross-entropy loss, backward and one `torch.optim.Adam` step in fp32 under
`torch.distributed._tools.mem_tracker.MemTracker`, which files every tensor storage (counted once however many
views share it; on the CPU its bytes are exactly numel x element size) as PARAM, BUFFER, GRAD, ACT (created in
forward or in a checkpoint's recompute), TEMP (created in backward) or OPT (created in the optimizer step).

Compared quantities:

* weights = measured PARAM; gradients = GRAD after backward; optimizer = OPT after the step: Adam's two fp32
  moments plus its per-parameter-tensor float32 `step` counters (`model_state_bytes(..., step_counter_bytes=4)`).
  All three must be equal, byte for byte.
* activations: the estimator's `bytes["activations"]` of `estimate_memory` (saved tensors of the in-flight
  microbatch plus the working set of the rank's worst moment) against the *measured activation peak*: the maximum,
  sampled after every ATen op of forward and backward (a dispatch mode nested inside the tracker), of
  ACT + TEMP minus the bytes of storages that hold parameter-gradient values while the tracker still files them as
  TEMP (a weight gradient from the op that computes it until AccumulateGrad hands it to the tracker's gradient
  hook, and the tied output layer's contribution that waits in autograd's input buffer for the embedding's):
  those are gradients, which the estimator counts in `gradients`. ACT includes the token ids and labels, created
  inside the tracker. Must agree within 5 %.

Run with `-s` to see the table of projected vs measured bytes.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from projection.memory.estimate import estimate_memory  # noqa: E402
from projection.memory.model_states import model_state_bytes  # noqa: E402
from projection.specs.hardware import ClusterSpec, load_device  # noqa: E402
from projection.specs.model import ModelSpec, MoESpec  # noqa: E402
from projection.specs.plan import ParallelPlan, RecomputeSpec  # noqa: E402
from projection.specs.scenario import Scenario  # noqa: E402
from projection.specs.training import OptimizerSpec, TrainingSpec  # noqa: E402
from projection.workload.params import per_rank_params  # noqa: E402
from tests.oracle.memory_models import Decoder  # noqa: E402

pytestmark = pytest.mark.slow  # one real training step per configuration under the tracker: seconds each

SEQ, MICRO_BATCH = 256, 2
ADAM_STEP_BYTES = 4  # torch.optim.Adam: state["step"] = torch.tensor(0.0) (float32) per parameter tensor

LLAMA = ModelSpec(name="llama-gqa", num_layers=4, hidden_size=256, num_attention_heads=8, num_kv_heads=2,
                  ffn_hidden_size=704, gated_mlp=True, activation="silu", vocab_size=1000, norm="rmsnorm",
                  position_embedding="rope", tie_embeddings=False)
GPT = ModelSpec(name="gpt-mha", num_layers=4, hidden_size=256, num_attention_heads=8, ffn_hidden_size=1024,
                gated_mlp=False, activation="gelu", vocab_size=1000, norm="layernorm", add_bias_linear=True,
                position_embedding="learned", max_position_embeddings=SEQ, tie_embeddings=True)
MOE = ModelSpec(name="moe-gqa", num_layers=4, hidden_size=256, num_attention_heads=8, num_kv_heads=2,
                ffn_hidden_size=704, vocab_size=1000,
                moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=256, shared_expert_ffn_hidden_size=256,
                            num_shared_experts=1, first_k_dense=1))


@dataclass(frozen=True)
class Case:
    spec: ModelSpec
    attention: str  # flash | unfused
    dropout: float
    recompute: str  # none | full | selective
    selective: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        rc = self.recompute + (f"({','.join(self.selective)})" if self.recompute == "selective" else "")
        return f"{self.spec.name}/{self.attention}{'+dropout' if self.dropout else ''}/{rc}"


def _cases() -> list[Case]:
    out = []
    for spec, attention, dropout, selective in ((LLAMA, "flash", 0.0, ("core_attn",)),
                                                (GPT, "unfused", 0.1, ("core_attn",)),
                                                (MOE, "flash", 0.0, ("moe",))):
        for rc in ("none", "full", "selective"):
            out.append(Case(spec, attention, dropout, rc, selective if rc == "selective" else ()))
    return out


CASES = _cases()

def scenario(case: Case) -> Scenario:
    training = TrainingSpec(seq_length=SEQ, micro_batch_size=MICRO_BATCH, params_dtype="fp32",
                            dropout=case.dropout, attention_backend=case.attention,
                            optimizer=OptimizerSpec(name="adam"))
    if case.recompute == "full":
        rec = RecomputeSpec(granularity="full", method="uniform", num_layers=1)
    elif case.recompute == "selective":
        rec = RecomputeSpec(granularity="selective", modules=case.selective)
    else:
        rec = RecomputeSpec()
    plan = ParallelPlan(tp=1, pp=1, dp=1, recompute=rec)
    cluster = ClusterSpec(device=load_device("h100-sxm"), nodes=1, gpus_per_node=1)
    return Scenario(model=case.spec, training=training, plan=plan, cluster=cluster)


# ---- measurement -------------------------------------------------------------------------------------------------

def _by_kind(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    """MemTracker snapshot {device: {_MemRefType | 'Total': bytes}} -> {'Activation': bytes, ...} over devices."""
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for kind, n in per_device.items():
            name = getattr(kind, "value", str(kind))
            out[name] = out.get(name, 0) + n
    return out


class _Storage:
    """Lifetime of one tensor storage, in sample indices."""

    __slots__ = ("born", "nbytes", "ref", "died", "graded", "__weakref__")

    def __init__(self, born: int, st: Any) -> None:
        self.born, self.nbytes, self.died, self.graded = born, st.nbytes(), None, None
        self.ref: Any = None


class _Sampler(TorchDispatchMode):
    """Entered inside the MemTracker: after each op (which the tracker has just accounted) reads ACT + TEMP, and
    remembers when each storage appeared and died, to take out parameter-gradient storages afterwards."""

    def __init__(self, tracker: MemTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.n = -1
        self.act_temp: list[int] = []
        self.ops: list[str] = []
        self.live: dict[int, _Storage] = {}  # id(storage) -> its record while it lives
        self.grads: list[_Storage] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        res = func(*args, **(kwargs or {}))
        self.n += 1
        for t in tree_flatten(res)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                rec = self.live.get(id(st))
                if rec is None or rec.ref() is not st:
                    rec = _Storage(self.n, st)
                    rec.ref = weakref.ref(st, functools.partial(self._died, rec))
                    self.live[id(st)] = rec
        kinds = _by_kind(self.tracker.get_tracker_snapshot())
        self.act_temp.append(kinds.get("Activation", 0) + kinds.get("Temp", 0))
        self.ops.append(str(func))
        return res

    def _died(self, rec: _Storage, _ref: Any) -> None:
        rec.died = self.n

    def gradient(self, t: Any, handed_over: bool = False) -> None:
        """`t` holds parameter-gradient values; `handed_over`: the tracker files it as GRAD from now on."""
        st = t.untyped_storage()
        rec = self.live.get(id(st))
        if rec is None or rec.ref() is not st:
            return  # not created under the sampler (cannot be TEMP)
        if rec not in self.grads:
            self.grads.append(rec)
        if handed_over and rec.graded is None:
            rec.graded = self.n

    def watch_gradients(self, loss: Any, model: Any) -> list[Any]:
        """Hooks that report parameter-gradient tensors: the outputs of every autograd node feeding a parameter's
        AccumulateGrad (weight gradients, tied-weight contributions), and the gradient the tracker's own parameter
        hooks file as GRAD (pre-accumulation hook and the accumulated .grad)."""
        params = {id(p) for p in model.parameters()}
        seen, stack = set(), [loss.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            edges = []
            for i, (nxt, _) in enumerate(node.next_functions):
                if nxt is None:
                    continue
                if type(nxt).__name__ == "AccumulateGrad" and id(nxt.variable) in params:
                    edges.append(i)
                else:
                    stack.append(nxt)
            if edges:
                def hook(grad_inputs: Any, grad_outputs: Any, edges: tuple[int, ...] = tuple(edges)) -> None:
                    for i in edges:
                        if grad_inputs[i] is not None:
                            self.gradient(grad_inputs[i])
                node.register_hook(hook)
        handles = []
        for p in model.parameters():
            handles.append(p.register_hook(lambda g: self.gradient(g, handed_over=True)))
            handles.append(p.register_post_accumulate_grad_hook(lambda q: self.gradient(q.grad, handed_over=True)))
        return handles

    def activation_trace(self) -> list[int]:
        """ACT + TEMP per sample, minus parameter-gradient storages while they were still TEMP."""
        minus = [0] * len(self.act_temp)
        last = len(self.act_temp) - 1
        for rec in self.grads:
            end = min(x for x in (rec.graded, rec.died, last) if x is not None)
            for i in range(rec.born, end + 1):
                minus[i] += rec.nbytes
        return [a - m for a, m in zip(self.act_temp, minus, strict=True)]


@dataclass(frozen=True)
class Measured:
    params: int
    buffers: int
    grads: int
    optimizer: int
    activation_peak: int
    peak_op: str
    peak_phase: str


@functools.cache
def measure(case: Case) -> Measured:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        return _measure(case)
    finally:
        torch.set_num_threads(threads)


def _measure(case: Case) -> Measured:
    torch.manual_seed(0)
    model = Decoder(case.spec, SEQ, attention=case.attention, dropout=case.dropout, recompute=case.recompute,
                    selective=case.selective)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        ids = torch.randint(0, case.spec.vocab_size, (MICRO_BATCH, SEQ))
        labels = torch.randint(0, case.spec.vocab_size, (MICRO_BATCH, SEQ))
        sampler = _Sampler(tracker)
        with sampler:
            loss = model(ids, labels)
            forward_ops = sampler.n + 1
            handles = sampler.watch_gradients(loss, model)
            loss.backward()
        for h in handles:
            h.remove()
        after_backward = _by_kind(tracker.get_tracker_snapshot())
        opt.step()
        after_step = _by_kind(tracker.get_tracker_snapshot())
    trace = sampler.activation_trace()
    i = max(range(len(trace)), key=trace.__getitem__)
    return Measured(params=after_step["Parameter"], buffers=after_step["Buffer"], grads=after_backward["Gradient"],
                    optimizer=after_step["Optstate"], activation_peak=trace[i], peak_op=sampler.ops[i],
                    peak_phase="forward" if i < forward_ops else "backward")


@dataclass(frozen=True)
class Projected:
    weights: int
    gradients: int
    optimizer: int
    activations: int
    terms: dict[str, int]


def project(case: Case) -> Projected:
    sc = scenario(case)
    (rank,) = per_rank_params(sc.model, sc.plan)
    states = model_state_bytes(sc.model, sc.training, sc.plan, rank, step_counter_bytes=ADAM_STEP_BYTES)
    report = estimate_memory(sc)
    (r,) = report.ranks
    terms = {k: v for k, v in r.terms.items() if k.startswith(("activations.", "working."))}
    return Projected(states.weights, states.gradients, states.optimizer, r.bytes["activations"], terms)


# ---- tests -------------------------------------------------------------------------------------------------------

def _mib(n: float) -> str:
    return f"{n / 2**20:9.3f}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_model_states_equal_measured_bytes(case: Case) -> None:
    got, want = project(case), measure(case)
    print(f"\n{case.name}: weights {got.weights} / {want.params}, gradients {got.gradients} / {want.grads}, "
          f"optimizer {got.optimizer} / {want.optimizer} (projected / measured bytes)")
    assert got.weights == want.params
    assert got.gradients == want.grads
    assert got.optimizer == want.optimizer


@pytest.mark.parametrize("case", CASES)
def test_activation_peak_within_5_percent(case: Case) -> None:
    got, want = project(case), measure(case)
    ratio = got.activations / want.activation_peak
    print(f"\n{case.name}: projected {got.activations} B, measured {want.activation_peak} B "
          f"({want.peak_phase}, at {want.peak_op}), ratio {ratio:.4f}; terms {got.terms}")
    assert abs(ratio - 1) <= 0.05


def test_print_table() -> None:
    """Projected vs measured for every configuration (MiB); ratio = projected / measured."""
    head = (f"{'configuration':44} {'weights':>9} {'grads':>9} {'optim':>9} {'meas':>9} {'act proj':>9} "
            f"{'act meas':>9} {'ratio':>6}  peak at")
    lines = ["", head, "-" * len(head)]
    for case in CASES:
        got, want = project(case), measure(case)
        ok = "=" if (got.weights, got.gradients, got.optimizer) == (want.params, want.grads, want.optimizer) \
            else "!="
        lines.append(f"{case.name:44} {_mib(got.weights)} {_mib(got.gradients)} {_mib(got.optimizer)} {ok:>9} "
                     f"{_mib(got.activations)} {_mib(want.activation_peak)} "
                     f"{got.activations / want.activation_peak:6.3f}  {want.peak_phase} {want.peak_op}")
    print("\n".join(lines))
