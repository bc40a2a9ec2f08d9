"""End to end on this machine (issue 5): calibrate on the CPU, project, and compare with what PyTorch really takes.

1. `projection calibrate gemm | attention | memory --device cpu` on the shapes of a small Llama-style job (a native
   scenario YAML written to tmp_path), then the forward + backward compute time of one training step projected as
   the sum of `CalibratedCostModel.op_seconds` over every op of the job's op list (embedding, decoder layers, output
   layer and loss; phases F, I and W), against the measured forward + backward of the same model written in plain
   PyTorch (fp32, GQA, RoPE, RMSNorm, SwiGLU, untied output layer, cross-entropy), for several (model, batch)
   configurations: within 15 %; and the forward's share of that step (F-phase ops against the real forward / (forward
   + backward), what pipeline schedules are built from): within 10 %.
2. `projection calibrate collective` (gloo, 2 processes) over a range of sizes, the calibrated model's all-reduce
   pricing (curves fitted by projection/calibrate/fit.py) at a size not in that range's measured set, against a gloo
   all-reduce of that size timed by 2 processes the test spawns: within 25 %.

Robustness on a shared 2-core machine whose load changes by the second: warm-up and medians of repeats on both
sides, calibration and measurement alternating in rounds (a change of load weighs on both). Training step: one
fresh process per configuration, one intra-op thread (`torch.set_num_threads(1)`) for its microbenchmarks and its
training step alike, a glibc heap that keeps freed memory (see `_steady_heap`), GEMM / attention rounds merged as
the calibrated model merges rows of equal shape (geometric mean), the step's median over all its samples. All-reduce:
the median over rounds on both sides (see the test).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from projection import api, cli  # noqa: E402
from projection.calibrate.calibration import (  # noqa: E402
    Calibration,
    CollectiveRow,
    load_calibration,
    merge_calibrations,
)
from projection.cost.calibrated import CalibratedCostModel  # noqa: E402
from projection.cost.collectives import Fabric, GroupPlacement, TierParams  # noqa: E402
from projection.specs.model import ModelSpec  # noqa: E402
from projection.workload.ops import Op, embedding_ops, layer_ops, output_ops  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # times this machine: run alone (README)

STEP_TOLERANCE = 0.15  # issue 5: projected forward + backward compute time of a CPU training step
COLLECTIVE_TOLERANCE = 0.25  # issue 5: gloo all-reduce of a size outside the calibrated set
SHARE_TOLERANCE = 0.10  # the forward's share of the same step: a ratio of two parts timed together


# ------------------------------------------------------------------------------------------------ training step


class Attention(nn.Module):
    """Fused QKV, rotary embedding (one complex multiply of the Q and K heads), causal SDPA with GQA, output proj."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.a, self.g, self.d = m.num_attention_heads, m.kv_heads, m.head_dim_
        self.qkv = nn.Linear(m.hidden_size, (self.a + 2 * self.g) * self.d, bias=False)
        self.proj = nn.Linear(self.a * self.d, m.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.a + 2 * self.g, self.d)
        qk = torch.view_as_complex(qkv[:, :, : self.a + self.g].unflatten(-1, (-1, 2)))
        qk = torch.view_as_real(qk * rotary[:, None, :]).flatten(-2)
        q, k = qk[:, :, : self.a].transpose(1, 2), qk[:, :, self.a:].transpose(1, 2)
        v = qkv[:, :, self.a + self.g:].transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.g != self.a)
        return self.proj(o.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.fc1 = nn.Linear(m.hidden_size, 2 * m.ffn_hidden_size, bias=False)
        self.fc2 = nn.Linear(m.ffn_hidden_size, m.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(x).chunk(2, -1)
        return self.fc2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(m.hidden_size), nn.RMSNorm(m.hidden_size)
        self.attn, self.mlp = Attention(m), SwiGLU(m)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x), rotary)
        return x + self.mlp(self.n2(x))


class Llama(nn.Module):
    def __init__(self, m: ModelSpec, seq: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(m.vocab_size, m.hidden_size)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m.num_layers))
        self.norm = nn.RMSNorm(m.hidden_size)
        self.head = nn.Linear(m.hidden_size, m.vocab_size, bias=False)
        d = m.head_dim_
        inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2).float() / d)
        angles = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("rotary", torch.polar(torch.ones_like(angles), angles))

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x, self.rotary)
        return F.cross_entropy(self.head(self.norm(x)).flatten(0, 1), targets.flatten())


# (hidden, layers, heads, kv heads, ffn, vocab, seq, micro batch): ~0.3 to 0.7 s per step on one core
CONFIGS = {
    "h512-l2-s256-b2": (512, 2, 8, 2, 1344, 4096, 256, 2),
    "h768-l2-s512-b1": (768, 2, 12, 4, 2048, 4096, 512, 1),
    "h1024-l2-s256-b1": (1024, 2, 16, 4, 2816, 4096, 256, 1),
    "h512-l3-s256-b3": (512, 3, 8, 2, 1344, 4096, 256, 3),
}


def _scenario_yaml(path: Path, cfg: tuple[int, ...]) -> Path:
    h, layers, heads, kv, ffn, vocab, seq, mbs = cfg
    doc = {"model": {"name": path.stem, "num_layers": layers, "hidden_size": h, "num_attention_heads": heads,
                     "num_kv_heads": kv, "ffn_hidden_size": ffn, "vocab_size": vocab},
           "training": {"seq_length": seq, "micro_batch_size": mbs, "global_batch_size": mbs, "params_dtype": "fp32",
                        "gradient_accumulation_fusion": False, "attention_backend": "flash"},
           "plan": {"tp": 1},
           "cluster": {"hardware": "mi300x", "nodes": 1, "gpus_per_node": 1}}  # a placeholder: nothing is priced by it
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _calibrate(*argv: str) -> None:
    assert cli.main(["calibrate", *argv, "--device", "cpu", "--quiet"]) == 0


def _step_ops(config: Path) -> list[Op]:
    sc = api.load(config)
    m, t, p = sc.model, sc.training, sc.plan
    return [*embedding_ops(m, t, p), *(o for i in range(m.num_layers) for o in layer_ops(m, t, p, i)),
            *output_ops(m, t, p)]


def _steady_heap() -> None:
    """Keep freed memory in glibc's heap (no trimming, no mmap below 32 MiB), as a GPU run's caching allocator
    does: otherwise each step page-faults its activations back in (~2 us per 4 KiB page in this VM, 0 to 5 % of a
    step depending on where the heap top happens to lie), work that is neither a kernel nor in the op list."""
    path = ctypes.util.find_library("c")
    if path is None:
        return
    libc = ctypes.CDLL(path)
    if hasattr(libc, "mallopt"):
        libc.mallopt(-1, 2**30)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD (its maximum on 64-bit glibc)


class StepTimer:
    """Forward + backward (loss.backward(), no optimizer) of the real model; gradients dropped untimed before. Each
    sample also records the forward's share of its step."""

    def __init__(self, m: ModelSpec, seq: int, batch: int) -> None:
        torch.manual_seed(0)
        self.model = Llama(m, seq)
        self.tokens = torch.randint(0, m.vocab_size, (batch, seq))
        self.targets = torch.randint(0, m.vocab_size, (batch, seq))
        self.samples: list[float] = []
        self.forward_shares: list[float] = []

    def step(self) -> tuple[float, float]:
        self.model.zero_grad(set_to_none=True)
        gc.collect()
        t0 = time.perf_counter()
        loss = self.model(self.tokens, self.targets)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        return t2 - t0, (t1 - t0) / (t2 - t0)

    def measure(self, warmup: int, repeat: int) -> None:
        for _ in range(warmup):
            self.step()
        for _ in range(repeat):
            total, share = self.step()
            self.samples.append(total)
            self.forward_shares.append(share)


STEP_ROUNDS = 3  # calibrations of the GEMM and attention shapes; the step is timed before, between and after them
STEP_REPEAT = 3


def project_and_measure(name: str, workdir: str) -> dict[str, Any]:
    """Run in a fresh process (one intra-op thread, steady heap): calibrate on the job's shapes and time the real
    step, alternately, then price the op list with the merged calibration. Returns the numbers for the test."""
    _steady_heap()
    torch.set_num_threads(1)  # microbenchmarks and training step alike
    tmp = Path(workdir)
    config = _scenario_yaml(tmp / f"{name}.yaml", CONFIGS[name])
    ops = _step_ops(config)
    sc = api.load(config)
    timer = StepTimer(sc.model, sc.training.seq_length, sc.training.micro_batch_size)
    timer.measure(warmup=2, repeat=0)

    sizes = [o.bytes_read + o.bytes_written for o in ops if o.kind == "memory_bound"]
    lo, hi = min(sizes), 1.05 * max(sizes)
    files = [tmp / "memory.json"]
    _calibrate("memory", "--config", str(config), "--sizes", ",".join(str(int(lo * (hi / lo) ** (i / 5)))
                                                                    for i in range(6)),
               "--dtype", "fp32", "--warmup", "3", "--repeat", "10", "--out", str(files[0]))
    for i in range(STEP_ROUNDS):  # the step's samples bracket every calibration round
        timer.measure(warmup=0, repeat=STEP_REPEAT)
        for kind in ("gemm", "attention"):
            files.append(tmp / f"{kind}{i}.json")
            _calibrate(kind, "--config", str(config), "--dtype", "fp32", "--warmup", "2", "--repeat", "5",
                       "--out", str(files[-1]))
    timer.measure(warmup=0, repeat=STEP_REPEAT)

    cal = merge_calibrations(load_calibration(f) for f in files)  # equal shapes of the rounds: geometric mean
    cost = CalibratedCostModel(cal, name=f"{name}.json")  # a CPU has no DeviceSpec: no roofline fallback
    by_kind: dict[str, float] = {}
    forward = 0.0
    for op in ops:
        by_kind[op.kind] = by_kind.get(op.kind, 0.0) + cost.op_seconds(op)
        forward += cost.op_seconds(op) if op.phase == "F" else 0.0
    return {"by_kind": by_kind, "samples": timer.samples, "gemm_rows": len(cal.gemm),
            "forward_share": forward / sum(by_kind.values()), "forward_shares": timer.forward_shares,
            "provenance": sorted({cost.provenance(o) for o in ops}),
            "collectives": sum(o.kind == "collective" for o in ops), "recompute": sum(o.recompute for o in ops)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_calibrated_gemm_predicts_cpu_training_step(name: str, tmp_path: Path) -> None:
    """Projected forward + backward compute time of a real CPU training step within 15 %.

    Same set of work on both sides, op list unchanged: the projection sums the job's op list (GEMMs F/I/W,
    attention F/I, the memory-bound norms, rotary, SwiGLU activation, residuals, embedding lookup and gradient,
    final norm, loss), the measurement times the model's forward and `loss.backward()`; neither has an optimizer
    step. The model is written with the kernels the op list names where PyTorch has them (fused RMSNorm forward,
    rotary as one complex multiply, SDPA, cross-entropy). What eager PyTorch runs besides is the same work done in
    more passes, not missing work: the unfused RMSNorm backward, SiLU and the gate product as separate kernels,
    layout copies (attention output, the assembled QKV and gate/up gradients). The job's named memory-bound kernels
    (RMSNorm, the gated SiLU, cross-entropy, forward and backward) are calibrated at its shapes (`calibrate memory
    --config`): on a CPU an exp per element costs several times the bytes it moves, so pricing them as the add
    kernel would miss 5 to 10 % of the step (2026-12-02, an Intel Xeon VM: -12 .. -22 % with the add alone, -5 ..
    -16 % with the kernels, the spread being this VM's, whose step samples vary by 20 % within a run); what is left
    below the measurement is left visible, not fitted away. The forward's share of the step is held to 10 % too.
    One item is
    missing from the op list for real: PyTorch (and Megatron) materialise the embedding gradient as a dense
    vocabulary x hidden table (zero-filled), where `embedding.wgrad` writes the token rows only; with a
    4096-token vocabulary that is well under 1 % of this step. GEMMs and attention run at exactly calibrated
    shapes, so their prices are measured times, not interpolations."""
    from tests.oracle.test_performance_cpu import Busy, quiet, unresolved

    def run() -> dict:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(project_and_measure, name, str(tmp_path)).result()

    try:  # calibration and step are timed on the same machine: not while other processes take its cores
        out, _ = quiet(run, f"{name} calibration and step", need=1)
    except Busy as busy:
        pytest.skip(str(busy))
    by_kind: dict[str, float] = out["by_kind"]
    samples: list[float] = out["samples"]
    assert out["collectives"] == 0 and out["recompute"] == 0 and out["gemm_rows"] > 0
    assert all(p.startswith(f"calibrated: {name}.json ") for p in out["provenance"]), out["provenance"]
    projected, measured = sum(by_kind.values()), statistics.median(samples)
    error = projected / measured - 1.0
    parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in by_kind.items())
    print(f"\n{name}: projected {projected * 1e3:.1f} ms ({parts}) vs measured {measured * 1e3:.1f} ms "
          f"(median of {len(samples)}: {', '.join(f'{t * 1e3:.0f}' for t in samples)}): {error:+.1%}")
    # the forward's share of the step (what the pipeline schedules and the bubble are built from: F against I + W),
    # projected from the F-phase ops against the real step's forward / (forward + backward), sample by sample. A
    # share is not immune to load: on a busy 2-core CI host (2026-12-02) the shares of one run spread from 0.27 to
    # 0.43, so it is judged only where its own spread resolves the tolerance, like the step time
    share, shares = out["forward_share"], out["forward_shares"]
    print(f"{name}: forward share projected {share:.3f}, measured {statistics.median(shares):.3f} "
          f"(median of {len(shares)}: {', '.join(f'{s:.3f}' for s in shares)})")
    unjudged = []
    for what, value, values, tolerance in (("forward share", share, shares, SHARE_TOLERANCE),
                                           ("step time", projected, samples, STEP_TOLERANCE)):
        if why := unresolved(f"{name} {what}", values, tolerance):
            unjudged.append(why)
        else:
            assert abs(value / statistics.median(values) - 1) <= tolerance, (name, what, value, values)
    if unjudged:  # what could be judged passed; say what could not
        pytest.skip("; ".join(unjudged))


# ------------------------------------------------------------------------------------------------ gloo all-reduce

# Bandwidth-bound sizes of 2 - 32 MiB (2 - 25 ms per all-reduce here). Below about 5 ms a gloo all-reduce on this
# shared 2-core machine jumps between modes (256 KiB: 0.5 - 3.7 ms in one run of 8 rounds; a 3 MiB held-out size
# predicted -28 .. +33 % per round and once +43 % as the median of 8), so the check was timing scheduler noise; at
# these sizes the per-round errors were -8 .. +10 % (2026-11-29).
CALIBRATED_SIZES = (2 * 2**20, 4 * 2**20, 8 * 2**20, 16 * 2**20, 32 * 2**20)
HELD_OUT = 12 * 2**20  # between two calibrated sizes
COLL_ROUNDS = 8  # calibration runs; each times the calibrated sizes and the held-out one
COLL_WARMUP, COLL_REPEAT = 5, 30


def _median_rows(cal: Calibration) -> Calibration:
    """One row per (kind, ranks, nodes, size): the median time over the rounds (robust to a round run under a burst
    of load, which a mean is not)."""
    groups: dict[tuple[Any, ...], list[CollectiveRow]] = {}
    for r in cal.collective:
        groups.setdefault((r.kind, r.n_ranks, r.n_nodes, r.size_bytes), []).append(r)
    rows = tuple(CollectiveRow.model_validate({**same[0].model_dump(exclude={"algbw_bytes_per_s", "busbw_bytes_per_s"}),
                                               "time_s": statistics.median(r.time_s for r in same),
                                               "count": sum(r.count for r in same),
                                               "source": f"median of {len(same)} rounds: {same[0].source}"})
                 for same in groups.values())
    return cal.model_copy(update={"collective": rows})


def test_gloo_allreduce_calibration_predicts_other_size(tmp_path: Path) -> None:
    """`calibrate collective` (gloo, 2 processes) over 2 .. 32 MiB and 12 MiB, interleaved in the same runs; the
    12 MiB rows are taken out, the calibrated cost model is built from the rest (the curve projection/calibrate/fit.py
    fits), and its all-reduce time at 12 MiB must be within 25 % of the measured 12 MiB time. Measuring the held-out
    size inside the same benchmark processes, interleaved with the calibrated sizes, keeps process start-up, placement
    and load bursts of this shared 2-core machine out of the comparison (a separately started measurement was off by
    -34 % .. +4 % from run to run); each side is the median over rounds."""
    sizes = ",".join(str(s) for s in sorted((*CALIBRATED_SIZES, HELD_OUT)))
    files: list[Path] = []
    for i in range(COLL_ROUNDS):
        files.append(tmp_path / f"collective{i}.json")
        assert cli.main(["calibrate", "collective", "--kinds", "all_reduce", "--sizes", sizes, "--device", "cpu",
                         "--world-size", "2", "--warmup", str(COLL_WARMUP), "--repeat", str(COLL_REPEAT),
                         "--quiet", "--out", str(files[-1])]) == 0
    everything = _median_rows(merge_calibrations(load_calibration(f) for f in files))
    (held,) = [r for r in everything.collective if r.size_bytes == HELD_OUT]
    rounds = [r.time_s for f in files for r in load_calibration(f).collective if r.size_bytes == HELD_OUT]
    windows = len(rounds)
    cal = everything.model_copy(update={"collective": tuple(r for r in everything.collective
                                                            if r.size_bytes != HELD_OUT)})
    assert [r.size_bytes for r in cal.collective] == list(CALIBRATED_SIZES) and HELD_OUT not in CALIBRATED_SIZES
    assert {(r.kind, r.n_ranks, r.n_nodes, r.count) for r in cal.collective} == {
        ("all_reduce", 2, 1, COLL_ROUNDS * COLL_REPEAT)}

    # A CPU has no DeviceSpec: a neutral base fabric (2 ranks on one node); the fitted curve replaces its numbers.
    base = Fabric(gpus_per_node=2, intra=TierParams(0.0, 1.0), inter=TierParams(0.0, 1.0))
    cost = CalibratedCostModel(cal, fabric=base, name="gloo.json")
    pair = GroupPlacement(n_ranks=2, ranks_per_node=2, n_nodes=1)
    assert cost.fabric is not None and cost.fabric.curve_for("all_reduce", pair) is not None
    projected = cost.collective_seconds("all_reduce", HELD_OUT, pair)
    measured = held.time_s
    error = projected / measured - 1.0
    calibrated = ", ".join(f"{r.size_bytes // 1024} KiB {r.time_s * 1e3:.2f}" for r in cal.collective)
    print(f"\ngloo all_reduce, 2 ranks, medians of {COLL_ROUNDS} calibrations (ms): {calibrated}\n"
          f"{HELD_OUT // 1024} KiB: projected {projected * 1e3:.3f} ms vs measured {measured * 1e3:.3f} ms "
          f"(median of {windows} rounds: {', '.join(f'{t * 1e3:.2f}' for t in rounds)}): {error:+.1%}")
    assert math.isfinite(projected) and abs(error) <= COLLECTIVE_TOLERANCE, (projected, measured)
