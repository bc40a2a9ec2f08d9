"""A real pipeline: torch.distributed.pipelining on CPU with gloo across 2 and 4 processes, against the simulator.

Each process holds its stages of an 8 x (Linear 512x512 + GELU + device time) model (microbatches of 8 x 512, 8 per
step; "device time" holds each layer's forward 10 ms and backward 20 ms, like a kernel on an accelerator while the
host waits, so the passes are long against the framework's host work whatever the number of CPU cores) and runs
GPipe and 1F1B (and, with 2 processes, ZB-V with split backward), wrapping the stage's forward_one_chunk,
backward_one_chunk (I when full_backward=False) and backward_weight_one_chunk (W) to record per-action start/end on
the machine-wide monotonic clock. Per measured step: the recorded order must equal projection's builder, and the
simulator, fed that step's mean F/B/I/W seconds per stage and its measured p2p time (median gap between a
microbatch-0 pass ending on one rank and the dependent pass starting on the next), predicts the step (first start to
last end over all ranks). The mean over measured steps must agree within 10%.

The machine's CPUs may be shared (2 cores here, 4 processes, other jobs): durations vary from step to step, which is
why each step is simulated with its own measurements. Measured and simulated numbers are printed (pytest -s).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from projection.schedule.registry import build_schedule  # noqa: E402
from projection.sim.costs import StageCosts  # noqa: E402
from projection.sim.dag import walk  # noqa: E402
from projection.sim.p2p_walk import torch_1f1b_walk  # noqa: E402
from tests.oracle.spawn import free_port, run_spawned  # noqa: E402

HIDDEN, ROWS, LAYERS, N_MB, STEPS, WARMUP = 512, 8, 8, 8, 4, 1
DEVICE_FWD_S, DEVICE_BWD_S = 0.010, 0.020  # per layer: the accelerator's share of each pass (see _DeviceTime)
TORCH_CLASS = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "zbv": "ScheduleZBVZeroBubble"}

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # times this machine: run alone (README)


def _stage_ids(name: str, rank: int, world: int) -> list[int]:
    return [rank, 2 * world - 1 - rank] if name == "zbv" else [rank]


def _worker(rank: int, world: int, names: list[str], port: int, out: str) -> None:
    """One pipeline rank: run each schedule for STEPS steps, dump (schedule, step, kind, stage, mb, t0, t1)."""
    from torch import nn
    from torch.distributed import pipelining

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    records: list[tuple[Any, ...]] = []
    step = [0]
    for name in names:
        n_stages = 2 * world if name == "zbv" else world
        torch.manual_seed(0)
        stages = []
        for sid in _stage_ids(name, rank, world):
            layers = [m for _ in range(LAYERS // n_stages)
                      for m in (nn.Linear(HIDDEN, HIDDEN), nn.GELU(), _DeviceTime())]
            stage = pipelining.PipelineStage(nn.Sequential(*layers), sid, n_stages, torch.device("cpu"))
            _instrument(stage, sid, records, name, step)
            stages.append(stage)
        cls = getattr(pipelining, TORCH_CLASS[name])
        loss = lambda y, t: ((y - t) ** 2).mean()  # noqa: E731
        sched = cls(stages if name == "zbv" else stages[0], N_MB, loss_fn=loss)
        x, y = torch.randn(N_MB * ROWS, HIDDEN), torch.randn(N_MB * ROWS, HIDDEN)
        first, last = 0 in _stage_ids(name, rank, world), n_stages - 1 in _stage_ids(name, rank, world)
        for k in range(STEPS):
            step[0] = k
            dist.barrier()
            kwargs: dict[str, Any] = {"target": y, "losses": []} if last else {}
            sched.step(x, **kwargs) if first else sched.step(**kwargs)
    dist.barrier()
    Path(f"{out}.{rank}").write_text(json.dumps(records))
    dist.destroy_process_group()


class _DeviceTime(torch.nn.Module):
    """Identity whose forward and backward hold the host for a fixed time, like a kernel running on an accelerator
    while the host waits. It keeps each pass long against the framework's per-action host work and makes the
    timing independent of how many CPU cores the test machine has (4 processes share 2 here)."""

    class _Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            time.sleep(DEVICE_FWD_S)
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            time.sleep(DEVICE_BWD_S)
            return grad

    def forward(self, x: Any) -> Any:
        return self._Fn.apply(x)


def _instrument(stage: Any, sid: int, records: list[tuple[Any, ...]], name: str, step: list[int]) -> None:
    fwd, bwd, wgt = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def record(kind: str, mb: int, t0: float) -> None:
        records.append((name, step[0], kind, sid, mb, t0, time.perf_counter()))

    def forward(mb: int, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = fwd(mb, *a, **k)
        record("F", mb, t0)
        return out

    def backward(mb: int, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = bwd(mb, *a, **k)
        record("B" if k.get("full_backward", True) else "I", mb, t0)
        return out

    def weight(mb: int, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = wgt(mb, *a, **k)
        record("W", mb, t0)
        return out

    stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk = forward, backward, weight


def _run(world: int, names: list[str], tmp: Path, limit_s: float = 60.0) -> list[tuple[Any, ...]]:
    out = str(tmp / "rec")
    run_spawned(_worker, (world, names, free_port(), out), world, limit_s, "gloo pipeline")
    recs: list[tuple[Any, ...]] = []
    for r in range(world):
        recs += [(*x, r) for x in json.loads(Path(f"{out}.{r}").read_text())]
    return recs


def mean_pass_seconds(rs: list[tuple[Any, ...]]) -> dict[tuple[str, int], float]:
    """Mean seconds of each (kind, stage) pass over the records (config, step, kind, stage, mb, t0, t1, ...) of one
    measured step."""
    dur: dict[tuple[str, int], list[float]] = {}
    for x in rs:
        dur.setdefault((x[2], x[3]), []).append(x[6] - x[5])
    return {k: statistics.fmean(v) for k, v in dur.items()}


def _compare(recs: list[tuple[Any, ...]], name: str, world: int) -> tuple[float, float, list[float], list[float]]:
    """(mean measured step, mean simulated step, per rank the mean measured and the mean simulated idle time: the
    step less the rank's passes) over the measured steps of schedule `name`, in seconds."""
    sched = build_schedule(name, world, N_MB, 2 if name == "zbv" else 1, style="torch")
    measured, simulated, lats = [], [], []
    idle_m: list[list[float]] = [[] for _ in range(world)]
    idle_s: list[list[float]] = [[] for _ in range(world)]
    for step in range(WARMUP, STEPS):
        rs = [x for x in recs if x[0] == name and x[1] == step]
        for r in range(world):  # torch executed exactly projection's order
            order = [f"{x[3]}{x[2]}{x[4]}" for x in sorted((x for x in rs if x[7] == r), key=lambda x: x[5])]
            assert order == [str(a) for a in sched.actions[r]], (name, r)
        n = sched.n_stages
        first = {(x[2], x[3]): x for x in rs if x[4] == 0}
        grad = "I" if name == "zbv" else "B"
        gaps = [first["F", s + 1][5] - first["F", s][6] for s in range(n - 1)]
        gaps += [first[grad, s][5] - first[grad, s + 1][6] for s in range(n - 1)]
        lat = max(0.0, statistics.median(gaps))
        lats.append(lat)
        mean = mean_pass_seconds(rs)
        f = [mean[("F", s)] for s in range(n)]
        w = [mean.get(("W", s), 0.0) for s in range(n)]
        b = [mean.get(("B", s), mean.get(("I", s), 0.0) + w[s]) for s in range(n)]
        measured.append(max(x[6] for x in rs) - min(x[5] for x in rs))
        # torch's Schedule1F1B waits its fused send/receive batches (sim/p2p_walk.py); GPipe's and ZB-V's receives
        # are waited just before the pass that needs them, which the dependency walk models
        simulate = torch_1f1b_walk if name == "1f1b" else walk
        sim = simulate(sched, StageCosts.from_lists(f, b, w, lat))
        simulated.append(sim.step_time_s)
        for r in range(world):  # idle: waiting for a neighbour (bubble and exposed p2p), measured and simulated
            idle_m[r].append(measured[-1] - sum(x[6] - x[5] for x in rs if x[7] == r))
            idle_s[r].append(sim.step_time_s - sim.busy_s[r])
    print(f"\n  {name} pp={world} ({n} stages, {N_MB} microbatches): measured steps "
          f"{[round(t * 1e3, 1) for t in measured]} ms, simulated {[round(t * 1e3, 1) for t in simulated]} ms, "
          f"p2p {[round(t * 1e3, 2) for t in lats]} ms")
    return (statistics.fmean(measured), statistics.fmean(simulated), [statistics.fmean(x) for x in idle_m],
            [statistics.fmean(x) for x in idle_s])


@pytest.mark.parametrize("world", [2, 4])
def test_simulator_predicts_a_gloo_pipeline(world: int, tmp_path: Path) -> None:
    names = ["gpipe", "1f1b", "zbv"] if world == 2 else ["gpipe", "1f1b"]
    t0 = time.monotonic()
    recs = _run(world, names, tmp_path)
    print(f"\n{world} processes, torch {torch.__version__}, wall {time.monotonic() - t0:.1f} s")
    for name in names:
        meas, sim, idle_m, idle_s = _compare(recs, name, world)
        print(f"  {name} pp={world}: mean measured {meas * 1e3:.1f} ms, simulated {sim * 1e3:.1f} ms, "
              f"error {sim / meas - 1:+.1%}; idle per rank measured {[round(t * 1e3, 1) for t in idle_m]} ms, "
              f"simulated {[round(t * 1e3, 1) for t in idle_s]} ms")
        assert sim == pytest.approx(meas, rel=0.10)
        # each rank's idle time (its bubble and exposed p2p: what the breakdown's bubble is built from) within the
        # step's own 10 %, taken of the measured step: a difference of two large times carries their errors
        for r, (m, s) in enumerate(zip(idle_m, idle_s, strict=True)):
            assert abs(s - m) <= 0.10 * meas, (name, r, m, s, meas)
