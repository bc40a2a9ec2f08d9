"""torch.distributed.pipelining's two runtimes of Interleaved 1F1B on CPU with gloo across 4 processes, against the
simulator's two walks (sim/lockstep.py for torch up to 2.9, sim/dag.py for 2.10+).

Each process holds 3 stages of a 12-stage model (pp 4, vpp 3, 6 microbatches of 8 x 64 per step); every stage is
Linear(64, 64) and "device time" (tests/oracle/test_real_pipeline_gloo.py: the pass holds the host 10 ms forward,
20 ms backward, like a kernel on an accelerator), and stage 0 has three of them, as an embedding-heavy first stage,
so that neighbours' passes differ in length. The same ScheduleInterleaved1F1B runs two ways:
* lock-step: `PipelineScheduleMulti._step_microbatches`, which ScheduleInterleaved1F1B ran up to torch 2.9 and
  which torch still ships as the base class's runtime: every time step of `pipeline_order` ends in one blocking
  batch of sends and receives;
* actions: the class's own runtime in this torch (`_PipelineScheduleRuntime`, 2.10+), explicit send and receive
  actions, each receive waited for just before the pass that needs it.
Per measured step the recorded order must be projection's torch-style order; the simulator, fed that step's mean
F and B seconds per stage and its measured p2p time (as the gloo pipeline test measures it), predicts the step
(first start to last end). Each runtime's mean over the measured steps must agree with its own walk within 10 %,
and the other walk must miss the lock-step runtime by more than that (the configuration is chosen so that the two
models differ: about 19 % on nominal costs), so the test tells the runtimes apart.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import types
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from projection.schedule.interleaved import interleaved_1f1b, torch_time_steps  # noqa: E402
from projection.sim.costs import StageCosts  # noqa: E402
from projection.sim.dag import walk  # noqa: E402
from projection.sim.lockstep import lockstep_walk  # noqa: E402
from tests.oracle.spawn import free_port, require_gloo, run_spawned  # noqa: E402
from tests.oracle.test_real_pipeline_gloo import _DeviceTime, _instrument, mean_pass_seconds  # noqa: E402

require_gloo()
PP, VPP, N_MB, ROWS, WIDTH, STEPS, WARMUP = 4, 3, 6, 8, 64, 4, 1
RUNTIMES = ("lockstep", "actions")

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # times this machine: run alone (README)


def _worker(rank: int, port: int, out: str) -> None:
    """One pipeline rank: run Interleaved 1F1B under each runtime for STEPS steps; dump the recorded passes."""
    from torch import nn
    from torch.distributed import pipelining
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=PP)
    records: list[tuple[Any, ...]] = []
    step = [0]
    n_stages = PP * VPP
    for runtime in RUNTIMES:
        torch.manual_seed(0)
        stages = []
        for sid in range(rank, n_stages, PP):
            layers = [m for _ in range(3 if sid == 0 else 1) for m in (nn.Linear(WIDTH, WIDTH), _DeviceTime())]
            stage = pipelining.PipelineStage(nn.Sequential(*layers), sid, n_stages, torch.device("cpu"))
            _instrument(stage, sid, records, runtime, step)
            stages.append(stage)
        sched = pipelining.ScheduleInterleaved1F1B(stages, N_MB, loss_fn=lambda y, t: ((y - t) ** 2).mean())
        if runtime == "lockstep":  # the runtime ScheduleInterleaved1F1B had up to torch 2.9
            sched._step_microbatches = types.MethodType(PipelineScheduleMulti._step_microbatches, sched)
        x, y = torch.randn(N_MB * ROWS, WIDTH), torch.randn(N_MB * ROWS, WIDTH)
        for k in range(STEPS):
            step[0] = k
            dist.barrier()
            kwargs: dict[str, Any] = {"target": y, "losses": []} if rank == (n_stages - 1) % PP else {}
            sched.step(x, **kwargs) if rank == 0 else sched.step(**kwargs)
    dist.barrier()
    Path(f"{out}.{rank}").write_text(json.dumps(records))
    dist.destroy_process_group()


def _records(tmp: Path) -> list[tuple[Any, ...]]:
    out = str(tmp / "rec")
    run_spawned(_worker, (free_port(), out), PP, 120.0, "gloo interleaved pipeline")
    recs: list[tuple[Any, ...]] = []
    for r in range(PP):
        recs += [(*x, r) for x in json.loads(Path(f"{out}.{r}").read_text())]
    return recs


def _steps(recs: list[tuple[Any, ...]], runtime: str) -> list[tuple[float, float, float]]:
    """(measured, lock-step walk, dependency walk) seconds of each measured step of `runtime`."""
    sched = interleaved_1f1b(PP, N_MB, VPP, style="torch")
    steps = torch_time_steps(PP, N_MB, VPP)
    n = sched.n_stages
    rows = []
    for k in range(WARMUP, STEPS):
        rs = [x for x in recs if x[0] == runtime and x[1] == k]
        for r in range(PP):  # torch ran projection's order
            order = [f"{x[3]}{x[2]}{x[4]}" for x in sorted((x for x in rs if x[7] == r), key=lambda x: x[5])]
            assert order == [str(a) for a in sched.actions[r]], (runtime, r)
        first = {(x[2], x[3]): x for x in rs if x[4] == 0}
        gaps = [first["F", s + 1][5] - first["F", s][6] for s in range(n - 1)]
        gaps += [first["B", s][5] - first["B", s + 1][6] for s in range(n - 1)]
        lat = max(0.0, statistics.median(gaps))
        mean = mean_pass_seconds(rs)
        f = [mean["F", s] for s in range(n)]
        b = [mean["B", s] for s in range(n)]
        costs = StageCosts.from_lists(f, b, [0.0] * n, lat)
        rows.append((max(x[6] for x in rs) - min(x[5] for x in rs), lockstep_walk(sched, costs, steps).step_time_s,
                     walk(sched, costs).step_time_s))
    return rows


def test_each_torch_runtime_is_predicted_by_its_walk(tmp_path: Path) -> None:
    t0 = time.monotonic()
    recs = _records(tmp_path)
    print(f"\n{PP} processes, torch {torch.__version__}, wall {time.monotonic() - t0:.1f} s")
    mean = {}
    for runtime in RUNTIMES:
        rows = _steps(recs, runtime)
        mean[runtime] = [statistics.fmean(col) for col in zip(*rows, strict=True)]
        meas, lock, dep = mean[runtime]
        print(f"  {runtime}: measured {meas * 1e3:.1f} ms, lock-step walk {lock * 1e3:.1f} ms "
              f"({lock / meas - 1:+.1%}), dependency walk {dep * 1e3:.1f} ms ({dep / meas - 1:+.1%})")
    meas, lock, dep = mean["lockstep"]
    assert lock == pytest.approx(meas, rel=0.10)
    assert abs(dep / meas - 1) > 0.10  # the runtimes differ here: the dependency walk does not describe lock-step
    meas, _, dep = mean["actions"]
    assert dep == pytest.approx(meas, rel=0.10)
