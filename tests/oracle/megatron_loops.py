"""Megatron-LM's pipeline loops as 4 gloo processes run them for tests/oracle/test_pipeline_megatron_p2p_gloo.py,
transliterated from megatron-core 0.16.1 megatron/core/pipeline_parallel/schedules.py and p2p_communication.py,
independent of projection's own calls (projection/schedule/megatron_calls.py): `forward_backward_pipelining_
without_interleaving`, `forward_backward_pipelining_with_interleaving` without and with overlap_p2p_comm, and the
P2PCommunicator calls they make. Passes hold the host for their "device time"; every message carries the pass that
made it, and every request is waited exactly once.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

PP, N_MB = 4, 8
BLOCK_F_S, BLOCKS = 0.015, 8  # forward seconds of one block; backward 2x; block 0 counts twice
NUMEL = 1024  # float32 elements per message: 4 KiB (large messages make gloo's timing erratic)


def _forward_s(vpp: int) -> list[float]:
    """Forward seconds per virtual stage: pp * vpp stages, each BLOCKS // (pp * vpp) consecutive blocks."""
    blocks = [2 * BLOCK_F_S] + [BLOCK_F_S] * (BLOCKS - 1)
    per = BLOCKS // (PP * vpp)
    return [sum(blocks[s * per:(s + 1) * per]) for s in range(PP * vpp)]


class _Req:
    """A posted dist.isend / dist.irecv (one of Megatron's wait handles), waited exactly once: a second wait on a gloo
    work can hang."""

    def __init__(self, work: Any) -> None:
        self.work, self.done = work, False

    def wait(self) -> None:
        assert not self.done, "request waited twice"
        self.work.wait()
        self.done = True


class _Rank:
    """One rank's P2PCommunicator and its passes, which hold the host for their device time and record (config,
    step, kind, stage, mb, t0, t1). With batch_p2p_comm every call is one batch_isend_irecv, each request waited
    once; without it every call runs _p2p_ops (separate requests, `reqs` keeps them all so that the step can check
    each was waited), and a received tensor carries its request so that a pass can check it was waited."""

    def __init__(self, rank: int, vpp: int, records: list[tuple[Any, ...]], label: tuple[str, int],
                 batch_p2p_comm: bool = True) -> None:
        self.rank, self.vpp, self.records, self.label = rank, vpp, records, label
        self.batch_p2p_comm = batch_p2p_comm
        self.reqs: list[_Req] = []
        self.n_stages = PP * vpp
        self.first, self.last = rank == 0, rank == PP - 1
        self.next, self.prev = (rank + 1) % PP, (rank - 1) % PP  # Megatron's ring: rank 0's prev is rank pp - 1
        self.forward_s = _forward_s(vpp)

    def communicate(self, *, send_next: Any = None, send_prev: Any = None, recv_prev: bool = False,
                    recv_next: bool = False) -> tuple[Any, Any]:
        """P2PCommunicator._communicate (wait_on_reqs True) with _batched_p2p_ops, or _p2p_ops when not batch_p2p_comm:
        (tensor from prev, tensor from next)."""
        if not self.batch_p2p_comm:
            got_prev, got_next, reqs = self.communicate_async(send_next=send_next, send_prev=send_prev,
                                                              recv_prev=recv_prev, recv_next=recv_next)
            for req in reqs.values():
                req.wait()
            return got_prev, got_next
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

    def communicate_async(self, *, send_next: Any = None, send_prev: Any = None, recv_prev: bool = False,
                          recv_next: bool = False) -> tuple[Any, Any, dict[str, _Req]]:
        """_communicate with wait_on_reqs False (overlap_p2p_comm=True; batch_p2p_comm False): _p2p_ops posts each op
        as its own dist.isend / dist.irecv, even ranks in the order send_next, recv_prev, send_prev, recv_next and odd
        ranks recv_prev, send_next, recv_next, send_prev (one group: pp > 2); returns (tensor from prev, tensor from
        next, the handles by name), unwaited."""
        assert not self.batch_p2p_comm  # Megatron asserts wait_on_reqs with batch_p2p_comm
        got_prev = torch.empty(NUMEL) if recv_prev else None
        got_next = torch.empty(NUMEL) if recv_next else None
        posts = {"send_next": (send_next, dist.isend, self.next), "recv_prev": (got_prev, dist.irecv, self.prev),
                 "send_prev": (send_prev, dist.isend, self.prev), "recv_next": (got_next, dist.irecv, self.next)}
        order = ("send_next", "recv_prev", "send_prev", "recv_next") if self.rank % 2 == 0 else \
            ("recv_prev", "send_next", "recv_next", "send_prev")
        reqs = {}
        for name in order:
            tensor, op, peer = posts[name]
            if tensor is not None:
                reqs[name] = req = _Req(op(tensor, peer))
                self.reqs.append(req)
                if op is dist.irecv:
                    tensor.p2p_req = req
        return got_prev, got_next, reqs

    @staticmethod
    def _waited(tensor: Any) -> bool:
        """Whether `tensor`, when received by a separate request, was waited before a pass reads it."""
        req = getattr(tensor, "p2p_req", None)
        return req is None or req.done

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
            assert self._waited(inp), (self.rank, stage, mb)
            assert inp[:3].tolist() == [0.0, stage - 1, mb], (self.rank, stage, mb, inp[:3].tolist())
        return self._hold("F", stage, mb, self.forward_s[stage])

    def backward(self, inp: Any, out: Any, grad: Any) -> Any:
        """The backward of the forward that produced `out`: its gradient comes from the next stage (the loss on the
        last)."""
        _, stage, mb = (int(x) for x in out[:3].tolist())
        if stage < self.n_stages - 1:
            assert self._waited(grad), (self.rank, stage, mb)
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


class _Interleaved:
    """The bookkeeping of forward_backward_pipelining_with_interleaving (microbatch_group_size_per_vp_stage pp, the
    default; forward_only False): get_schedule_table, get_pp_rank_microbatches, get_model_chunk_id,
    num_released_microbatches, recv_tensor_from_previous_stage, forward_step_helper, backward_step_helper and the
    input, output and gradient lists, shared by both loops."""

    def __init__(self, p: _Rank) -> None:
        self.p = p
        self.chunks, group = p.vpp, PP
        self.total = N_MB * self.chunks
        schedule_table = []  # get_schedule_table
        for start in range(0, N_MB, group):
            members = range(start, min(start + group, N_MB))
            schedule_table += [(mb, chunk) for chunk in range(self.chunks) for mb in members]
        self.microbatch_id_table, self.model_chunk_id_table = zip(*schedule_table, strict=True)
        self.warmup = min((PP - p.rank - 1) * 2 + (self.chunks - 1) * group, self.total)  # get_pp_rank_microbatches
        self.all_warmup = self.warmup == self.total
        self.remaining = self.total - self.warmup
        self.input_tensors: list[list[Any]] = [[] for _ in range(self.chunks)]
        self.output_tensors: list[list[Any]] = [[] for _ in range(self.chunks)]
        self.output_tensor_grads: list[list[Any]] = [[] for _ in range(self.chunks)]

    def get_model_chunk_id(self, k: int, forward: bool) -> int:
        chunk = self.model_chunk_id_table[k % self.total]
        return chunk if forward else self.chunks - chunk - 1

    def num_released_microbatches(self, k: int, chunk: int) -> int:
        return 0 if k < self.warmup else self.model_chunk_id_table[:k - self.warmup].count(self.chunks - chunk - 1)

    def recv_tensor_from_previous_stage(self, k: int, forward: bool) -> tuple[bool, int]:
        recv = True
        leading = self.p.first if forward else self.p.last  # the first rank in forward, the last in backward
        last_chunk = self.chunks - 1 if forward else 0
        if leading:  # ahead of the ending rank by pp - 1: receive what it produced pp - 1 iterations ago
            if k < PP - 1:
                recv = False
                next_chunk = self.get_model_chunk_id(k + 1, forward)
            else:
                next_chunk = self.get_model_chunk_id(k - (PP - 1), forward)
            if next_chunk == last_chunk:
                recv = False
            next_chunk += 1 if forward else -1
        else:
            next_chunk = self.get_model_chunk_id(k + 1, forward)
        return recv, next_chunk

    def forward_step_helper(self, k: int) -> Any:
        chunk, mb = self.get_model_chunk_id(k, True), self.microbatch_id_table[k]
        inputs = self.input_tensors[chunk]
        if chunk == 0 and self.p.first and len(inputs) == len(self.output_tensors[chunk]):
            inputs.append(None)
        input_tensor = inputs[mb - self.num_released_microbatches(k, chunk)]
        output_tensor = self.p.forward(chunk * PP + self.p.rank, mb, input_tensor)
        self.output_tensors[chunk].append(output_tensor)
        return output_tensor

    def backward_step_helper(self, k: int) -> Any:
        chunk = self.get_model_chunk_id(k, False)
        if chunk == self.chunks - 1 and self.p.last and not self.output_tensor_grads[chunk]:
            self.output_tensor_grads[chunk].append(None)
        input_tensor = self.input_tensors[chunk].pop(0)
        output_tensor = self.output_tensors[chunk].pop(0)
        return self.p.backward(input_tensor, output_tensor, self.output_tensor_grads[chunk].pop(0))


def _with_interleaving(p: _Rank) -> None:
    """forward_backward_pipelining_with_interleaving: overlap_p2p_comm and overlap_p2p_comm_warmup_flush False."""
    s = _Interleaved(p)
    chunks, total, warmup, remaining = s.chunks, s.total, s.warmup, s.remaining
    s.input_tensors[0].append(p.recv_forward())
    for k in range(warmup):
        chunk = s.get_model_chunk_id(k, True)
        recv_prev, next_chunk = s.recv_tensor_from_previous_stage(k, True)
        if k == total - 1:
            recv_prev = False
        output_tensor = s.forward_step_helper(k)
        if chunk == chunks - 1 and p.last:
            output_tensor = None
        if k == warmup - 1 and not s.all_warmup:  # send_forward_backward_recv_forward_backward
            input_tensor, output_tensor_grad = p.communicate(send_next=output_tensor, recv_prev=recv_prev,
                                                             recv_next=not p.last)
            s.output_tensor_grads[chunks - 1].append(output_tensor_grad)
        else:  # send_forward_recv_forward
            input_tensor, _ = p.communicate(send_next=output_tensor, recv_prev=recv_prev)
        if recv_prev:
            s.input_tensors[next_chunk].append(input_tensor)
    for k in range(remaining):
        forward_k, backward_k = k + warmup, k
        output_tensor = s.forward_step_helper(forward_k)
        input_tensor_grad = s.backward_step_helper(backward_k)
        if s.get_model_chunk_id(forward_k, True) == chunks - 1 and p.last:
            output_tensor = None
        if s.get_model_chunk_id(backward_k, False) == 0 and p.first:
            input_tensor_grad = None
        recv_prev, next_forward_chunk = s.recv_tensor_from_previous_stage(forward_k, True)
        recv_next, next_backward_chunk = s.recv_tensor_from_previous_stage(backward_k, False)
        if k == remaining - 1:
            recv_prev = False
        input_tensor, output_tensor_grad = p.communicate(  # send_forward_backward_recv_forward_backward
            send_next=output_tensor, send_prev=input_tensor_grad, recv_prev=recv_prev, recv_next=recv_next)
        if recv_prev:
            s.input_tensors[next_forward_chunk].append(input_tensor)
        if recv_next:
            s.output_tensor_grads[next_backward_chunk].append(output_tensor_grad)
    if s.all_warmup:
        s.output_tensor_grads[chunks - 1].append(p.recv_backward())
    for k in range(remaining, total):
        chunk = s.get_model_chunk_id(k, False)
        recv_next, next_chunk = s.recv_tensor_from_previous_stage(k, False)
        if k == total - 1:
            recv_next = False
        input_tensor_grad = s.backward_step_helper(k)
        if chunk == 0 and p.first:
            input_tensor_grad = None
        # send_backward_recv_backward
        _, output_tensor_grad = p.communicate(send_prev=input_tensor_grad, recv_next=recv_next)
        if recv_next:
            s.output_tensor_grads[next_chunk].append(output_tensor_grad)


def _with_interleaving_overlap(p: _Rank) -> None:
    """forward_backward_pipelining_with_interleaving with overlap_p2p_comm True and overlap_p2p_comm_warmup_flush
    False (schedules.py ~1380-1890); p is not batched (batch_p2p_comm False), so every call runs _p2p_ops. The
    calls with overlap_p2p_comm=True (p.communicate_async) return their handles unwaited; the others block."""
    s = _Interleaved(p)
    chunks, total, warmup, remaining = s.chunks, s.total, s.warmup, s.remaining
    recv_prev_wait_handles: list[_Req] = []
    recv_next_wait_handles: list[_Req] = []
    send_next_wait_handle: _Req | None = None
    send_prev_wait_handle: _Req | None = None
    bwd_wait_handles: dict[str, _Req] | None = None
    s.input_tensors[0].append(p.recv_forward())
    for k in range(warmup):
        chunk = s.get_model_chunk_id(k, True)
        recv_prev, next_chunk = s.recv_tensor_from_previous_stage(k, True)
        if k == total - 1:
            recv_prev = False
        output_tensor = s.forward_step_helper(k)
        if chunk == chunks - 1 and p.last:
            output_tensor = None
        # send_forward_recv_forward, blocking (overlap_p2p_comm turns the warm-up's 4-way call into this one)
        input_tensor, _ = p.communicate(send_next=output_tensor, recv_prev=recv_prev)
        if recv_prev:
            s.input_tensors[next_chunk].append(input_tensor)
        if k == warmup - 1 and not s.all_warmup:  # the first gradient: send_backward_recv_backward(None), async
            recv_next = not p.last
            _, grad_buffer, bwd_wait_handles = p.communicate_async(recv_next=recv_next)
            if send_prev_wait_handle is not None:
                send_prev_wait_handle.wait()
            send_prev_wait_handle = bwd_wait_handles.pop("send_prev", None)
            if "recv_next" in bwd_wait_handles:
                recv_next_wait_handles.append(bwd_wait_handles.pop("recv_next"))
            if recv_next:
                s.output_tensor_grads[chunks - 1].append(grad_buffer)
    for k in range(remaining):
        forward_k, backward_k = k + warmup, k
        # pp_pre_forward: wait the oldest posted forward receive
        if not (s.get_model_chunk_id(forward_k, True) == 0 and p.first) and recv_prev_wait_handles:
            recv_prev_wait_handles.pop(0).wait()
        output_tensor = s.forward_step_helper(forward_k)
        # pp_post_forward: send_forward_recv_forward async, then wait the previous forward send
        if s.get_model_chunk_id(forward_k, True) == chunks - 1 and p.last:
            output_tensor = None
        recv_prev, next_forward_chunk = s.recv_tensor_from_previous_stage(forward_k, True)
        if k == remaining - 1:
            recv_prev = False
        input_buffer, _, fwd_wait_handles = p.communicate_async(send_next=output_tensor, recv_prev=recv_prev)
        if send_next_wait_handle is not None:
            send_next_wait_handle.wait()
        send_next_wait_handle = fwd_wait_handles.pop("send_next", None)
        if "recv_prev" in fwd_wait_handles:
            recv_prev_wait_handles.append(fwd_wait_handles.pop("recv_prev"))
        if recv_prev:
            s.input_tensors[next_forward_chunk].append(input_buffer)
        # pp_pre_backward: wait the oldest posted backward receive
        if not (s.get_model_chunk_id(backward_k, False) == chunks - 1 and p.last) and recv_next_wait_handles:
            recv_next_wait_handles.pop(0).wait()
        input_tensor_grad = s.backward_step_helper(backward_k)
        # pp_post_backward: send_backward_recv_backward async, then wait the previous backward send
        if s.get_model_chunk_id(backward_k, False) == 0 and p.first:
            input_tensor_grad = None
        recv_next, next_backward_chunk = s.recv_tensor_from_previous_stage(backward_k, False)
        _, grad_buffer, bwd_wait_handles = p.communicate_async(send_prev=input_tensor_grad, recv_next=recv_next)
        if send_prev_wait_handle is not None:
            send_prev_wait_handle.wait()
        send_prev_wait_handle = bwd_wait_handles.pop("send_prev", None)
        if "recv_next" in bwd_wait_handles:
            recv_next_wait_handles.append(bwd_wait_handles.pop("recv_next"))
        if recv_next:
            s.output_tensor_grads[next_backward_chunk].append(grad_buffer)
    if bwd_wait_handles is not None:  # empty: both handles were popped
        for handle in bwd_wait_handles.values():
            handle.wait()
    if s.all_warmup:
        s.output_tensor_grads[chunks - 1].append(p.recv_backward())
    for k in range(remaining, total):
        chunk = s.get_model_chunk_id(k, False)
        if not (chunk == chunks - 1 and p.last) and k != 0 and recv_next_wait_handles:
            recv_next_wait_handles.pop(0).wait()  # the steady state's last posted gradient receive
        recv_next, next_chunk = s.recv_tensor_from_previous_stage(k, False)
        if k == total - 1:
            recv_next = False
        input_tensor_grad = s.backward_step_helper(k)
        if chunk == 0 and p.first:
            input_tensor_grad = None
        # send_backward_recv_backward, blocking
        _, output_tensor_grad = p.communicate(send_prev=input_tensor_grad, recv_next=recv_next)
        if recv_next:
            s.output_tensor_grads[next_chunk].append(output_tensor_grad)
    if send_prev_wait_handle is not None:
        send_prev_wait_handle.wait()
    assert not recv_prev_wait_handles and not recv_next_wait_handles, p.rank  # as Megatron asserts
    # Megatron never waits the steady state's last forward send (send_next_wait_handle): a gloo work must be waited,
    # so wait it here, after the rank's last pass, where the measured step (first pass start to last pass end) has
    # ended on this rank and before the next step's barrier.
    if send_next_wait_handle is not None:
        send_next_wait_handle.wait()
