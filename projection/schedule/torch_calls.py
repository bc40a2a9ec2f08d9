"""torch.distributed.pipelining's `Schedule1F1B` point-to-point calls (one stage per rank; sim/p2p_walk.py walks them).

Re-derived from `Schedule1F1B._step_microbatches` (torch/distributed/pipelining/schedules.py, unchanged from torch 2.4
to 2.13: the single-stage schedules kept this runtime when 2.10 moved the multi-stage ones to
`_PipelineScheduleRuntime`). Rank r (stage r of S), W = min(m, S - r) warm-up forwards:

  warm-up i:  receive F(i)'s input (blocking); F(i); wait the previous forward's send; post F(i)'s send (handles
              kept), except the last warm-up forward's, which is fused with the first backward's receive below;
  1B1F:       [forward send + B(j)'s gradient receive] (blocking); B(j); then, while forwards remain,
              [B(j)'s send + F(i)'s input receive] (blocking); F(i)
  cool-down:  post the last 1B1F backward's send; for each remaining B(j): receive (blocking), B(j), wait the
              previous send, post B(j)'s send; finally wait the last send.

Every wait is `_wait_batch_p2p` on one `batch_isend_irecv`, so a send is done only once the receiver has posted the
matching receive.
"""

from __future__ import annotations

from projection.schedule.action import Schedule
from projection.schedule.p2p_calls import POST, CallBuilder, P2pCalls, recv_op, send_op


def torch_1f1b_calls(schedule: Schedule) -> P2pCalls:
    """The calls torch's Schedule1F1B makes around `schedule` (1F1B, stage r on rank r); ValueError for any other
    schedule."""
    pp = schedule.n_ranks
    if schedule.n_stages != pp or schedule.stage_to_rank != tuple(range(pp)) or schedule.routes:
        raise ValueError(f"schedule {schedule.name!r} does not run one stage per rank")
    b = CallBuilder(pp)
    for r, acts in enumerate(schedule.actions):
        fs = [a for a in acts if a.kind == "F"]
        bs = [a for a in acts if a.kind == "B"]
        m = len(fs)
        w = min(m, pp - r)
        order = fs[:w] + [x for j in range(m) for x in ((bs[j], fs[w + j]) if w + j < m else (bs[j],))]
        if len(bs) != m or list(acts) != order:
            raise ValueError(f"rank {r}'s actions are not in Schedule1F1B's order")
        pos = {a: k for k, a in enumerate(acts)}
        pending = None  # a posted send not yet waited
        fwd_send = None
        for i in range(w):
            b.call(r, recv_op(fs[i], pp, pp))
            b.run(r, pos[fs[i]])
            b.wait(r, pending)
            pending = None
            if i != w - 1:
                pending = b.call(r, send_op(fs[i], pp, pp), mode=POST)
            else:
                fwd_send = send_op(fs[i], pp, pp)
        f_next, j = w, 0
        while True:
            b.call(r, fwd_send, recv_op(bs[j], pp, pp))
            b.run(r, pos[bs[j]])
            bwd_send = send_op(bs[j], pp, pp)
            j += 1
            if f_next == m:
                break
            b.call(r, bwd_send, recv_op(fs[f_next], pp, pp))
            b.run(r, pos[fs[f_next]])
            fwd_send = send_op(fs[f_next], pp, pp)
            f_next += 1
        pending = b.call(r, bwd_send, mode=POST)
        while j < m:
            b.call(r, recv_op(bs[j], pp, pp))
            b.run(r, pos[bs[j]])
            b.wait(r, pending)
            pending = b.call(r, send_op(bs[j], pp, pp), mode=POST)
            j += 1
        b.wait(r, pending)
    return b.finish(schedule)
