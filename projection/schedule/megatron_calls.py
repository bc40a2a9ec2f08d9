"""Megatron-LM's point-to-point calls around a pipeline schedule's passes (sim/p2p_walk.py walks them).

Re-derived from megatron/core/pipeline_parallel/schedules.py (megatron-core 0.16.1; the same loops since the 2021
code): `forward_backward_pipelining_without_interleaving` and `forward_backward_pipelining_with_interleaving` with
`overlap_p2p_comm` False, below; and the interleaved schedule with it True (`_interleaved_overlap`: megatron-core 0.16
without warm-up flush, blocking warm-up and cool-down, each steady pass waiting its own receive and the previous
send). Each p2p call (`send_forward_recv_backward`, `send_forward_backward_recv_forward_backward`,
...) posts its sends and receives as one `batch_isend_irecv` and waits for all of them (p2p_communication.py
`_communicate`, wait_on_reqs=True), so the rank goes on only when every peer of the call has posted its side.

1F1B (vpp 1), rank r with W = min(pp - r - 1, m) warm-up forwards:
  W x [recv_forward, F, send_forward]; recv_forward (when any forward remains);
  steady i: F, send_forward_recv_backward, B, send_backward_recv_forward (send_backward on the last);
  cool-down: W x [recv_backward, B, send_backward].
Interleaved (vpp >= 2), rank r's k-th forward / backward as in schedule/interleaved.py, W warm-up forwards:
  recv_forward; warm-up k: F, send_forward_recv_forward (the last warm-up call also receives the first gradient);
  steady k: F, B, then one 4-way send_forward_backward_recv_forward_backward;
  cool-down k: B, send_backward_recv_backward (a recv_backward first when every forward is warm-up).
A call receives the input of the rank's next pass of that direction; the leading rank (rank 0 forward, the last rank
backward) instead receives what the ending rank sent pp - 1 passes earlier (schedules.py
`recv_tensor_from_previous_stage`): the ring wraps, so rank 0 receives chunk c's output from rank pp - 1.
Sends and receives pair up in order per (sender, receiver), as NCCL matches them; each pairing is checked.
"""

from __future__ import annotations

from collections.abc import Sequence

from projection.schedule.action import Action, Schedule
from projection.schedule.p2p_calls import POST, CallBuilder, Op, P2pCalls, recv_op, send_op


def _split(acts: Sequence[Action], r: int, w: int) -> tuple[list[Action], list[Action], int]:
    """A rank's forwards and backwards in order, and its warm-up count w (the builder's: W = m - 1 and W = m give
    the same order but different calls); ValueError unless the order is Megatron's (w warm-up forwards, then
    forward-backward pairs, then backwards)."""
    fs = [a for a in acts if a.kind == "F"]
    bs = [a for a in acts if a.kind == "B"]
    expect = fs[:w] + [x for pair in zip(fs[w:], bs, strict=False) for x in pair] + bs[len(fs) - w:]
    if len(fs) + len(bs) != len(acts) or len(fs) != len(bs) or list(acts) != expect:
        raise ValueError(f"rank {r}'s actions are not in Megatron's warm-up / 1F1B / cool-down order")
    return fs, bs, w


def megatron_calls(schedule: Schedule, overlap: bool = False) -> P2pCalls:
    """The calls Megatron-LM makes around `schedule` (1F1B, or interleaved 1F1B in Megatron's order, stage s on rank
    s % pp; `overlap`: --overlap-p2p-communication, which only the interleaved schedule takes); ValueError for any
    other schedule."""
    pp = schedule.n_ranks
    n_st = schedule.n_stages
    if n_st % pp or any(s2r != s % pp for s, s2r in enumerate(schedule.stage_to_rank)) or schedule.routes:
        raise ValueError(f"schedule {schedule.name!r} is not looped over {pp} ranks")
    if pp == 2 and n_st > pp and not overlap:
        raise ValueError("Megatron's interleaved schedule at pp 2 needs overlapped p2p (Megatron-LM refuses it "
                         "without: each blocking batch to the one neighbour would pair its sends and receives "
                         "crosswise)")
    if len(schedule.warmup) != pp:
        raise ValueError(f"schedule {schedule.name!r} does not say its warm-up forwards (Megatron's 1F1B and "
                         "interleaved builders do)")
    split = [_split(acts, r, schedule.warmup[r]) for r, acts in enumerate(schedule.actions)]
    b = CallBuilder(pp)
    if n_st == pp:
        for r, (fs, bs, w) in enumerate(split):
            _one_f_one_b(b, r, fs, bs, w, n_st)
    else:
        for r in range(pp):
            (_interleaved_overlap if overlap else _interleaved)(b, _Ring(r, split, n_st))
    return b.finish(schedule)


def _one_f_one_b(b: CallBuilder, r: int, fs: list[Action], bs: list[Action], w: int, n_st: int) -> None:
    pp, m = b.pp, len(fs)
    for i in range(w):
        b.call(r, recv_op(fs[i], pp, n_st))
        b.run(r, i)
        b.call(r, send_op(fs[i], pp, n_st))
    if w < m:
        b.call(r, recv_op(fs[w], pp, n_st))
    pos = w
    for i in range(m - w):
        b.run(r, pos)
        b.call(r, send_op(fs[w + i], pp, n_st), recv_op(bs[i], pp, n_st))
        b.run(r, pos + 1)
        pos += 2
        b.call(r, send_op(bs[i], pp, n_st), recv_op(fs[w + i + 1], pp, n_st) if i < m - w - 1 else None)
    for i in range(m - w, m):
        b.call(r, recv_op(bs[i], pp, n_st))
        b.run(r, pos)
        pos += 1
        b.call(r, send_op(bs[i], pp, n_st))


class _Ring:
    """The receives Megatron's interleaved schedule posts after a rank's k-th forward or backward
    (`recv_tensor_from_previous_stage`)."""

    def __init__(self, r: int, split: list[tuple[list[Action], list[Action], int]], n_st: int) -> None:
        self.r, self.split, self.n_st, self.pp = r, split, n_st, len(split)
        self.fs, self.bs, self.w = split[r]

    def after_f(self, k: int) -> Op | None:
        """After forward k: the next forward's input, or on rank 0 the output of the last rank's forward k - (pp - 1)
        unless that is the model's last stage; nothing after the last forward."""
        pp, total = self.pp, len(self.fs)
        if k + 1 >= total:
            return None
        if self.r > 0:
            return recv_op(self.fs[k + 1], pp, self.n_st)
        j = k - (pp - 1)
        src = self.split[pp - 1][0][j] if j >= 0 else None
        return (pp - 1, False, ("F", src.stage, src.microbatch)) if src and src.stage < self.n_st - 1 else None

    def after_b(self, k: int) -> Op | None:
        """After backward k: the next backward's gradient, or on the last rank the gradient rank 0's backward
        k - (pp - 1) sends unless it is stage 0's; nothing after the last backward."""
        pp, total = self.pp, len(self.bs)
        if k + 1 >= total:
            return None
        if self.r < pp - 1:
            return recv_op(self.bs[k + 1], pp, self.n_st)
        j = k - (pp - 1)
        src = self.split[0][1][j] if j >= 0 else None
        return (0, False, ("B", src.stage, src.microbatch)) if src and src.stage > 0 else None


def _interleaved(b: CallBuilder, ring: _Ring) -> None:
    """Without overlap: every call blocking, one 4-way exchange after each steady F+B pair."""
    r, fs, bs, w, pp, n_st = ring.r, ring.fs, ring.bs, ring.w, ring.pp, ring.n_st
    total = len(fs)
    rem = total - w
    b.call(r, recv_op(fs[0], pp, n_st))
    for k in range(w):
        b.run(r, k)
        first_grad = recv_op(bs[0], pp, n_st) if k == w - 1 and rem else None
        b.call(r, send_op(fs[k], pp, n_st), ring.after_f(k), first_grad)
    pos = w
    for k in range(rem):
        b.run(r, pos)
        b.run(r, pos + 1)
        pos += 2
        fk = w + k
        b.call(r, send_op(fs[fk], pp, n_st), send_op(bs[k], pp, n_st),
               ring.after_f(fk) if k < rem - 1 else None, ring.after_b(k))
    if not rem:
        b.call(r, recv_op(bs[0], pp, n_st))
    for k in range(rem, total):
        b.run(r, pos)
        pos += 1
        b.call(r, send_op(bs[k], pp, n_st), ring.after_b(k))


def _interleaved_overlap(b: CallBuilder, ring: _Ring) -> None:
    """With `--overlap-p2p-communication` (megatron-core 0.16, without overlap_p2p_comm_warmup_flush; batch_p2p_comm
    is then off, so each send and receive has its own handle): the warm-up's calls block, and its last one also posts
    the first gradient's receive; in the steady state each pass waits only the oldest receive posted for it, then
    posts its send and the next receive and waits the previous pass's send of that direction; the cool-down blocks
    again, and the last backward send is waited at the end."""
    r, fs, bs, w, pp, n_st = ring.r, ring.fs, ring.bs, ring.w, ring.pp, ring.n_st
    total = len(fs)
    rem = total - w
    recv_prev: list[int] = []
    recv_next: list[int] = []
    b.call(r, recv_op(fs[0], pp, n_st))
    for k in range(w):
        b.run(r, k)
        b.call(r, send_op(fs[k], pp, n_st), ring.after_f(k))
        got = b.call(r, recv_op(bs[0], pp, n_st), mode=POST) if k == w - 1 and rem else None
        if got is not None:
            recv_next.append(got)
    send_next = send_prev = None
    pos = w
    for k in range(rem):
        fk = w + k
        if recv_op(fs[fk], pp, n_st) is not None and recv_prev:  # pp_pre_forward
            b.wait(r, recv_prev.pop(0))
        b.run(r, pos)
        sent = b.call(r, send_op(fs[fk], pp, n_st), mode=POST)  # pp_post_forward
        got = b.call(r, ring.after_f(fk) if k < rem - 1 else None, mode=POST)
        b.wait(r, send_next)
        send_next = sent
        if got is not None:
            recv_prev.append(got)
        if recv_op(bs[k], pp, n_st) is not None and recv_next:  # pp_pre_backward
            b.wait(r, recv_next.pop(0))
        b.run(r, pos + 1)
        pos += 2
        sent = b.call(r, send_op(bs[k], pp, n_st), mode=POST)  # pp_post_backward
        got = b.call(r, ring.after_b(k), mode=POST)
        b.wait(r, send_prev)
        send_prev = sent
        if got is not None:
            recv_next.append(got)
    if not rem:
        b.call(r, recv_op(bs[0], pp, n_st))
    for k in range(rem, total):
        if recv_op(bs[k], pp, n_st) is not None and k and recv_next:
            b.wait(r, recv_next.pop(0))
        b.run(r, pos)
        pos += 1
        b.call(r, send_op(bs[k], pp, n_st), ring.after_b(k))
    b.wait(r, send_prev)
    b.wait(r, send_next)  # Megatron never waits it (its stream orders it); waited here, as every posted call is:
    # the step ends with the last pass, whatever this wait holds
