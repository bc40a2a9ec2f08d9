"""Megatron-LM's blocking pipeline p2p on CPU with gloo across 4 processes, against the simulator's Megatron walk
(sim/p2p_walk.py) and its dependency walk (sim/dag.py).

Megatron's schedules (megatron/core/pipeline_parallel/schedules.py, megatron-core 0.16.1) run their point-to-point
calls batched and blocking when `overlap_p2p_comm` is off: each call (`send_forward_recv_backward`,
`send_forward_backward_recv_forward_backward`, ...) posts one `batch_isend_irecv` of its sends and receives and waits
all of them, so a send is done only when the peer has posted the matching receive, and in the interleaved schedule
each steady F+B pair ends in one exchange with both neighbours. A slow neighbour then holds a rank even when the
rank's own next input is already there, which the dependency walk (a send never holds its sender) does not model.
megatron-core cannot run its p2p on the CPU (it allocates its receive buffers on CUDA), so each process here runs
the loops of `forward_backward_pipelining_with_interleaving` (overlap_p2p_comm False, batch_p2p_comm True, the
default microbatch group size pp) and `forward_backward_pipelining_without_interleaving`, transliterated from
Megatron's source and independent of projection's code: the same warm-up, steady and cool-down loops, the same ops
per call in `_batched_p2p_ops` order, Megatron's next and previous ranks wrapping around the ring
(`recv_tensor_from_previous_stage`: rank 0 receives its later chunks' inputs from rank pp-1, aligned pp-1 forwards
later, and the last rank likewise the gradients from rank 0), and its input, output and gradient lists. Every
message (4 KiB) carries the stage and microbatch of the pass that produced it, and each pass checks that what it
consumes is its own input.

The model is 8 blocks whose forward holds the host 15 ms and backward 30 ms ("device time", as _DeviceTime in
tests/oracle/test_real_pipeline_gloo.py), the first block twice as long (an embedding-heavy first stage), so that
neighbours' passes differ in length: interleaved 1F1B (pp 4, vpp 2, 8 microbatches) places block s on virtual stage
s, 1F1B (pp 4, 8 microbatches) blocks 2r and 2r + 1 on stage r. Per measured step the recorded order must be
projection's Megatron-order schedule, and the walks, fed that step's mean F and B seconds per stage and its measured
p2p time (the gap between a microbatch-0 forward ending on rank r and the next stage's starting on rank r + 1 for
r < pp - 1, where rank r + 1 has waited in its first receive since the step began, so the gap is one transfer),
predict the step (first start to last end). Each schedule's mean over the measured steps must agree with the
Megatron walk within 10 %; for interleaved 1F1B the dependency walk must fall short by more than 5 % and miss by 4
points more than the Megatron walk (the two walks differ by about 6 % on nominal costs here), so the test tells the
p2p semantics apart. Measured and simulated numbers are printed (pytest -s).
"""

from __future__ import annotations

import faulthandler
import json
import os
import statistics
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from projection.schedule.action import Schedule  # noqa: E402
from projection.schedule.basic import one_f_one_b  # noqa: E402
from projection.schedule.interleaved import interleaved_1f1b  # noqa: E402
from projection.sim.costs import StageCosts  # noqa: E402
from projection.sim.dag import walk  # noqa: E402
from projection.sim.p2p_walk import megatron_walk  # noqa: E402
from tests.oracle.spawn import free_port, require_gloo, run_spawned  # noqa: E402

require_gloo()
PP, N_MB, STEPS, WARMUP = 4, 8, 4, 1
BLOCK_F_S, BLOCKS = 0.015, 8  # forward seconds of one block; backward 2x; block 0 counts twice
NUMEL = 1024  # float32 elements per message: 4 KiB (large messages make gloo's timing erratic)
CONFIGS = {"interleaved": 2, "1f1b": 1}  # name -> vpp
LIMIT_S = 120.0

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # times this machine: run alone (README)


def _forward_s(vpp: int) -> list[float]:
    """Forward seconds per virtual stage: pp * vpp stages, each BLOCKS // (pp * vpp) consecutive blocks."""
    blocks = [2 * BLOCK_F_S] + [BLOCK_F_S] * (BLOCKS - 1)
    per = BLOCKS // (PP * vpp)
    return [sum(blocks[s * per:(s + 1) * per]) for s in range(PP * vpp)]


def _schedule(vpp: int) -> Schedule:
    return interleaved_1f1b(PP, N_MB, vpp) if vpp > 1 else one_f_one_b(PP, N_MB)


class _Rank:
    """One rank's P2PCommunicator (batch_p2p_comm: every call one batch_isend_irecv, each request waited once) and
    its passes, which hold the host for their device time and record (config, step, kind, stage, mb, t0, t1)."""

    def __init__(self, rank: int, vpp: int, records: list[tuple[Any, ...]], label: tuple[str, int]) -> None:
        self.rank, self.vpp, self.records, self.label = rank, vpp, records, label
        self.n_stages = PP * vpp
        self.first, self.last = rank == 0, rank == PP - 1
        self.next, self.prev = (rank + 1) % PP, (rank - 1) % PP  # Megatron's ring: rank 0's prev is rank pp - 1
        self.forward_s = _forward_s(vpp)

    def communicate(self, *, send_next: Any = None, send_prev: Any = None, recv_prev: bool = False,
                    recv_next: bool = False) -> tuple[Any, Any]:
        """P2PCommunicator._communicate with _batched_p2p_ops: (tensor from prev, tensor from next)."""
        got_prev = torch.empty(NUMEL) if recv_prev else None
        got_next = torch.empty(NUMEL) if recv_next else None
        ops = []
        if send_prev is not None:
            ops.append(dist.P2POp(dist.isend, send_prev, self.prev))
        if got_prev is not None:
            ops.append(dist.P2POp(dist.irecv, got_prev, self.prev))
        if send_next is not None:
            ops.append(dist.P2POp(dist.isend, send_next, self.next))
        if got_next is not None:
            ops.append(dist.P2POp(dist.irecv, got_next, self.next))
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()  # once: a second wait on a gloo work can hang
        return got_prev, got_next

    def recv_forward(self) -> Any:
        return None if self.first else self.communicate(recv_prev=True)[0]

    def recv_backward(self) -> Any:
        return None if self.last else self.communicate(recv_next=True)[1]

    def _hold(self, kind: str, stage: int, mb: int, seconds: float) -> Any:
        t0 = time.perf_counter()
        time.sleep(seconds)
        self.records.append((*self.label, kind, stage, mb, t0, time.perf_counter()))
        out = torch.zeros(NUMEL)
        out[:3] = torch.tensor([0.0 if kind == "F" else 1.0, stage, mb])
        return out

    def forward(self, stage: int, mb: int, inp: Any) -> Any:
        if stage > 0:  # the first stage reads the data loader
            assert inp[:3].tolist() == [0.0, stage - 1, mb], (self.rank, stage, mb, inp[:3].tolist())
        return self._hold("F", stage, mb, self.forward_s[stage])

    def backward(self, inp: Any, out: Any, grad: Any) -> Any:
        """The backward of the forward that produced `out`: its gradient comes from the next stage (the loss on the
        last)."""
        _, stage, mb = (int(x) for x in out[:3].tolist())
        if stage < self.n_stages - 1:
            assert grad[:3].tolist() == [1.0, stage + 1, mb], (self.rank, stage, mb, grad[:3].tolist())
        if stage > 0:
            assert inp[:3].tolist() == [0.0, stage - 1, mb], (self.rank, stage, mb)
        return self._hold("B", stage, mb, 2 * self.forward_s[stage])


def _without_interleaving(p: _Rank) -> None:
    """forward_backward_pipelining_without_interleaving (forward_only False)."""
    warmup = min(PP - p.rank - 1, N_MB)
    remaining = N_MB - warmup
    input_tensors: list[Any] = []
    output_tensors: list[Any] = []
    for i in range(warmup):
        input_tensor = p.recv_forward()
        output_tensor = p.forward(p.rank, i, input_tensor)
        if not p.last:  # send_forward
            p.communicate(send_next=output_tensor)
        input_tensors.append(input_tensor)
        output_tensors.append(output_tensor)
    if remaining > 0:
        input_tensor = p.recv_forward()
    for i in range(remaining):
        last_iteration = i == remaining - 1
        output_tensor = p.forward(p.rank, i + warmup, input_tensor)
        # send_forward_recv_backward (no call on the last stage)
        output_tensor_grad = None if p.last else p.communicate(send_next=output_tensor, recv_next=True)[1]
        input_tensors.append(input_tensor)
        output_tensors.append(output_tensor)
        input_tensor = input_tensors.pop(0)
        output_tensor = output_tensors.pop(0)
        input_tensor_grad = p.backward(input_tensor, output_tensor, output_tensor_grad)
        if last_iteration:
            input_tensor = None
            if not p.first:  # send_backward
                p.communicate(send_prev=input_tensor_grad)
        else:  # send_backward_recv_forward (no call on the first stage)
            input_tensor = None if p.first else p.communicate(send_prev=input_tensor_grad, recv_prev=True)[0]
    for _ in range(warmup):
        input_tensor = input_tensors.pop(0)
        output_tensor = output_tensors.pop(0)
        output_tensor_grad = p.recv_backward()
        input_tensor_grad = p.backward(input_tensor, output_tensor, output_tensor_grad)
        if not p.first:  # send_backward
            p.communicate(send_prev=input_tensor_grad)


def _with_interleaving(p: _Rank) -> None:
    """forward_backward_pipelining_with_interleaving: overlap_p2p_comm and overlap_p2p_comm_warmup_flush False,
    microbatch_group_size_per_vp_stage pp (the default), forward_only False."""
    chunks, group = p.vpp, PP
    total = N_MB * chunks
    schedule_table = []  # get_schedule_table
    for start in range(0, N_MB, group):
        members = range(start, min(start + group, N_MB))
        schedule_table += [(mb, chunk) for chunk in range(chunks) for mb in members]
    microbatch_id_table, model_chunk_id_table = zip(*schedule_table, strict=True)
    warmup = min((PP - p.rank - 1) * 2 + (chunks - 1) * group, total)  # get_pp_rank_microbatches
    all_warmup = warmup == total
    remaining = total - warmup

    def get_model_chunk_id(k: int, forward: bool) -> int:
        chunk = model_chunk_id_table[k % total]
        return chunk if forward else chunks - chunk - 1

    def num_released_microbatches(k: int, chunk: int) -> int:
        return 0 if k < warmup else model_chunk_id_table[:k - warmup].count(chunks - chunk - 1)

    def recv_tensor_from_previous_stage(k: int, forward: bool) -> tuple[bool, int]:
        recv = True
        leading = p.first if forward else p.last  # the first rank in forward, the last in backward
        last_chunk = chunks - 1 if forward else 0
        if leading:  # ahead of the ending rank by pp - 1: receive what it produced pp - 1 iterations ago
            if k < PP - 1:
                recv = False
                next_chunk = get_model_chunk_id(k + 1, forward)
            else:
                next_chunk = get_model_chunk_id(k - (PP - 1), forward)
            if next_chunk == last_chunk:
                recv = False
            next_chunk += 1 if forward else -1
        else:
            next_chunk = get_model_chunk_id(k + 1, forward)
        return recv, next_chunk

    input_tensors: list[list[Any]] = [[] for _ in range(chunks)]
    output_tensors: list[list[Any]] = [[] for _ in range(chunks)]
    output_tensor_grads: list[list[Any]] = [[] for _ in range(chunks)]

    def forward_step_helper(k: int) -> Any:
        chunk, mb = get_model_chunk_id(k, True), microbatch_id_table[k]
        if chunk == 0 and p.first and len(input_tensors[chunk]) == len(output_tensors[chunk]):
            input_tensors[chunk].append(None)
        input_tensor = input_tensors[chunk][mb - num_released_microbatches(k, chunk)]
        output_tensor = p.forward(chunk * PP + p.rank, mb, input_tensor)
        output_tensors[chunk].append(output_tensor)
        return output_tensor

    def backward_step_helper(k: int) -> Any:
        chunk = get_model_chunk_id(k, False)
        if chunk == chunks - 1 and p.last and not output_tensor_grads[chunk]:
            output_tensor_grads[chunk].append(None)
        input_tensor = input_tensors[chunk].pop(0)
        output_tensor = output_tensors[chunk].pop(0)
        return p.backward(input_tensor, output_tensor, output_tensor_grads[chunk].pop(0))

    input_tensors[0].append(p.recv_forward())
    for k in range(warmup):
        chunk = get_model_chunk_id(k, True)
        recv_prev, next_chunk = recv_tensor_from_previous_stage(k, True)
        if k == total - 1:
            recv_prev = False
        output_tensor = forward_step_helper(k)
        if chunk == chunks - 1 and p.last:
            output_tensor = None
        if k == warmup - 1 and not all_warmup:  # send_forward_backward_recv_forward_backward
            input_tensor, output_tensor_grad = p.communicate(send_next=output_tensor, recv_prev=recv_prev,
                                                             recv_next=not p.last)
            output_tensor_grads[chunks - 1].append(output_tensor_grad)
        else:  # send_forward_recv_forward
            input_tensor, _ = p.communicate(send_next=output_tensor, recv_prev=recv_prev)
        if recv_prev:
            input_tensors[next_chunk].append(input_tensor)
    for k in range(remaining):
        forward_k, backward_k = k + warmup, k
        output_tensor = forward_step_helper(forward_k)
        input_tensor_grad = backward_step_helper(backward_k)
        if get_model_chunk_id(forward_k, True) == chunks - 1 and p.last:
            output_tensor = None
        if get_model_chunk_id(backward_k, False) == 0 and p.first:
            input_tensor_grad = None
        recv_prev, next_forward_chunk = recv_tensor_from_previous_stage(forward_k, True)
        recv_next, next_backward_chunk = recv_tensor_from_previous_stage(backward_k, False)
        if k == remaining - 1:
            recv_prev = False
        input_tensor, output_tensor_grad = p.communicate(  # send_forward_backward_recv_forward_backward
            send_next=output_tensor, send_prev=input_tensor_grad, recv_prev=recv_prev, recv_next=recv_next)
        if recv_prev:
            input_tensors[next_forward_chunk].append(input_tensor)
        if recv_next:
            output_tensor_grads[next_backward_chunk].append(output_tensor_grad)
    if all_warmup:
        output_tensor_grads[chunks - 1].append(p.recv_backward())
    for k in range(remaining, total):
        chunk = get_model_chunk_id(k, False)
        recv_next, next_chunk = recv_tensor_from_previous_stage(k, False)
        if k == total - 1:
            recv_next = False
        input_tensor_grad = backward_step_helper(k)
        if chunk == 0 and p.first:
            input_tensor_grad = None
        # send_backward_recv_backward
        _, output_tensor_grad = p.communicate(send_prev=input_tensor_grad, recv_next=recv_next)
        if recv_next:
            output_tensor_grads[next_chunk].append(output_tensor_grad)


def _worker(rank: int, port: int, out: str) -> None:
    """One pipeline rank: run each configuration for STEPS steps; dump the recorded passes."""
    faulthandler.dump_traceback_later(LIMIT_S - 15, exit=True)  # a hang prints where each rank waits
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=PP, timeout=timedelta(seconds=60))
    records: list[tuple[Any, ...]] = []
    for name, vpp in CONFIGS.items():
        for k in range(STEPS):
            dist.barrier()
            p = _Rank(rank, vpp, records, (name, k))
            (_with_interleaving if vpp > 1 else _without_interleaving)(p)
    dist.barrier()
    Path(f"{out}.{rank}").write_text(json.dumps(records))
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Any, ...]]:
    out = str(tmp_path_factory.mktemp("megatron_p2p") / "rec")
    t0 = time.monotonic()
    run_spawned(_worker, (free_port(), out), PP, LIMIT_S, "gloo Megatron-style pipeline")
    print(f"\n{PP} processes, torch {torch.__version__}, wall {time.monotonic() - t0:.1f} s")
    recs: list[tuple[Any, ...]] = []
    for r in range(PP):
        recs += [(*x, r) for x in json.loads(Path(f"{out}.{r}").read_text())]
    return recs


def _steps(recs: list[tuple[Any, ...]], name: str) -> list[tuple[float, float, float, float]]:
    """(measured, Megatron walk, dependency walk, p2p) seconds of each measured step of configuration `name`."""
    sched = _schedule(CONFIGS[name])
    n = sched.n_stages
    rows = []
    for k in range(WARMUP, STEPS):
        rs = [x for x in recs if x[0] == name and x[1] == k]
        for r in range(PP):  # the schedule simulated is the one that ran
            order = [f"{x[3]}{x[2]}{x[4]}" for x in sorted((x for x in rs if x[7] == r), key=lambda x: x[5])]
            assert order == [str(a) for a in sched.actions[r]], (name, k, r)
        first = {(x[2], x[3]): x for x in rs if x[4] == 0}
        lat = max(0.0, statistics.median(first["F", s + 1][5] - first["F", s][6] for s in range(PP - 1)))
        dur: dict[tuple[str, int], list[float]] = {}
        for x in rs:
            dur.setdefault((x[2], x[3]), []).append(x[6] - x[5])
        f = [statistics.fmean(dur["F", s]) for s in range(n)]
        b = [statistics.fmean(dur["B", s]) for s in range(n)]
        costs = StageCosts.from_lists(f, b, [0.0] * n, lat)
        rows.append((max(x[6] for x in rs) - min(x[5] for x in rs), megatron_walk(sched, costs).step_time_s,
                     walk(sched, costs).step_time_s, lat))
    return rows


def _mean(recs: list[tuple[Any, ...]], name: str) -> list[float]:
    rows = _steps(recs, name)
    meas, mega, dep, _ = (statistics.fmean(col) for col in zip(*rows, strict=True))
    for row in rows:
        print(f"  {name} step: measured {row[0] * 1e3:.1f} ms, Megatron walk {row[1] * 1e3:.1f} ms, "
              f"dependency walk {row[2] * 1e3:.1f} ms, p2p {row[3] * 1e3:.2f} ms")
    print(f"  {name}: measured {meas * 1e3:.1f} ms, Megatron walk {mega * 1e3:.1f} ms ({mega / meas - 1:+.1%}), "
          f"dependency walk {dep * 1e3:.1f} ms ({dep / meas - 1:+.1%})")
    return [meas, mega, dep]


def test_interleaved_without_overlap_is_predicted_by_the_megatron_walk(records: list[tuple[Any, ...]]) -> None:
    meas, mega, dep = _mean(records, "interleaved")
    assert mega == pytest.approx(meas, rel=0.10)
    # the blocking exchanges hold the ranks: the dependency walk, which lets a send go without its receiver, is short
    assert dep / meas - 1 < -0.05
    assert abs(dep / meas - 1) > abs(mega / meas - 1) + 0.04


def test_1f1b_is_predicted_by_the_megatron_walk(records: list[tuple[Any, ...]]) -> None:
    meas, mega, _ = _mean(records, "1f1b")
    assert mega == pytest.approx(meas, rel=0.10)
